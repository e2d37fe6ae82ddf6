"""The onnxruntime runtime side: in-place IOBinding runs, corrupted blobs, traced runs (per-op profile events,
intermediates, observer effect) and a numeric fault planted inside the delegate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from edgetorch.backends.onnxruntime import _blob
from edgetorch.backends.onnxruntime.runtime import OrtDelegate, OrtRuntime, set_runtime_options
from edgetorch.errors import ProgramFormatError
from edgetorch.exir.backend import lowered_module_of
from edgetorch.exir.program import EdgeProgramManager
from edgetorch.models import get_model
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import (
    delegate_calls,
    delegate_profile_events,
    lower_ort,
    perturb_blob,
    rel_err,
    runtime_options,
    standalone_blob,
    tensors_of,
    traced_delegate_outputs,
)


@pytest.fixture(scope="module")
def cnn():
    model, inputs = get_model("small_cnn")
    return lower_ort(model, inputs)


def _blob_of(low) -> bytes:
    return standalone_blob(lowered_module_of(delegate_calls(low.lowered)[0]))


def _handle(method) -> OrtDelegate:
    (h,) = method._delegate_handles.values()
    return h


def _with_blob(low, blob: bytes):
    """The lowered program re-emitted with its (only) delegate blob replaced."""
    lowered = lowered_module_of(delegate_calls(low.lowered)[0])
    old = lowered.processed_bytes
    lowered.processed_bytes = blob
    try:
        return EdgeProgramManager({"forward": low.lowered}, None).to_executorch()
    finally:
        lowered.processed_bytes = old


# -- plain runs ---------------------------------------------------------------------------------------

def test_plain_run_writes_outputs_in_place_through_iobinding(cnn):
    method = cnn.method()
    h = _handle(method)
    x = cnn.inputs[0]
    want = cnn.model(x)
    out = torch.full_like(want, float("nan"))
    h.run([x], [out])
    assert rel_err(out, want) <= 1e-5
    b = h._binding
    h.run([x], [out])
    assert h._binding is b  # same tensors: the binding is reused
    out2 = torch.empty_like(want)
    h.run([x], [out2])  # other tensors: bound again
    assert h._binding is not b and torch.equal(out2, out)
    slow = torch.empty_like(want)
    h.run_without_binding([x], [slow])
    torch.testing.assert_close(slow, out, rtol=0, atol=0)


def test_non_contiguous_inputs_and_outputs_are_staged(cnn):
    h = _handle(cnn.method())
    x = cnn.inputs[0]
    xt = x.transpose(2, 3).contiguous().transpose(2, 3)  # same values, non-contiguous
    assert not xt.is_contiguous()
    want = torch.empty(cnn.model(x).shape)
    h.run([x], [want])
    big = torch.zeros(want.shape[1], want.shape[0])
    out = big.t()  # non-contiguous destination
    h.run([xt], [out])
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_runtime_module_does_not_import_the_compiler():
    code = ("import sys, edgetorch.backends.onnxruntime.runtime\n"
            "bad = [m for m in sys.modules if m.startswith(('edgetorch.exir', 'torch.onnx', 'onnxscript'))]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(__file__))


def test_thread_count_and_optimization_level_come_from_compile_specs(cnn):
    h = OrtDelegate(_blob_of(cnn), {"intra_op_num_threads": b"1", "graph_optimization_level": b"ORT_DISABLE_ALL"})
    so = h.session.get_session_options()
    assert so.intra_op_num_threads == 1
    assert str(so.graph_optimization_level).endswith("ORT_DISABLE_ALL")
    default = OrtDelegate(_blob_of(cnn), {})
    assert default.session.get_session_options().intra_op_num_threads == torch.get_num_threads()
    assert str(default.session.get_session_options().graph_optimization_level).endswith("ORT_ENABLE_ALL")
    # ORT threads do not spin-wait by default (they would starve the torch kernels between partitions)
    assert default.session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spin = OrtDelegate(_blob_of(cnn), {"allow_spinning": b"1"})
    assert spin.session_options().get_session_config_entry("session.intra_op.allow_spinning") == "1"


# -- corrupted blobs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("how, message", [
    ("magic", "bad magic"),
    ("truncate", "truncated"),
    ("payload", "payload checksum mismatch"),
    ("header", "header checksum mismatch"),
    ("version", "container version"),
])
def test_corrupted_blob_fails_at_load_naming_backend_and_fault(cnn, how, message):
    blob = bytearray(_blob_of(cnn))
    if how == "magic":
        blob[0:8] = b"NOTABLOB"
    elif how == "truncate":
        blob = blob[:len(blob) - 1000]
    elif how == "payload":
        blob[-5] ^= 0xFF
    elif how == "header":
        blob[40] ^= 0x01
    elif how == "version":
        blob[8] = 99
    with pytest.raises(_blob.OrtBlobError, match=message):
        OrtRuntime().init(memoryview(bytes(blob)), {})
    et = _with_blob(cnn, bytes(blob))
    with pytest.raises(ProgramFormatError) as ei:
        Runtime.get().load_program(et.buffer).load_method("forward")
    msg = str(ei.value)
    assert "onnxruntime" in msg and message in msg


def test_blob_roundtrip_and_external_weights_are_zero_copy(cnn):
    blob = _blob_of(cnn)
    u = _blob.unpack(blob)
    assert u.header["format"] == "edgetorch.onnxruntime"
    assert u.initializers and all(not a.flags.writeable for a in u.initializers.values())
    proto = onnx.ModelProto.FromString(bytes(u.model))
    external = {t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert external == set(u.initializers)
    base = np.frombuffer(blob, dtype=np.uint8).ctypes.data
    assert all(base <= a.ctypes.data < base + len(blob) for a in u.initializers.values())


# -- traced runs -----------------------------------------------------------------------------------------

def test_profile_events_inside_the_delegate_map_to_edge_handles(cnn):
    prog = Runtime.get().load_program(cnn.et.buffer, enable_etdump=True)
    method = prog.load_method("forward")
    out = method.execute_structured(*cnn.inputs)
    assert rel_err(out, cnn.model(*cnn.inputs)) <= 1e-5
    events = delegate_profile_events(prog)
    assert len(events) >= 5
    dmap = lowered_module_of(delegate_calls(cnn.lowered)[0]).debug_handle_map
    mapped = [e for e in events if e.delegate_debug_id_str in dmap]
    assert len(mapped) >= 0.5 * len(events)
    for e in events:
        assert e.end_time >= e.start_time
        meta = json.loads(e.delegate_debug_metadata)
        assert meta["op"] and meta["ort_node"]
    assert any(json.loads(e.delegate_debug_metadata)["op"] == "Conv" for e in mapped)
    # "first" (default): only the first traced run of the delegate is profiled op by op
    method.execute(*cnn.inputs)
    assert len(delegate_profile_events(prog)) == len(events)


def test_profile_every_run_when_asked(cnn):
    set_runtime_options(profile_ops="every")
    try:
        prog = Runtime.get().load_program(cnn.et.buffer, enable_etdump=True)
        method = prog.load_method("forward")
        method.execute(*cnn.inputs)
        n = len(delegate_profile_events(prog))
        method.execute(*cnn.inputs)
        assert len(delegate_profile_events(prog)) == 2 * n
    finally:
        set_runtime_options(profile_ops=None)
    with pytest.raises(ValueError, match="unknown"):
        set_runtime_options(no_such_option=1)


def test_observer_effect_modes(cnn, tmp_path):
    # a float model: not checked by default ("auto"), checked once with "first"
    assert not [v for d, v in traced_delegate_outputs(cnn.et, cnn.inputs, str(tmp_path)) if d == "observer_effect"]
    with runtime_options(observer_effect="first"):
        logged = traced_delegate_outputs(cnn.et, cnn.inputs, str(tmp_path))
    effects = [v for d, v in logged if d == "observer_effect"]
    assert len(effects) == 1 and 0.0 <= effects[0] < 1e-4
    for mode, expect in (("off", 0), ("first", 1), ("auto", 0), ("every", 3)):
        set_runtime_options(observer_effect=mode)
        try:
            prog = Runtime.get().load_program(cnn.et.buffer, debug_buffer_size="auto")
            method = prog.load_method("forward")
            for _ in range(3):
                out = method.execute_structured(*cnn.inputs)
                assert rel_err(out, cnn.model(*cnn.inputs)) <= 1e-5
            assert _handle(method).observer_checks == expect
        finally:
            set_runtime_options(observer_effect=None)


def test_observer_effect_is_measured_with_quantized_like_fusions(cnn):
    h = _handle(cnn.method())
    finals = [torch.ones(3)]
    assert h.observer_effect(finals, [torch.ones(3)]) == 0.0
    assert h.observer_effect([torch.tensor([1.0, 2.0])], [torch.tensor([1.0, 4.0])]) == pytest.approx(0.5)
    assert h.observer_effect([torch.tensor([1, 2])], [torch.tensor([1, 3])]) == float("inf")


# -- a planted fault ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["small_cnn", "vit_tiny"])
def test_planted_fault_shows_first_at_the_perturbed_op(name, tmp_path):
    model, inputs = get_model(name)
    low = lower_ort(model, inputs)
    blob = _blob_of(low)
    bad, init_name, onnx_node = perturb_blob(blob)
    header = _blob.unpack(blob).header
    expected = set(header["nodes"][onnx_node])  # the edge handle(s) of the ONNX node reading the weight

    # the capture function alone
    good_h, bad_h = OrtDelegate(blob, {}), OrtDelegate(bad, {})
    x = list(inputs)
    good_vals, _ = good_h.capture_intermediates(x)
    good_vals = {k: v.clone() for k, v in good_vals.items()}
    bad_vals, _ = bad_h.capture_intermediates(x)
    first = next(gid for gid, names in good_h.groups
                 if any(not torch.equal(good_vals[n], bad_vals[n]) for n in names))
    assert set(header["values"][first]) == expected, (first, init_name, onnx_node)

    # the same through the runtime's tracer (ETDump + debug buffer) of the whole program
    ok_dump = traced_delegate_outputs(low.et, inputs, str(tmp_path), "good")
    bad_dump = traced_delegate_outputs(_with_blob(low, bad), inputs, str(tmp_path), "bad")
    assert [d for d, _ in ok_dump] == [d for d, _ in bad_dump]
    diffs = [d for (d, a), (_, b) in zip(ok_dump, bad_dump)
             if d != "observer_effect" and not all(torch.equal(x, y) for x, y in zip(tensors_of(a), tensors_of(b)))]
    assert diffs and diffs[0] == first
    dmap = lowered_module_of(delegate_calls(low.lowered)[0]).debug_handle_map
    assert set(dmap[diffs[0]]) == expected


def _delegate_values_per_run(prog, tmp: str) -> list[dict[str, list[torch.Tensor]]]:
    from edgetorch.devtools.etdump import DebugBuffer, read_etdump

    dump, dbg = os.path.join(tmp, "d.etdp"), os.path.join(tmp, "d.bin")
    prog.write_etdump_result_to_file(dump, dbg)
    buf = DebugBuffer(dbg)
    runs = []
    for run in read_etdump(dump).run_data:
        vals = {}
        for ev in run.events:
            d = ev.debug_event
            if d is not None and d.delegate_debug_id_str and d.delegate_debug_id_str != "observer_effect":
                vals[d.delegate_debug_id_str] = tensors_of(buf.value(d.debug_entry))
        if vals:
            runs.append(vals)
    return runs


def test_intermediates_are_written_in_place_into_a_fixed_debug_buffer(cnn, tmp_path, monkeypatch):
    from edgetorch.runtime.tracing import BufferSink

    x = cnn.inputs[0]
    seq = [x, x * 0.5 + 1.0, x]
    puts = []
    real_put = BufferSink.put
    monkeypatch.setattr(BufferSink, "put", lambda self, off, addr, data: (puts.append(off), real_put(self, off, addr,
                                                                                                        data))[1])
    fixed = Runtime.get().load_program(cnn.et.buffer, enable_etdump=True, debug_buffer_size=64 << 20)
    m = fixed.load_method("forward")
    outs = []
    for inp in seq:
        before = len(puts)
        outs.append(m.execute_structured(inp))
        # ORT writes the intermediates into the buffer itself (shapes known from the blob, first run included);
        # copied: the method's input, the delegate's final output and the program output
        assert len(puts) - before <= 3, len(puts) - before
    (tmp_path / "fixed").mkdir()
    got = _delegate_values_per_run(fixed, str(tmp_path / "fixed"))
    auto = Runtime.get().load_program(cnn.et.buffer, enable_etdump=True, debug_buffer_size="auto")
    ma = auto.load_method("forward")
    for inp in seq:
        ma.execute(inp)
    (tmp_path / "auto").mkdir()
    want = _delegate_values_per_run(auto, str(tmp_path / "auto"))
    assert len(got) == len(want) == 3 and len(got[0]) == len(_handle(m).groups)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            for a, b in zip(g[k], w[k]):
                assert rel_err(a, b) <= 1e-6, k
    # every run kept its own values: run 2 saw other inputs, run 3 the same as run 1
    last = next(reversed(got[0]))
    assert rel_err(got[0][last][0], got[2][last][0]) <= 1e-6 and rel_err(got[1][last][0], got[0][last][0]) > 1e-3
    for o, inp in zip(outs, seq):
        assert rel_err(o, cnn.model(inp)) <= 1e-5


def test_the_delegate_declares_its_debug_bytes_so_a_fixed_buffer_is_sized_exactly(cnn):
    from edgetorch.errors import DebugBufferOverflowError

    probe = Runtime.get().load_program(cnn.et.buffer, enable_etdump=True, debug_buffer_size="auto")
    probe.load_method("forward")
    need = probe.tracer.required_debug_buffer_bytes("forward")
    assert need > 100_000  # the delegate's intermediates, not only the program output
    prog = Runtime.get().load_program(cnn.et.buffer, enable_etdump=True, debug_buffer_size=2 * need)
    m = prog.load_method("forward")
    for run in (1, 2):
        m.execute(*cnn.inputs)
        assert prog.tracer.sink.used_bytes == run * need
    with pytest.raises(DebugBufferOverflowError, match=f"at least {3 * need} bytes"):
        m.execute(*cnn.inputs)  # refused before anything of the run is stored
    assert prog.tracer.sink.used_bytes == 2 * need and prog.tracer.num_runs == 2
