"""InternalConsistency on the parts schema 2 added: symbols, symbolic values and tensor shapes, mutable buffers,
input/output specs; and the run-time guards of a dynamic method. Each corruption is refused with a typed error
naming the field."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from edgetorch.errors import ProgramFormatError, RuntimeInputError
from edgetorch.exir import to_edge
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime, _treespec
from edgetorch.runtime._shapes import ShapeBinder


class Cached(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(16, 4))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, pos, x)
        return self.cache.sum(0) + x.sum(0)


@pytest.fixture(scope="module")
def et():
    seq = torch.export.Dim("seq", min=2, max=16)
    ep = torch.export.export(Cached(), (torch.randn(3, 4), torch.arange(3)), dynamic_shapes=({0: seq}, {0: seq}))
    return to_edge(ep).to_executorch()


def _check(prog: pf.ProgramDef, match: str) -> None:
    with pytest.raises(ProgramFormatError, match=match):
        pf.check_consistency(prog, 1 << 30)


def _plan(et) -> tuple[pf.ProgramDef, pf.PlanDef]:
    prog = copy.deepcopy(et.program)
    return prog, prog.plans[0]


def test_the_intact_program_passes(et):
    pf.check_consistency(et.program, 1 << 30)


def test_symbol_corruptions(et):
    prog, plan = _plan(et)
    plan.symbols[0] = dataclasses.replace(plan.symbols[0], min=20, max=3)
    _check(prog, r"symbol .* has the range \[20, 3\]")
    prog, plan = _plan(et)
    plan.symbols[0] = dataclasses.replace(plan.symbols[0], input=7)
    _check(prog, "is read from input 7")
    prog, plan = _plan(et)
    plan.symbols[0] = dataclasses.replace(plan.symbols[0], dim=5)
    _check(prog, "is read from dim 5 of input 0, which has no such dim")


def test_symbolic_value_corruptions(et):
    prog, plan = _plan(et)
    k, t = next((k, v) for k, v in enumerate(plan.values) if isinstance(v, pf.TensorDef) and v.sym_shape)
    t.sym_shape = '{"sizes": [["s", 9], 4], "strides": [4, 1], "offset": 0}'
    _check(prog, r"symbol reference \['s', 9\]")
    prog, plan = _plan(et)
    plan.values[k].sym_shape = '{"sizes": [["exec", 1], 4], "strides": [4, 1], "offset": 0}'
    _check(prog, "unknown operator 'exec'")
    prog, plan = _plan(et)
    plan.values[k].sym_shape = "not json"
    _check(prog, "sym_shape is not valid JSON")
    prog, plan = _plan(et)
    plan.values.append(pf.SymIntV('["+", 1'))
    _check(prog, "not valid JSON")


def test_mutable_buffer_corruptions(et):
    prog, plan = _plan(et)
    plan.mutable_buffers[0] = dataclasses.replace(plan.mutable_buffers[0], constant_index=99)
    _check(prog, "mutable buffer 'cache' refers to constant 99")
    prog, plan = _plan(et)
    assert plan.mutable_buffers[0].constant_index == pf.MUTABLE_ZERO_INIT  # zeros: no bytes stored
    plan.mutable_buffers[0] = dataclasses.replace(plan.mutable_buffers[0], constant_index=-2)
    _check(prog, "mutable buffer 'cache' refers to constant -2")
    prog, plan = _plan(et)  # a zero-initialised buffer the loader could never allocate
    plan.mutable_buffers[0] = dataclasses.replace(plan.mutable_buffers[0], sizes=(1 << 40, 1 << 4))
    t = next(v for v in plan.values if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_MUTABLE)
    t.sizes, t.strides = [1 << 40, 1 << 4], [1 << 4, 1]
    _check(prog, r"mutable buffer 'cache' would need \d+ bytes")
    prog, plan = _plan(et)
    plan.mutable_buffers[0] = dataclasses.replace(plan.mutable_buffers[0], sizes=(8, 4))
    _check(prog, "does not match the dtype/shape of mutable buffer 'cache'")
    prog, plan = _plan(et)
    t = next(v for v in plan.values if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_MUTABLE)
    t.buffer_index = 3
    _check(prog, "refers to mutable buffer 3")


def test_a_dynamic_tensor_outgrowing_its_planned_bytes_is_refused(et):
    plan = copy.deepcopy(et.program.plans[0])
    k, t = next((k, v) for k, v in enumerate(plan.values) if isinstance(v, pf.TensorDef) and v.sym_shape)
    t.nbytes = 8
    with pytest.raises(ProgramFormatError, match="would span more than its planned 8 bytes"):
        ShapeBinder(plan, "forward").tensor(k, t, 0, f"forward.values[{k}]")


def test_inputs_that_cannot_carry_a_symbol(et):
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    with pytest.raises(RuntimeInputError, match="must be a tensor with at least 1 dims"):
        method.execute(3, torch.arange(3))


@pytest.mark.parametrize("text,match", [("{", "not valid JSON"), ("[1, 5]", "not a \\[protocol, tree\\] pair"),
                                        ('[1, {"type": 3, "children_spec": []}]', "malformed node"),
                                        ('[1, {"type": null, "children_spec": 5}]', "malformed node")])
def test_bad_io_specs_are_refused(text, match):
    with pytest.raises(ProgramFormatError, match=match):
        _treespec.parse(text, "forward.output_spec")
