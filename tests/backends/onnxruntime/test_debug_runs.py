"""What a debug run of an onnxruntime delegate costs: one exposing session (built once, profiled on the first
traced run) that reads the blob's weights in place, the plain session run only for the first observer check,
and linear weights read through Gemm's transB instead of a transpose ORT would fold into a weight copy."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

from edgetorch.backends.onnxruntime import _blob
from edgetorch.backends.onnxruntime.runtime import OrtDelegate
from edgetorch.errors import KernelError
from edgetorch.exir.backend import lowered_module_of
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import (
    delegate_calls,
    delegate_profile_events,
    lower_ort,
    rel_err,
    runtime_options,
)


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return lower_ort(Mlp().eval(), (torch.randn(4, 16),))


def _blob_bytes(low) -> bytes:
    return lowered_module_of(delegate_calls(low.lowered)[0]).processed_bytes


def _model(data: bytes) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    return proto


def _handle(method) -> OrtDelegate:
    (h,) = method._delegate_handles.values()
    return h


def test_linear_weights_are_read_through_trans_b_not_a_transpose(mlp):
    u = _blob.unpack(_blob_bytes(mlp))
    g = _model(bytes(u.model)).graph
    weights = set(u.initializers) | {t.name for t in g.initializer}
    assert not [n for n in g.node if n.op_type == "Transpose" and n.input[0] in weights]
    gemms = [n for n in g.node if n.op_type == "Gemm"]
    assert len(gemms) == 2
    for n in gemms:
        assert n.input[1] in weights
        assert next((a.i for a in n.attribute if a.name == "transB"), 0) == 1
    # the weights as stored: nn.Linear's [out, in]
    assert sorted(tuple(u.initializers[n.input[1]].shape) for n in gemms) == [(8, 32), (32, 16)]
    out = mlp.method().execute(*mlp.inputs)[0]
    assert rel_err(out, mlp.model(*mlp.inputs)) <= 1e-5


def test_the_exposing_session_binds_the_weights_instead_of_owning_them(mlp):
    h = OrtDelegate(_blob_bytes(mlp), {})
    g = _model(h._exposing_model()).graph
    inputs = {i.name for i in g.input}
    assert set(h._arrays) <= inputs and not set(h._arrays) & {t.name for t in g.initializer}
    values, finals = h.capture_intermediates(list(mlp.inputs))
    assert rel_err(finals[0], mlp.model(*mlp.inputs)) <= 1e-5
    assert len(values) == len(h.intermediates)
    res = h.debug_session().run(h._debug_outputs, h.debug_feeds(list(mlp.inputs)))
    assert all(torch.equal(values[n], torch.from_numpy(r)) for n, r in zip(h._debug_outputs, res) if n in values)


@pytest.mark.parametrize("mode, checks", [("auto", 0), ("first", 1)])
def test_a_debug_program_profiles_the_first_run_on_the_session_built_at_load(mlp, mode, checks):
    with runtime_options(observer_effect=mode):
        prog = Runtime.get().load_program(mlp.et.buffer, enable_etdump=True, debug_buffer_size="auto")
        method = prog.load_method("forward")
    h = _handle(method)
    built = h._debug_session
    assert built is not None and h._debug_armed  # built when the tracer was attached, armed for profiling
    want = mlp.model(*mlp.inputs)
    sessions = []
    for _ in range(3):
        out = method.execute(*mlp.inputs)[0]
        assert rel_err(out, want) <= 1e-5
        sessions.append(h._debug_session)
    assert h.observer_checks == checks and h.profiled_runs == 1  # a float model: checked only when asked
    assert built is sessions[0] is sessions[1] is sessions[2]  # the one session serves every debug run
    events = delegate_profile_events(prog)
    dmap = lowered_module_of(delegate_calls(mlp.lowered)[0]).debug_handle_map
    assert events and all(e.delegate_debug_id_str in dmap for e in events)
    assert "Gemm" in {json.loads(e.delegate_debug_metadata)["op"] for e in events}


def test_only_a_tracer_that_logs_values_builds_the_exposing_session_at_load(mlp):
    plain = _handle(Runtime.get().load_program(mlp.et.buffer).load_method("forward"))
    profiled = _handle(Runtime.get().load_program(mlp.et.buffer, enable_etdump=True).load_method("forward"))
    assert plain._debug_session is None and profiled._debug_session is None  # no values to expose
    with runtime_options(profile_ops="off"):
        prog = Runtime.get().load_program(mlp.et.buffer, enable_etdump=True, debug_buffer_size="auto")
        h = _handle(prog.load_method("forward"))
    assert h._debug_session is not None and not h._debug_armed  # nothing to profile: an unprofiled session
    prog.load_method("forward").execute(*mlp.inputs)
    assert h.profiled_runs == 0 and not delegate_profile_events(prog)


def test_a_bad_observer_effect_spec_is_named(mlp):
    h = OrtDelegate(_blob_bytes(mlp), {"observer_effect": b"always"})
    with pytest.raises(ValueError, match="observer_effect must be 'auto', 'every', 'first' or 'off', got 'always'"):
        h.observer_mode()


def test_an_exposing_session_that_fails_to_build_at_load_fails_the_debug_run_that_needs_it(mlp, monkeypatch):
    def broken(self):
        raise RuntimeError("ORT refused the exposing model")

    monkeypatch.setattr(OrtDelegate, "_exposing_model", broken)
    prog = Runtime.get().load_program(mlp.et.buffer, enable_etdump=True, debug_buffer_size="auto")
    method = prog.load_method("forward")  # the load itself succeeds: plain runs do not need that session
    assert _handle(method)._debug_session is None
    with pytest.raises(KernelError, match="ORT refused the exposing model") as err:
        method.execute(*mlp.inputs)
    assert "instruction 0 (lowered_onnxruntime_0" in str(err.value)  # names the delegate call that failed
