"""Issue 26 (speed): the handles a reference record's ATen program will carry, bounded from its documents before
it is deserialized, so that the gap does not deserialize an ATen program it will not use."""

from __future__ import annotations

import pytest

from edgetorch.devtools import Inspector
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.devtools.inspector.numeric_gap import reference_handles
from tests.devtools._reference_data import DATA, debug_buffer

NAMES = [f"{m}_{b}" for m in ("mlp", "cnn", "mobilenet", "cnn_int8") for b in ("portable", "xnnpack")]
NAMES += ["vit_portable", "vit2h_xnnpack", "mm_portable", "mlp_extras"]


@pytest.mark.parametrize("name", NAMES)
def test_bound_holds_every_handle_of_the_built_aten_program(name: str) -> None:
    rec = parse_etrecord(str(DATA / f"{name}_etrecord.bin"))
    bound = rec.aten_handle_bound("forward")
    assert bound is not None
    gm = rec.reference_graph("forward")
    assert gm is not None
    last, _ = reference_handles(gm)
    assert set(last) <= bound
    # the graph is built from the documents, the program itself is not deserialized: the bound still holds
    assert not rec._is_loaded("aten") and rec.aten_handle_bound("forward") == bound


def test_vit2h_gap_skips_the_aten_program_and_uses_the_edge_program() -> None:
    name = "vit2h_xnnpack"
    ins = Inspector(etdump_path=str(DATA / f"{name}.etdp"), etrecord=str(DATA / f"{name}_etrecord.bin"),
                    debug_buffer_path=str(debug_buffer(name)))
    df = ins.calculate_numeric_gap("MSE")
    assert df.attrs["reference_graph"] == "edge_dialect_exported_program"
    assert not ins._etrecord._is_loaded("aten")  # the ATen program was never deserialized
    # asked for explicitly, it is still built (and found lacking): the same table
    again = ins.calculate_numeric_gap("MSE", reference_graph="exported_program")
    assert again.attrs["reference_graph"] == "edge_dialect_exported_program"
    assert [g[0] for g in again["gap"]] == [g[0] for g in df["gap"]]


@pytest.mark.parametrize("name", ["vit2h_xnnpack", "cnn_int8_xnnpack"])
def test_planned_conversion_gives_torchs_objects(name: str) -> None:
    import json

    import torch._export.serde.serialize as serde

    from edgetorch.devtools.etrecord._serde_fast import converting

    rec = parse_etrecord(str(DATA / f"{name}_etrecord.bin"))
    lazy = rec._lazy
    for entry in lazy._docs:
        raw = json.dumps(lazy._docs[entry]).encode()
        plain = serde._bytes_to_dataclass(serde.ExportedProgram, raw)
        with converting():
            planned = serde._bytes_to_dataclass(serde.ExportedProgram, raw)
        assert planned == plain
    assert serde._dict_to_dataclass.__module__ == serde.__name__  # restored
    with pytest.raises(AssertionError), converting():
        serde._bytes_to_dataclass(serde.ExportedProgram, json.dumps({"graph_module": {"graph": {
            "inputs": [{"as_tensor": {"name": "x"}, "as_int": 1}]}}}).encode())
