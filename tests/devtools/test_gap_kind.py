"""The gap table's typed ``kind`` column (issue 27): each row's ``HandleGroup.kind`` as a categorical of
``formats.handles.KINDS``, agreeing with what the row independently says about itself (a delegate call's
``runtime_ops``, the enclosing call of an op inside a delegate, no delegate for a kernel), on a portable program
and on one delegated to ONNX Runtime; the consumers read it (a table without it has no delegate rows)."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector.culprits import _explained_delegate_rows
from edgetorch.exir import to_edge, to_edge_transform_and_lower
from edgetorch.formats.handles import DELEGATE_CALL, IN_DELEGATE, KERNEL, KINDS
from edgetorch.models import get_spec
from edgetorch.runtime import Runtime


def _gap_table(tmp: str, delegated: bool) -> pd.DataFrame:
    spec = get_spec("small_cnn")
    torch.manual_seed(0)
    model = spec.build().eval()
    inputs = spec.example_inputs()["forward"]
    ep = torch.export.export(model, inputs)
    if delegated:
        from edgetorch.backends.onnxruntime import OrtPartitioner

        epm = to_edge_transform_and_lower(ep, partitioner=[OrtPartitioner()], generate_etrecord=True)
    else:
        epm = to_edge(ep, generate_etrecord=True)
    et = epm.to_executorch()
    pte, rec = os.path.join(tmp, "m.pte"), os.path.join(tmp, "etrecord.bin")
    et.save(pte)
    record = et.get_etrecord()
    record.update_representative_inputs({"forward": [inputs]})
    record.save(rec)
    prog = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(*inputs)
    dump, dbg = os.path.join(tmp, "etdump.etdp"), os.path.join(tmp, "debug.bin")
    prog.write_etdump_result_to_file(dump, dbg)
    return Inspector(etdump_path=dump, etrecord=rec, debug_buffer_path=dbg).calculate_numeric_gap("MSE")


def _check_kinds(df: pd.DataFrame) -> list[str]:
    assert isinstance(df["kind"].dtype, pd.CategoricalDtype) and list(df["kind"].cat.categories) == list(KINDS)
    for _, r in df.iterrows():
        if r["kind"] == KERNEL:
            assert r["delegate"] is None and pd.isna(r["in_delegate_call"])
            assert list(r["runtime_ops"]) != ["DELEGATE_CALL"]
        elif r["kind"] == DELEGATE_CALL:
            assert list(r["runtime_ops"]) == ["DELEGATE_CALL"] and pd.isna(r["in_delegate_call"])
            assert r["delegate"] == "onnxruntime"
        else:
            assert r["kind"] == IN_DELEGATE and not pd.isna(r["in_delegate_call"]) and r["delegate"] == "onnxruntime"
    return sorted(set(df["kind"].astype(str)))


@pytest.mark.parametrize("delegated", [False, True])
def test_every_gap_row_carries_its_handle_group_kind(tmp_path, delegated):
    df = _gap_table(str(tmp_path), delegated)
    assert len(df) > 0
    kinds = _check_kinds(df)
    assert kinds == ([DELEGATE_CALL, IN_DELEGATE] if delegated else [KERNEL])


def test_consumers_read_the_kind_not_the_display_string():
    """A delegate-call row explained by a wrong inner row is recognised by its kind; the same row labelled only
    with the display string (no ``kind`` column) is not a delegate row."""
    df = pd.DataFrame({"kind": pd.Categorical([DELEGATE_CALL, IN_DELEGATE], categories=KINDS),
                       "runtime_ops": [["DELEGATE_CALL"], ["Gemm"]], "instruction_id": [3, 3],
                       "in_delegate_call": [None, 3], "ref_handle": [7, 7]})
    assert _explained_delegate_rows(df, [True, True]) == {0}
    assert _explained_delegate_rows(df.drop(columns=["kind"]), [True, True]) == set()
