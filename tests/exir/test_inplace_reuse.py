"""Emission: an elementwise op writes over its input only where that input (and every view of it) is dead.

Each model is built to trap a wrong in-place choice: the value it would overwrite is read later, through a
view, by the same instruction through a view, is a user input or a method output. Results are checked
bitwise against eager, and the plan is checked for which instructions run in place.
"""

from __future__ import annotations

import torch

from edgetorch.formats import program as pf
from tests.conftest import load, lower


def _run(model: torch.nn.Module, *inputs: torch.Tensor) -> tuple[list, pf.PlanDef]:
    et = lower(model, inputs)
    method = load(et).load_method("forward")
    return method.execute(*inputs), method.plan


def _in_place(plan: pf.PlanDef) -> list[str]:
    """Names of the ops of the instructions that write one of their own arguments."""
    names = []
    for ins in plan.instructions:
        c = ins.call
        if isinstance(c, pf.KernelCallDef) and set(c.outputs) & set(c.args):
            names.append(plan.operators[c.op_index].name)
    return names


def _check(model: torch.nn.Module, *inputs: torch.Tensor) -> list[str]:
    with torch.no_grad():
        want = model(*inputs)
    got, plan = _run(model, *inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    return _in_place(plan)


class ReluChain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2.0
        return torch.relu(torch.nn.functional.hardtanh(a + 1.0, -0.5, 0.5)) + 3.0


class ReadLater(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2.0
        r = torch.relu(a)
        return r * 3.0 + a  # a is read after the relu


class ViewReadLater(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2.0
        v = a.t()
        r = torch.relu(a)
        return r + v  # the relu's input is read later through a view


class ViewSameInstruction(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x - 0.25
        return torch.relu(a * a.t())  # mul may not write over a while reading its transpose


class InputAndOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = x * 2.0
        return torch.relu(x), a, torch.sigmoid(a)  # x is a user input, a a method output


class Broadcast(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = y * 2.0  # (1, 4): the add's output is (4, 4), larger than a
        return a + x


def test_chain_runs_in_place() -> None:
    ops = _check(ReluChain(), torch.randn(4, 4))
    assert ops == ["aten::add", "aten::hardtanh", "aten::relu", "aten::add"]


def test_input_read_later_is_not_overwritten() -> None:
    assert "aten::relu" not in _check(ReadLater(), torch.randn(4, 4))


def test_input_read_later_through_a_view_is_not_overwritten() -> None:
    assert "aten::relu" not in _check(ViewReadLater(), torch.randn(4, 4))


def test_input_read_through_a_view_by_the_same_instruction_is_not_overwritten() -> None:
    assert _check(ViewSameInstruction(), torch.randn(5, 5)) == ["aten::relu"]


def test_user_inputs_and_outputs_are_not_overwritten() -> None:
    x = torch.randn(3, 6)
    keep = x.clone()
    assert _check(InputAndOutput(), x) == []
    assert torch.equal(x, keep)


def test_broadcast_input_is_not_overwritten() -> None:
    assert _check(Broadcast(), torch.randn(4, 4), torch.randn(1, 4)) == []


def test_each_in_place_instruction_output_is_its_eager_value() -> None:
    x = torch.randn(4, 4)
    et = lower(ReluChain(), (x,))
    method = load(et).load_method("forward")
    plan = method.plan
    assert len(_in_place(plan)) == 4
    # values each instruction wrote, read right after it ran: the same as the eager intermediates
    method.execute(x)
    a = x * 2.0
    steps = [a, a + 1.0]
    steps.append(torch.nn.functional.hardtanh(steps[-1], -0.5, 0.5))
    steps.append(torch.relu(steps[-1]))
    steps.append(steps[-1] + 3.0)
    seen = []
    method._check_and_copy_inputs([x])
    for k in range(len(plan.instructions)):
        method.run_instruction(k)
        seen.append(method.value(plan.instructions[k].call.outputs[0]).clone())
    assert len(seen) == len(steps)
    for s, w in zip(seen, steps):
        assert torch.equal(s, w)


class EvalDropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.drop(torch.relu(self.fc(x)))
        kept = x * 2.0
        return self.drop(h) + 1.0, kept.clone() + kept  # a clone of a value read later stays a copy


def test_eval_dropout_clone_runs_in_place_only_when_its_input_dies() -> None:
    model = EvalDropout().eval()
    ops = _check(model, torch.randn(3, 8))
    assert "aten::clone" in ops and "aten::relu" in ops
    plan = _run(model, torch.randn(3, 8))[1]
    clones = [ins.call for ins in plan.instructions
              if isinstance(ins.call, pf.KernelCallDef) and plan.operators[ins.call.op_index].name == "aten::clone"]
    kept_clone = [c for c in clones if not set(c.outputs) & set(c.args)]
    assert len(kept_clone) == 1 and len(clones) >= 2


class ViewInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = (x * 2.0).view(4, 6)
        return torch.relu(a) + 1.0  # the view dies at the relu, and so does its base: in place


class ViewInputBaseReadLater(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x * 2.0
        r = torch.relu(b.view(4, 6))
        return r.view(6, 4) + b  # the base is read after the relu of its view


class TwoViewsOfOneBase(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x * 2.0
        return b.view(4, 6) * b.view(6, 4).t().contiguous().view(4, 6)


def test_view_input_whose_base_dies_runs_in_place() -> None:
    assert _check(ViewInput(), torch.randn(6, 4)) == ["aten::relu", "aten::add"]


def test_view_input_whose_base_is_read_later_is_not_overwritten() -> None:
    assert "aten::relu" not in _check(ViewInputBaseReadLater(), torch.randn(6, 4))


def test_views_of_one_base_in_one_instruction() -> None:
    _check(TwoViewsOfOneBase(), torch.randn(6, 4))
