"""One culprit API over the float-reference table: ``find_culprits(calculate_numeric_gap(...,
reference_graph="float"))`` ranks an INT8 program's layers by their own quantization error (the planted bad layer
first), sets rows without a float signal apart with the reason, and says from which layer the output is lost."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from edgetorch.devtools.inspector.culprits import DROP_DB, EXCESS_DB, find_culprits
from edgetorch.devtools.inspector.float_reference import rank_quantization_culprits
from edgetorch.export.quantizer import SymmetricInt8Quantizer, SymmetricQuantizationConfig
from edgetorch.workflows.quant_fallback import coarsen_weight, inspect_quantized, quantize_pt2e_program


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Conv2d(3, 8, 3, padding=1)
        self.bad = nn.Conv2d(8, 8, 3, padding=1)
        self.last = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.relu(self.bad(torch.relu(self.first(x)))))


@pytest.fixture(scope="module")
def table():
    """The float-reference table of the INT8 program whose ``bad`` conv lost 4 bits of weight precision (the
    planted layer), and its Inspector."""
    g = torch.Generator().manual_seed(1)
    samples = [(torch.randn(1, 3, 12, 12, generator=g),) for _ in range(3)]
    et = quantize_pt2e_program(ConvNet().eval(), samples, SymmetricInt8Quantizer(SymmetricQuantizationConfig()),
                               edit=lambda gm: coarsen_weight(gm, "conv2d_1", 16.0))
    run = inspect_quantized(et, samples)
    return run.inspector, run.table


def test_find_culprits_takes_the_float_table_and_names_the_planted_layer(table):
    insp, df = table
    culprits = insp.find_culprits(df)
    assert not culprits.empty and culprits.iloc[0]["module"] == "bad"
    finite = [v for v, q in zip(df["local_sqnr_db"], df["quantized"]) if q and math.isfinite(v)]
    assert culprits.iloc[0]["local_sqnr_db"] == min(finite)  # the lowest local SQNR of a quantized row
    first = culprits.iloc[0]
    assert first["local_excess_db"] >= EXCESS_DB and first["sqnr_drop_db"] >= DROP_DB  # abnormal, and it costs
    assert "worse than the table's typical" in first["evidence"] and "local SQNR" in first["evidence"]
    rest = [d for d, e in zip(culprits["sqnr_drop_db"], culprits["local_excess_db"]) if e < EXCESS_DB]
    assert rest == sorted(rest, reverse=True)  # then the steepest accumulated drop first
    assert culprits.attrs["lost_from"] is None  # the accumulated SQNR stays above 0 dB


def test_rows_without_signal_are_ranked_apart_and_explained(table):
    _, df = table
    bad = df.index[[m == "bad" for m in df["module"]]][0]
    edited = df.copy()
    edited.attrs = dict(df.attrs)
    edited["local_sqnr_db"] = edited["local_sqnr_db"].astype(object)
    edited.at[bad, "local_sqnr_db"] = -math.inf  # as a squeeze-excitation conv whose float output is zero
    culprits = find_culprits(edited)
    assert bad not in culprits.index and not culprits.empty
    apart = culprits.attrs["no_signal"]
    assert bad in apart.index and "no float signal" in apart.at[bad, "reason"]
    assert bad not in rank_quantization_culprits(edited).index
    exact = [i for i, v in zip(df.index, df["local_sqnr_db"]) if v == math.inf]
    assert all(i in apart.index and apart.at[i, "reason"].startswith("exact") for i in exact)


def test_the_output_is_lost_from_the_first_row_at_0_db(table):
    _, df = table
    edited = df.copy()
    edited.attrs = dict(df.attrs)
    last = [i for i, m in zip(df.index, df["module"]) if m == "last"][0]
    edited["sqnr_db"] = edited["sqnr_db"].astype(object)
    edited.at[last, "sqnr_db"] = -2.0
    assert find_culprits(edited).attrs["lost_from"].startswith("last (")


def test_inspect_prints_the_lost_layer_and_the_rows_set_apart(table):
    from rich.console import Console

    from edgetorch.cli.inspect import _signal_lines

    _, df = table
    edited = df.copy()
    edited.attrs = dict(df.attrs)
    bad = df.index[[m == "bad" for m in df["module"]]][0]
    last = df.index[[m == "last" for m in df["module"]]][0]
    for col, row, value in (("local_sqnr_db", bad, -math.inf), ("sqnr_db", last, -2.0)):
        edited[col] = edited[col].astype(object)
        edited.at[row, col] = value
    console = Console(record=True, width=200)
    _signal_lines(console, find_culprits(edited))
    text = console.export_text()
    assert "the output is lost from last (" in text
    assert "1 row(s) without a float signal" in text and text.rstrip().endswith("bad")
    console = Console(record=True, width=200)
    _signal_lines(console, find_culprits(df))
    assert console.export_text() == ""  # the clean table: nothing to add
