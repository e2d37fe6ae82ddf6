"""``ExecutorchBackendConfig(sym_shape_eval_pass=...)`` (issue 26): constraint-based plans at each Dim's max,
hint-based at the example's sizes (a smaller arena; larger inputs refused at run time); a dict picks per method;
anything else is refused, typed, naming the field."""

from __future__ import annotations

import pytest
import torch

from edgetorch.errors import ExportError, RuntimeInputError
from edgetorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
from edgetorch.exir.passes import HintBasedSymShapeEvalPass as FromPackage
from edgetorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass, HintBasedSymShapeEvalPass
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime

_EXAMPLE_ROWS, _MAX_ROWS = 3, 64


class _Rows(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2 + torch.sigmoid(x)


class _Two(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2 + torch.sigmoid(x)

    def other(self, x):
        return torch.tanh(x) - 1


class _Other(torch.nn.Module):
    def __init__(self, owner: _Two) -> None:
        super().__init__()
        self.owner = owner

    def forward(self, x):
        return self.owner.other(x)


def _export(module=None, max_rows: int | None = _MAX_ROWS):
    rows = torch.export.Dim("rows", max=max_rows) if max_rows else torch.export.Dim("rows")
    return torch.export.export(module or _Rows(), (torch.randn(_EXAMPLE_ROWS, 8),), dynamic_shapes={"x": {0: rows}})


def _planned_nbytes(et, method: str = "forward") -> list[int]:
    plan = next(p for p in et.program.plans if p.name == method)
    return sorted(v.nbytes for v in plan.values if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED)


@pytest.fixture(scope="module")
def programs():
    edge = to_edge(_export())
    return {"constraint": edge.to_executorch(),
            "hint": edge.to_executorch(ExecutorchBackendConfig(sym_shape_eval_pass=HintBasedSymShapeEvalPass()))}


def test_constraint_based_is_the_default_and_plans_at_the_max(programs):
    et = programs["constraint"]
    assert isinstance(ExecutorchBackendConfig().sym_shape_eval_pass, ConstraintBasedSymShapeEvalPass)
    assert _planned_nbytes(et) == [_MAX_ROWS * 8 * 4] * len(_planned_nbytes(et))
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    for rows in (1, _EXAMPLE_ROWS, _MAX_ROWS):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(method.execute(x)[0], _Rows()(x))


def test_hint_based_plans_at_the_example_size_and_refuses_larger_inputs(programs):
    hint, constraint = programs["hint"], programs["constraint"]
    sizes = _planned_nbytes(hint)
    assert sizes and sizes == [_EXAMPLE_ROWS * 8 * 4] * len(sizes)
    assert hint.memory_plan_report()["forward"]["arena_bytes"] < constraint.memory_plan_report()["forward"][
        "arena_bytes"]
    method = Runtime.get().load_program(hint.buffer).load_method("forward")
    for rows in (1, _EXAMPLE_ROWS):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(method.execute(x)[0], _Rows()(x))
    with pytest.raises(RuntimeInputError, match=r"x\.shape\[0\]\) is 4, outside its bounds \[0, 3\]"):
        method.execute(torch.randn(_EXAMPLE_ROWS + 1, 8))


def test_hint_based_bounds_a_dim_exported_without_a_max():
    with pytest.raises(ExportError, match="no upper bound"):  # the edge verifier refuses it first
        to_edge(_export(max_rows=None))
    edge = to_edge(_export(max_rows=None), compile_config=EdgeCompileConfig(_check_ir_validity=False))
    with pytest.raises(ExportError, match="without an upper bound"):
        edge.to_executorch()
    et = edge.to_executorch(ExecutorchBackendConfig(sym_shape_eval_pass=FromPackage()))
    x = torch.randn(2, 8)
    torch.testing.assert_close(Runtime.get().load_program(et.buffer).load_method("forward").execute(x)[0],
                               _Rows()(x))


def test_a_dict_picks_the_pass_per_method_and_the_others_get_the_default():
    two = _Two()
    edge = to_edge({"forward": _export(two), "other": _export(_Other(two))})
    et = edge.to_executorch(ExecutorchBackendConfig(sym_shape_eval_pass={"other": HintBasedSymShapeEvalPass()}))
    assert set(_planned_nbytes(et, "forward")) == {_MAX_ROWS * 8 * 4}
    assert set(_planned_nbytes(et, "other")) == {_EXAMPLE_ROWS * 8 * 4}


@pytest.mark.parametrize("bad", [HintBasedSymShapeEvalPass, "hint", {"forward": object()},
                                 {1: HintBasedSymShapeEvalPass()}])
def test_anything_else_is_refused_naming_the_field(bad):
    with pytest.raises(ExportError, match="sym_shape_eval_pass"):
        ExecutorchBackendConfig(sym_shape_eval_pass=bad)


def test_the_pass_is_not_a_graph_pass():
    with pytest.raises(ExportError, match="not a graph pass"):
        HintBasedSymShapeEvalPass()(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()))
