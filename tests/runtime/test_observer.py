"""The method observer hook (``runtime.observer``): the run loop calls it around the run and each instruction
that runs, in order; a hook's error ends the run unchanged; the ETDump tracer is the observer of a traced
program's methods and a plain program's methods have none."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgetorch.exir import to_edge
from edgetorch.runtime import Runtime
from edgetorch.runtime.observer import MethodObserver


class Recorder:
    """Records every hook call, and the value of each instruction's first output right after it ran."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.values: dict[int, torch.Tensor] = {}
        self.fail_at = fail_at
        self.method = None

    def begin_run(self, method) -> None:
        self.method = method
        self.calls.append(("begin",))

    def before_instruction(self, k: int) -> None:
        self.calls.append(("before", k))

    def after_instruction(self, k: int) -> None:
        self.calls.append(("after", k))
        if k == self.fail_at:
            raise ValueError("observer failure requested by the test")
        ins = next(i for i in self.method.instructions if i.index == k)
        self.values[k] = self.method.value(ins.outputs[0]).clone()

    def end_run(self, method, ok: bool) -> None:
        self.calls.append(("end", ok))


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    et = to_edge(torch.export.export(model, (x,))).to_executorch()
    return et.buffer, model, x


def test_hooks_are_called_in_order_around_each_instruction(program):
    data, model, x = program
    m = Runtime.get().load_program(data).load_method("forward")
    assert m.observer is None
    rec = Recorder()
    assert isinstance(rec, MethodObserver)
    m.observer = rec
    (out,) = m.execute(x)
    ran = [i.index for i in sorted(m.instructions, key=lambda i: i.index) if i.kind != "VIEW"]
    assert rec.calls == [("begin",), *[c for k in ran for c in (("before", k), ("after", k))], ("end", True)]
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(rec.values[ran[-1]], want)  # the last instruction wrote the output
    m.observer = None
    rec.calls.clear()
    torch.testing.assert_close(m.execute(x)[0], want)
    assert rec.calls == []


def test_a_hook_error_ends_the_run_unchanged_and_end_run_is_told(program):
    data, _, x = program
    m = Runtime.get().load_program(data).load_method("forward")
    first = min(i.index for i in m.instructions if i.kind != "VIEW")
    rec = Recorder(fail_at=first)
    m.observer = rec
    with pytest.raises(ValueError, match="observer failure"):
        m.execute(x)
    assert rec.calls == [("begin",), ("before", first), ("after", first), ("end", False)]


def test_a_traced_program_observes_its_methods_with_its_tracer(program):
    data, _, x = program
    p = Runtime.get().load_program(data, enable_etdump=True)
    m = p.load_method("forward")
    assert m.observer is p.tracer and isinstance(p.tracer, MethodObserver)
    m.execute(x)
    assert p.tracer.num_runs == 1
