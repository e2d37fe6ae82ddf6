"""The edge verifier and compiler errors: each names the node, the op and the source line."""

from __future__ import annotations

import pytest
import torch

from edgetorch.errors import ExportError, UnsupportedOpError
from edgetorch.exir import to_edge


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


class Dynamic(torch.nn.Module):
    def forward(self, x):
        return x.relu() * 2


def test_buffer_mutation_is_accepted_and_counts_across_calls():
    from edgetorch.runtime import Runtime

    ep = torch.export.export(Counter(), (torch.randn(3),))
    method = Runtime.get().load_program(to_edge(ep).to_executorch().buffer).load_method("forward")
    x = torch.randn(3)
    assert [torch.equal(method.execute(x)[0], x + k) for k in (1, 2, 3)] == [True] * 3


def test_unbounded_dynamic_shapes_are_rejected_naming_node_and_dim():
    batch = torch.export.Dim("batch", min=2)
    ep = torch.export.export(Dynamic(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    with pytest.raises(UnsupportedOpError) as e:
        to_edge(ep)
    msg = str(e.value)
    assert "dynamic shape" in msg and "'x'" in msg and "no upper bound" in msg


def test_bounded_dynamic_shapes_are_accepted():
    batch = torch.export.Dim("batch", min=2, max=8)
    ep = torch.export.export(Dynamic(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    to_edge(ep)


def test_custom_op_the_runtime_cannot_resolve_is_named():
    lib = torch.library.Library("edgetorch_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")

    @torch.library.impl(lib, "twice", "CompositeExplicitAutograd")
    def twice(x):
        return x * 2

    @torch.library.register_fake("edgetorch_test::twice", lib=lib)
    def _(x):
        return torch.empty_like(x)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.edgetorch_test.twice(x) + 1

    ep = torch.export.export(M(), (torch.randn(3),))
    epm = to_edge(ep)  # a registered custom op passes the verifier: it has a functional kernel
    et = epm.to_executorch()
    from edgetorch.errors import OperatorNotAllowedError
    from edgetorch.runtime import Runtime
    from edgetorch.runtime.ops import register_operator, unregister_operator

    # the runtime runs an operator off its allow-list only once the user registered it (issue 23)
    with pytest.raises(OperatorNotAllowedError, match=r"instruction \d+ \(twice\) calls edgetorch_test::twice"):
        Runtime.get().load_program(et.buffer).load_method("forward")
    register_operator(torch.ops.edgetorch_test.twice.default)
    try:
        out = Runtime.get().load_program(et.buffer).load_method("forward").execute_structured(torch.ones(3))
    finally:
        unregister_operator(torch.ops.edgetorch_test.twice.default)
    assert torch.equal(out, torch.full((3,), 3.0))


def test_non_exported_program_input_is_rejected():
    with pytest.raises(ExportError, match="ExportedProgram"):
        to_edge(torch.nn.Linear(2, 2))
