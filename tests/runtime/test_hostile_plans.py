"""Plans the compiler would never write, made by editing a valid ``.pte`` (valid hashes): the loader re-proves
the plan under InternalConsistency and Full (def-use, no live overlap, inputs, buffers) and every kernel's
outputs on the first run, with a typed error naming the value or instruction at fault."""

from __future__ import annotations

import dataclasses

import pytest

from edgetorch.errors import ProgramFormatError
from edgetorch.formats import plan_check
from edgetorch.formats import program as pf
from edgetorch.models import get_model
from edgetorch.runtime import Runtime, Verification
from tests.conftest import lower
from tests.fuzz.pte_edit import edit

CHECKED = (Verification.InternalConsistency, Verification.Full)


@pytest.fixture(scope="module")
def mlp():
    model, inputs = get_model("mlp")
    return lower(model, inputs).buffer, inputs


def _kernels(p: pf.PlanDef) -> list[int]:
    return [k for k, i in enumerate(p.instructions) if isinstance(i.call, pf.KernelCallDef)
            and i.call.kind == pf.CALL_OUT]


def _overlap(prog: pf.ProgramDef) -> None:
    """Two planned values live at one instruction put at the same arena offset."""
    p = prog.plans[0]
    spans = plan_check.live_ranges(p)
    keys = [k for k in spans if p.values[k].nbytes > 0]
    a, b = next((a, b) for a in keys for b in keys if a != b and spans[a][0] <= spans[b][1]
                and spans[b][0] <= spans[a][1] and p.values[b].nbytes <= p.values[a].nbytes
                and p.values[a].arena_offset != p.values[b].arena_offset)
    p.values[b].arena_offset = p.values[a].arena_offset


def _read_before_write(prog: pf.ProgramDef) -> None:
    """An instruction's planned input swapped for the output of the last kernel (written later)."""
    p = prog.plans[0]
    ks = _kernels(p)
    first, last = ks[1], ks[-1]
    c = p.instructions[first].call
    j = next(j for j, a in enumerate(c.args) if isinstance(p.values[a], pf.TensorDef)
             and p.values[a].placement == pf.PLACEMENT_PLANNED)
    c.args[j] = p.instructions[last].call.outputs[0]


@pytest.mark.parametrize("level", CHECKED)
@pytest.mark.parametrize("mutate,match", [
    (_overlap, "share arena bytes while both are live"),
    (_read_before_write, "reads planned value .* before any instruction wrote it"),
])
def test_plan_edits_are_refused(mlp, level, mutate, match):
    data, _ = mlp
    with pytest.raises(ProgramFormatError, match=match) as e:
        Runtime.get().load_program(edit(data, mutate), verification=level)
    assert e.value.field.startswith("forward.")


@pytest.mark.parametrize("level", (Verification.Minimal, *CHECKED))
def test_a_non_planned_input_is_a_typed_error(mlp, level):
    """An input pointing at a constant or an alias (was: AttributeError deep in ``_check_and_copy_inputs``)."""
    data, inputs = mlp
    for placement in (pf.PLACEMENT_CONSTANT, pf.PLACEMENT_ALIAS):
        def mutate(prog: pf.ProgramDef, placement=placement) -> None:
            p = prog.plans[0]
            p.inputs[0] = next(i for i, v in enumerate(p.values) if isinstance(v, pf.TensorDef)
                               and v.placement == placement)

        with pytest.raises(ProgramFormatError, match=r"input 0 \('x'\) is a tensor of placement"):
            Runtime.get().load_program(edit(data, mutate), verification=level).load_method("forward")


def test_a_mutable_buffer_named_twice_is_refused():
    """Two ``mutable_buffers`` entries naming one state: the V cache would be written over the K cache."""
    model, inputs = get_model("llama_tiny")
    data = lower(model, inputs).buffer

    def mutate(prog: pf.ProgramDef) -> None:
        mbs = prog.plans[0].mutable_buffers
        mbs[1] = dataclasses.replace(mbs[1], name=mbs[0].name)

    for level in (Verification.Minimal, *CHECKED):
        with pytest.raises(ProgramFormatError, match="mutable buffer .* is named twice"):
            Runtime.get().load_program(edit(data, mutate), verification=level).load_method("forward")


@pytest.mark.parametrize("level", (Verification.Minimal, *CHECKED))
def test_a_kernel_writing_another_shape_is_refused_on_the_first_run(mlp, level):
    """The planned slot of the first addmm shrunk to half its shape: torch would resize the output away from
    the arena (a later kernel could resize it back). The first run checks each kernel's outputs right after it."""
    data, inputs = mlp

    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        o = p.instructions[_kernels(p)[0]].call.outputs[0]
        v = p.values[o]
        v.sizes = [v.sizes[0], v.sizes[1] // 2]
        v.strides = [v.sizes[1], 1]

    method = Runtime.get().load_program(edit(data, mutate), verification=level).load_method("forward")
    with pytest.raises(ProgramFormatError, match=r"instruction \d+ .* wrote output 0 with shape \[1, 256\].*"
                                                 r"plans \[1, 128\]"):
        method.execute(*inputs)


def test_a_symbolic_stride_that_makes_elements_overlap_at_run_time_is_refused():
    """The static layout check sees the upper bounds only: a dim-0 stride of ``seq + 2`` is 8 (fine) at the upper
    bound 6 and 5 (rows overlap) at length 3; the strides of each run are checked when the method is reshaped."""
    import json

    import torch

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    seq = torch.export.Dim("seq", min=2, max=6)
    from edgetorch.exir import to_edge

    data = to_edge(torch.export.export(Double(), (torch.randn(4, 8),), dynamic_shapes=({0: seq},))) \
        .to_executorch().buffer

    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        o = next(i.call for i in p.instructions if i.call.kind == pf.CALL_OUT).outputs[0]
        shape = json.loads(p.values[o].sym_shape)
        shape["strides"] = [["+", ["s", 0], 2], 1]
        p.values[o].sym_shape = json.dumps(shape)

    method = Runtime.get().load_program(edit(data, mutate)).load_method("forward")
    (out,) = method.execute(x := torch.randn(6, 8))
    torch.testing.assert_close(out, x * 2, rtol=0, atol=0)
    with pytest.raises(ProgramFormatError, match=r"strides \[5, 1\] has elements sharing memory"):
        method.execute(torch.randn(3, 8))
