"""One debug-bytes formula: what a method's metadata promises (``MethodMeta.debug_buffer_bytes``, written by
emission) is what the tracer reserves for one run, and what one run stores, on a zoo model run by the portable
kernels and with an ONNX Runtime delegate."""

from __future__ import annotations

import pytest
import torch

from edgetorch.exir import to_edge
from edgetorch.formats import program as pf
from edgetorch.formats.alignment import debug_bytes
from edgetorch.models import get_spec
from edgetorch.runtime import Runtime


def _programs():
    spec = get_spec("small_cnn")
    torch.manual_seed(0)
    model = spec.build().eval()
    inputs = spec.example_inputs()["forward"]
    epm = to_edge(torch.export.export(model, inputs))
    portable = epm.to_executorch().buffer
    from edgetorch.backends.onnxruntime import OrtPartitioner

    lowered = to_edge(torch.export.export(model, inputs)).to_backend(OrtPartitioner()).to_executorch().buffer
    return {"portable": portable, "onnxruntime": lowered}, inputs


@pytest.fixture(scope="module")
def programs():
    return _programs()


@pytest.mark.parametrize("kind", ["portable", "onnxruntime"])
def test_tracer_reserves_what_one_run_stores(programs, kind):
    bufs, inputs = programs
    p = Runtime.get().load_program(bufs[kind], debug_buffer_size="auto")
    planned = p.tracer.required_debug_buffer_bytes("forward")  # from the plan alone: no delegate declared yet
    m = p.load_method("forward")
    need = p.tracer.required_debug_buffer_bytes("forward")
    assert planned == pf.run_debug_bytes(p.plan("forward"))
    assert need == planned if kind == "portable" else need > planned
    assert need % 64 == 0 and need > debug_bytes(t.numel() * t.element_size() for t in inputs)
    m.execute(*inputs)
    assert p.tracer.sink.used_bytes <= need  # a fixed buffer of `need` bytes per run never overflows
    assert kind == "onnxruntime" or p.tracer.sink.used_bytes == need  # portable: exactly (no delegate guesses)
    p.tracer.close()


@pytest.mark.parametrize("kind", ["portable", "onnxruntime"])
def test_method_meta_promises_what_the_tracer_reserves(programs, kind):
    bufs, _ = programs
    p = Runtime.get().load_program(bufs[kind], debug_buffer_size="auto")
    m = p.load_method("forward")
    assert m.method_meta().debug_buffer_bytes == p.tracer.required_debug_buffer_bytes("forward")
    p.tracer.close()
