"""``torch.empty*`` in a model: the program names the allocation, the runtime zero-fills its planned slot instead of
running it (formats.operators.ZERO_FILLED_ALLOCATIONS), so the outputs equal eager wherever eager defines them and
no unwritten arena byte ever reaches an output."""

from __future__ import annotations

import torch

from edgetorch.exir import to_edge
from edgetorch.runtime import Runtime


class FilledLater(torch.nn.Module):
    """MoE- and Swin-style: an ``empty_like`` filled by ``copy_``, a ``new_empty`` written row by row."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.empty_like(x)
        y.copy_(x * 2)
        z = x.new_empty((2, 4))
        z[0] = 1.0
        z[1] = x[0]
        return y + 1, z


class Unwritten(torch.nn.Module):
    """Returns an allocation nobody writes, after a large temporary that leaves bytes in the arena."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        big = (x * 3.0 + 7.0).exp()
        return big.sum().reshape(1), torch.empty(64, 4)


def _method(model: torch.nn.Module, x: torch.Tensor):
    program = to_edge(torch.export.export(model, (x,))).to_executorch()
    names = {str(n.target) for n in program.exported_program().graph.nodes if n.op == "call_function"}
    assert any("empty" in n for n in names), names  # the program does name the allocation
    return Runtime.get().load_program(program.buffer).load_method("forward")


def test_allocations_filled_later_run_and_equal_eager():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    method = _method(FilledLater(), x)
    for sample in (x, torch.randn(2, 4)):
        got = method.execute(sample)
        want = FilledLater()(sample)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


def test_an_unwritten_allocation_reads_as_zeros_never_as_arena_bytes():
    x = torch.randn(64, 4)
    method = _method(Unwritten(), x)
    for sample in (x, torch.randn(64, 4) * 5):
        total, unwritten = method.execute(sample)
        torch.testing.assert_close(total, (sample * 3.0 + 7.0).exp().sum().reshape(1))
        assert unwritten.shape == (64, 4) and torch.count_nonzero(unwritten) == 0
