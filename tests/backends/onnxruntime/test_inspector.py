"""The Inspector on programs delegated to ONNX Runtime: numeric-gap rows inside the delegate (their AOT side
checked against an independent eager capture of the edge ops) and a fault planted in the delegate's weights."""

from __future__ import annotations

import os
import warnings

import torch

from edgetorch.backends.onnxruntime import OrtPartitioner, _blob
from edgetorch.devtools import Inspector
from edgetorch.errors import ObserverEffectWarning
from edgetorch.exir import to_edge, to_edge_transform_and_lower
from edgetorch.exir.backend import lowered_module_of
from edgetorch.models import get_model
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import (
    delegate_calls,
    edge_group_outputs,
    perturb_blob,
    rel_err,
    runtime_options,
)


def _inspect(name: str, tmp: str, perturb: bool = False):
    model, inputs = get_model(name)
    ep = torch.export.export(model, inputs)
    epm = to_edge_transform_and_lower(ep, partitioner=[OrtPartitioner()], generate_etrecord=True)
    lowered = lowered_module_of(delegate_calls(epm.exported_program())[0])
    planted = None
    if perturb:
        lowered.processed_bytes, _, onnx_node = perturb_blob(lowered.processed_bytes, lowered.named_data)
        planted = set(_blob.unpack(lowered.processed_bytes).header["nodes"][onnx_node])
    et = epm.to_executorch()
    pte, rec_path = os.path.join(tmp, "m.pte"), os.path.join(tmp, "etrecord.bin")
    et.save(pte)
    rec = et.get_etrecord()
    rec.update_representative_inputs({"forward": [inputs]})
    rec.save(rec_path)
    with runtime_options(observer_effect="first"):  # checked (a float model is not by default)
        prog = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
        prog.load_method("forward").execute(*inputs)
    dump, dbg = os.path.join(tmp, "etdump.etdp"), os.path.join(tmp, "debug.bin")
    prog.write_etdump_result_to_file(dump, dbg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ObserverEffectWarning)  # FP32 graphs: exposing values changes nothing
        insp = Inspector(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg)
    _inspect.last = insp
    return model, inputs, ep, insp.calculate_numeric_gap("MSE"), planted


def test_numeric_gap_rows_inside_the_delegate_match_eager(tmp_path):
    model, inputs, ep, df, _ = _inspect("vit_tiny", str(tmp_path))
    insp = _inspect.last
    (oe,) = insp.observer_effects
    assert oe.method == "forward" and oe.delegate_backend_name == "onnxruntime" and len(oe.values) == 1
    assert 0.0 <= insp.observer_effect <= 1e-6 and not oe.exceeds_tolerance
    assert df.attrs["observer_effect"] == insp.observer_effect
    inner = df[df["in_delegate_call"].notna() & (df["delegate"] == "onnxruntime")]
    assert len(inner) >= 40
    assert (df["runtime_ops"].map(lambda ops: "DELEGATE_CALL" in ops)).sum() == 1
    ref = edge_group_outputs(to_edge(torch.export.export(model, inputs)).exported_program(), inputs)
    for _, row in inner.iterrows():
        assert row["aot_ops"], row
        (h,) = row["aot_debug_handle"]
        aot = row["aot_intermediate_output"]
        assert any(tuple(t.shape) == tuple(aot.shape) and rel_err(aot, t) <= 1e-5 for t in ref[h]), row["aot_ops"]
        assert row["gap"][0] <= 1e-8, row["aot_ops"]


def test_planted_fault_is_the_first_inside_delegate_row_with_a_gap(tmp_path):
    *_, df, planted = _inspect("small_cnn", str(tmp_path), perturb=True)
    inner = df[df["in_delegate_call"].notna()]
    bad = [row for _, row in inner.iterrows() if row["gap"][0] > 1e-8]
    assert bad
    assert set(bad[0]["aot_debug_handle"]) == planted
