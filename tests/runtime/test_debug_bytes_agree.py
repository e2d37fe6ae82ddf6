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
    planned = p.tracer.required_debug_buffer_bytes("forward")  # from the plan alone, before the method loads
    m = p.load_method("forward")
    need = p.tracer.required_debug_buffer_bytes("forward")
    own = pf.run_debug_bytes(p.plan("forward"))  # the values the plan logs itself, no delegate's
    assert planned == need == p.plan("forward").debug_buffer_bytes  # one figure, written at emission
    assert need == own if kind == "portable" else need > own  # ORT: plus what its preprocess declared
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


def _with_debug_bytes(buf: bytes, n: int) -> bytes:
    from tests.fuzz.pte_edit import edit

    def set_bytes(prog: pf.ProgramDef) -> None:
        prog.plan("forward").debug_buffer_bytes = n

    return edit(bytes(buf), set_bytes)


@pytest.mark.parametrize("kind", ["portable", "onnxruntime"])
def test_the_tracer_reserves_the_plan_figure_never_less_than_its_own_values(programs, kind):
    """The tracer reads the one figure from the plan (not the delegate's runtime handle): a plan promising more
    gets exactly that reserved; one promising less than the values the runtime logs itself (an edited file)
    gets what those take, and its runs fit a fixed buffer of that size."""
    bufs, inputs = programs
    plan = pf.decode_flatbuffer(_plan_flatbuffer(bufs[kind])).plan("forward")
    own = pf.run_debug_bytes(plan)
    p = Runtime.get().load_program(_with_debug_bytes(bufs[kind], plan.debug_buffer_bytes + 640),
                                   debug_buffer_size="auto")
    p.load_method("forward").execute(*inputs)
    assert p.tracer.required_debug_buffer_bytes("forward") == plan.debug_buffer_bytes + 640
    p.tracer.close()
    p = Runtime.get().load_program(_with_debug_bytes(bufs[kind], 64), debug_buffer_size="auto")
    m = p.load_method("forward")
    assert p.tracer.required_debug_buffer_bytes("forward") == own
    if kind == "portable":  # a delegate logs beyond `own` (what its preprocess declared, edited away here)
        p = Runtime.get().load_program(_with_debug_bytes(bufs[kind], 64), debug_buffer_size=own)
        m = p.load_method("forward")
        m.execute(*inputs)
        assert p.tracer.sink.used_bytes == own
    p.tracer.close()


def _plan_flatbuffer(buf: bytes) -> bytes:
    h = pf.read_header(buf)
    return bytes(buf[h.flatbuffer_offset:h.flatbuffer_offset + h.flatbuffer_size])
