"""A comparator carries its own direction and name: a similarity metric the user writes (larger is better) is read
as such by ``first_divergence`` and the culprits' ``accumulated_rank``, even unregistered (the gap table records
the comparator's direction); ``register_comparator`` makes it a ``distance=`` name and an ``edgetorch inspect
--gap`` choice (one registry)."""

from __future__ import annotations

import pytest
import torch

from edgetorch.cli.main import main
from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector import comparators
from edgetorch.devtools.inspector.comparators import NumericalComparatorBase, get_comparator, register_comparator
from edgetorch.devtools.inspector.culprits import accumulated_ranks
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.models import get_model
from edgetorch.runtime import Runtime


class Pearson(NumericalComparatorBase):
    """Pearson correlation of the two tensors (1.0 = the same up to scale and shift): a similarity."""

    name = "PEARSON"
    larger_is_worse = False

    def element_compare(self, a: torch.Tensor, b: torch.Tensor) -> float:
        a, b = a.double().flatten(), b.double().flatten()
        if torch.equal(a, b):
            return 1.0
        return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmp")
    model, inputs = get_model("mlp")
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    rec.save(tmp / "r.bin")
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(*inputs)
    prog.write_etdump_result_to_file(tmp / "e.etdp", tmp / "e.bin")
    return tmp


def _inspector(tmp) -> Inspector:
    return Inspector(etdump_path=tmp / "e.etdp", etrecord=tmp / "r.bin", debug_buffer_path=tmp / "e.bin")


def test_an_unregistered_similarity_is_read_in_its_direction(recording):
    insp = _inspector(recording)
    df = insp.calculate_numeric_gap(Pearson())
    assert df.attrs["larger_is_worse"] is False and df.attrs["distance"] == "PEARSON"
    assert all(g[0] == pytest.approx(1.0) for g in df["gap"] if df.attrs["exact_metric"] != "x")
    assert insp.first_divergence(df, 0.999) is None  # every row correlates 1.0 with the reference
    worse = df.copy()
    worse.attrs = dict(df.attrs)
    k = worse.index[len(worse) // 2]
    worse.at[k, "gap"] = [0.5]
    assert insp.first_divergence(worse, 0.999).name == k
    ranks = accumulated_ranks(worse)
    assert ranks[k] == 1  # the least similar row is the worst


def test_a_registered_comparator_is_a_distance_and_a_cli_choice(recording, capsys):
    register_comparator(Pearson)
    try:
        assert "PEARSON" in comparators.metric_names() and comparators.LARGER_IS_WORSE["PEARSON"] is False
        assert isinstance(get_comparator("pearson"), Pearson)
        code = main(["inspect", "--etdump", str(recording / "e.etdp"), "--etrecord", str(recording / "r.bin"),
                     "--debug-buffer", str(recording / "e.bin"), "--gap", "PEARSON", "--rows", "2"])
        assert code == 0
        assert "numeric gap (PEARSON)" in capsys.readouterr().out
    finally:
        comparators._METRICS.pop("PEARSON", None)
        comparators.LARGER_IS_WORSE.pop("PEARSON", None)
    with pytest.raises(ValueError, match="unknown distance"):
        get_comparator("pearson")
