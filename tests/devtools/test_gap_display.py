"""``print(df)`` of a gap table shows its gaps as numbers a reader can trust: a one-value list as that value in
scientific notation (pandas alone prints ``[1.4e-17]`` as ``[0.0]``), while the cells stay lists for code."""

from __future__ import annotations

import pickle

import torch

from edgetorch.devtools.inspector._frame import GapFrame
from edgetorch.devtools.inspector.comparators import get_comparator
from edgetorch.devtools.inspector.numeric_gap import compute_numeric_gap


def _table() -> GapFrame:
    df = GapFrame({"aot_ops": [["linear"], ["relu"], ["split"]], "gap": [[1.396e-17], [0.0], [2.5e-9, 3e-12]],
                   "local_gap": [[7.4e-18], [None], [0.0, 0.0]], "verdict": ["noise", "exact", "noise"]})
    df.attrs["distance"] = "MSE"
    return df


def test_print_shows_scientific_scalars():
    text = repr(_table())
    assert "1.396e-17" in text and "7.400e-18" in text and "[2.500e-09, 3.000e-12]" in text
    assert "[0.0]" not in text
    lines = text.splitlines()
    assert lines[2].split()[2] == "0"  # an exact zero is 0


def test_the_cells_stay_lists_and_slices_stay_gap_frames():
    df = _table()
    assert df["gap"].str[0].tolist() == [1.396e-17, 0.0, 2.5e-9] and df.at[1, "gap"] == [0.0]
    for part in (df.copy(), df[df["verdict"] == "noise"], pickle.loads(pickle.dumps(df))):
        assert isinstance(part, GapFrame) and "1.396e-17" in repr(part)
    assert df.readable().at[0, "gap"] == "1.396e-17"


def test_compute_numeric_gap_returns_a_gap_frame():
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    df, _ = compute_numeric_gap(gm, (torch.randn(3),), [], get_comparator("MSE"))
    assert isinstance(df, GapFrame) and df.attrs["larger_is_worse"] is True
