"""Regression tests of the failure classes the mutation fuzzer found in programs (issue 9): every one is refused
by ``Verification.InternalConsistency`` (and so by ``Full``, even with a correct content hash) with a
``ProgramFormatError`` naming the field, before any tensor is built."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from edgetorch.errors import ProgramFormatError
from edgetorch.exir import to_edge
from edgetorch.formats import program as pf
from edgetorch.models import get_model
from edgetorch.runtime import Runtime, Verification


@pytest.fixture(scope="module")
def mlp():
    model, inputs = get_model("mlp")
    et = to_edge(torch.export.export(model, inputs)).to_executorch()
    data = bytes(et.buffer)
    h = pf.read_header(data)
    segment = data[h.segment_offset:h.segment_offset + h.segment_size]
    return et.program, segment, inputs, Runtime.get().load_program(data).load_method("forward").execute(*inputs)


def _file(prog: pf.ProgramDef, segment: bytes) -> bytes:
    """A complete .pte (correct content hash) for an edited program."""
    return b"".join(bytes(p) for p in pf.build_file_parts(prog, [segment]))


def _tensor(prog: pf.ProgramDef, placement: int) -> tuple[int, pf.TensorDef]:
    return next((k, v) for k, v in enumerate(prog.plans[0].values)
                if isinstance(v, pf.TensorDef) and v.placement == placement and v.nbytes)


def _refused(mlp, edit, field: str, match: str) -> None:
    prog, segment, _, _ = mlp
    prog = copy.deepcopy(prog)
    edit(prog)
    data = _file(prog, segment)
    for level in (Verification.InternalConsistency, Verification.Full):
        with pytest.raises(ProgramFormatError, match=match) as ei:
            Runtime.get().load_program(data, verification=level)
        assert ei.value.field.endswith(field), (ei.value.field, field)


def test_sizes_and_strides_beyond_the_planned_slot(mlp):
    def edit(prog):
        k, v = _tensor(prog, pf.PLACEMENT_PLANNED)
        v.strides = [1 << 20] + list(v.strides[1:])
        v.sizes = [max(2, v.sizes[0])] + list(v.sizes[1:])
    _refused(mlp, edit, ".nbytes", "spans .* bytes but its arena slot has")


def test_absurd_sizes(mlp):
    def edit(prog):
        k, v = _tensor(prog, pf.PLACEMENT_PLANNED)
        v.sizes = [17592186044417] + list(v.sizes[1:])
    _refused(mlp, edit, ".sizes", "implausible size")


def test_a_constant_viewed_beyond_its_bytes(mlp):
    def edit(prog):
        k, v = _tensor(prog, pf.PLACEMENT_CONSTANT)
        v.storage_offset = 10
    _refused(mlp, edit, ".nbytes", "spans .* bytes but records")


def test_a_constant_that_claims_no_bytes(mlp):  # it used to give an uninitialised tensor
    def edit(prog):
        k, v = _tensor(prog, pf.PLACEMENT_CONSTANT)
        v.nbytes = 0
    _refused(mlp, edit, ".nbytes", "spans .* bytes but records 0")


def test_overlapping_planned_layout(mlp):  # "more than one element of the written-to tensor refers to ..."
    def edit(prog):
        k, v = next((k, v) for k, v in enumerate(prog.plans[0].values) if isinstance(v, pf.TensorDef)
                    and v.placement == pf.PLACEMENT_PLANNED and len(v.sizes) == 2 and v.sizes[1] > 1)
        v.strides = [v.strides[0], 0]
    _refused(mlp, edit, ".strides", "elements sharing memory")


def test_negative_strides(mlp):
    def edit(prog):
        k, v = _tensor(prog, pf.PLACEMENT_PLANNED)
        v.strides = [-1] * len(v.strides)
    _refused(mlp, edit, ".strides", "negative stride")


def test_unbounded_arena(mlp):  # it used to ask the allocator for 730946904893354454 bytes
    def edit(prog):
        prog.plans[0].arena_size = 730946904893354454
    _refused(mlp, edit, ".arena_size", "arena_size 730946904893354454 does not match")


def test_misaligned_arena_offset(mlp):
    def edit(prog):
        k, v = _tensor(prog, pf.PLACEMENT_PLANNED)
        v.arena_offset += 4
    _refused(mlp, edit, ".arena_offset", "not a multiple of 64")


@pytest.mark.parametrize("spec, match", [
    ("[1, {\"type\": null}]", "malformed node"),
    ("[1, {\"type\": \"builtins.tuple\", \"children_spec\": [{\"type\": null, \"children_spec\": []}]}]",
     "malformed node"),
    ("{not json", "not valid JSON"),
    ("[1, 2, 3]", "not a \\[protocol, tree\\] pair"),
])
def test_malformed_io_specs(mlp, spec, match):  # KeyError 'children_spec' / 'context', JSONDecodeError
    def edit(prog):
        prog.plans[0].input_spec = spec
    _refused(mlp, edit, ".input_spec", match)


def test_unknown_scalar_type(mlp):
    def edit(prog):
        k, v = _tensor(prog, pf.PLACEMENT_PLANNED)
        v.scalar_type = 63
    _refused(mlp, edit, ".scalar_type", "unknown or unsupported scalar type 63")


def test_a_constant_whose_size_is_not_a_multiple_of_its_itemsize_still_loads(mlp):
    """"must be divisible by 4 to view Byte as Float": the runtime views only whole items of a constant."""
    prog, segment, inputs, expected = mlp
    prog = copy.deepcopy(prog)
    k, v = _tensor(prog, pf.PLACEMENT_CONSTANT)
    off, size = prog.constants[v.constant_index]
    prog.constants[v.constant_index] = (off, size + 3)
    segment = segment + bytes(3)
    out = Runtime.get().load_program(_file(prog, segment), verification=Verification.Full) \
        .load_method("forward").execute(*inputs)
    assert torch.equal(out[0], expected[0])


def test_the_intact_program_passes_and_runs(mlp):
    prog, segment, inputs, expected = mlp
    pf.check_consistency(prog, len(segment))
    plan = dataclasses.replace(prog.plans[0])
    assert plan.arena_size == pf.align(max(v.arena_offset + v.nbytes for v in plan.values
                                           if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED))
    out = Runtime.get().load_program(_file(prog, segment), verification=Verification.Full) \
        .load_method("forward").execute(*inputs)
    assert torch.equal(out[0], expected[0])


@pytest.mark.parametrize("value, match", [
    (pf.DtypeV(63), "unknown dtype"), (pf.LayoutV(9), "unknown layout"), (pf.MemoryFormatV(9), "unknown memoryformat"),
    (pf.DeviceV("\x00bad"), "unknown device"),
])
def test_unknown_enum_arguments(mlp, value, match):  # "unknown scalar-type code", KeyError, RuntimeError
    def edit(prog):
        prog.plans[0].values.append(value)
    _refused(mlp, edit, f".values[{len(mlp[0].plans[0].values)}]", match)


def _kernel(prog: pf.ProgramDef, op: str) -> pf.InstructionDef:
    plan = prog.plans[0]
    return next(ins for ins in plan.instructions if isinstance(ins.call, pf.KernelCallDef)
                and plan.operators[ins.call.op_index].name == op)


def test_an_instruction_writing_a_constant(mlp):
    """A fuzzer find: an output index pointing at a weight made addmm resize the weight (a silent change)."""
    index = mlp[0].plans[0].instructions.index(_kernel(mlp[0], "aten::addmm"))

    def edit(prog):
        k, _ = _tensor(prog, pf.PLACEMENT_CONSTANT)
        _kernel(prog, "aten::addmm").call.outputs = [k]
    _refused(mlp, edit, f"instructions[{index}]", "writes value .*, a constant")


def test_a_kernel_computing_another_shape_than_planned_is_refused_at_its_first_run(mlp):
    """An output index pointing at a planned tensor of another shape: refused by the plan check at load, and
    under Minimal by the first run's check of that kernel's outputs."""
    prog, segment, inputs, _ = mlp
    prog = copy.deepcopy(prog)
    plan = prog.plans[0]
    last = [ins.call for ins in plan.instructions if isinstance(ins.call, pf.KernelCallDef)
            and plan.operators[ins.call.op_index].name == "aten::addmm"][-1]
    other = next(k for k, v in enumerate(plan.values) if isinstance(v, pf.TensorDef) and v.placement ==
                 pf.PLACEMENT_PLANNED and k not in plan.inputs and k not in last.args
                 and v.sizes != plan.values[last.outputs[0]].sizes)
    last.outputs = [other]
    # the loader re-proves the plan (issue 23): the method output addmm no longer writes is read unwritten
    with pytest.raises(ProgramFormatError, match="output 0 reads planned value .* before any instruction wrote"):
        Runtime.get().load_program(_file(prog, segment))
    # without that check (Minimal), the first run checks the kernel's output right after it ran
    method = Runtime.get().load_program(_file(prog, segment), verification=Verification.Minimal).load_method("forward")
    with pytest.raises(ProgramFormatError, match=r"instruction \d+ .* wrote output 0 with shape"):
        method.execute(*inputs)
