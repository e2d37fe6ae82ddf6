"""Passes written the way the reference's docs write them (issue 26): ``exir_ops.edge`` names edge operators,
an ``ExportPass`` subclass overrides ``call_operator`` and ``EdgeProgramManager.transform`` runs it; the program
then computes what eager PyTorch computes for the rewritten model, and the rewritten nodes keep their debug
handles."""

from __future__ import annotations

import torch

from edgetorch.exir import to_edge
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.exir.dialects._ops import ops as exir_ops
from edgetorch.exir.pass_base import ExportPass, PassResult
from edgetorch.runtime import Runtime


class M(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y) * 2.0


class ReplaceAddWithMul(ExportPass):
    def call_operator(self, op, args, kwargs, meta):
        if op != exir_ops.edge.aten.add.Tensor:
            return super().call_operator(op, args, kwargs, meta)
        return super().call_operator(exir_ops.edge.aten.mul.Tensor, args, kwargs, meta)


class AddAsSubOfNeg(ExportPass):
    """x + y emitted as two ops: x - (-y)."""

    def call_operator(self, op, args, kwargs, meta):
        if op != exir_ops.edge.aten.add.Tensor:
            return super().call_operator(op, args, kwargs, meta)
        x, y = args[:2]
        neg = super().call_operator(exir_ops.edge.aten.neg.default, (y,), {}, meta)
        return super().call_operator(exir_ops.edge.aten.sub.Tensor, (x, neg), {}, meta)


def _run(edge, *inputs):
    et = edge.to_executorch()
    return Runtime.get().load_program(et.buffer).load_method("forward").execute(*inputs)[0]


def test_exir_ops_edge_names_the_edge_programs_operators():
    assert exir_ops.edge.aten.add.Tensor is torch.ops.aten.add.Tensor
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    edge = to_edge(torch.export.export(M(), (x, y)))
    targets = {n.target for n in edge.exported_program().graph.nodes if n.op == "call_function"}
    assert exir_ops.edge.aten.add.Tensor in targets


def test_replace_op_pass_runs_and_keeps_handles():
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    edge = to_edge(torch.export.export(M(), (x, y)))
    add = next(n for n in edge.exported_program().graph.nodes if n.target is torch.ops.aten.add.Tensor)
    handle = get_debug_handle(add)
    new = edge.transform([ReplaceAddWithMul()])
    nodes = [n for n in new.exported_program().graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.add.Tensor not in {n.target for n in nodes}
    mul = next(n for n in nodes if n.target is torch.ops.aten.mul.Tensor and get_debug_handle(n) == handle)
    assert mul.meta["val"].shape == (3, 4)
    torch.testing.assert_close(_run(new, x, y), torch.relu(x * y) * 2.0)
    # the original manager is unchanged
    torch.testing.assert_close(_run(edge, x, y), torch.relu(x + y) * 2.0)


def test_composed_ops_and_pass_result():
    torch.manual_seed(1)
    x, y = torch.randn(2, 5), torch.randn(2, 5)
    gm = torch.export.export(M(), (x, y)).module()
    res = AddAsSubOfNeg()(gm)
    assert isinstance(res, PassResult) and res.modified and res.graph_module is gm
    edge = to_edge(torch.export.export(M(), (x, y))).transform([AddAsSubOfNeg()])
    targets = [n.target for n in edge.exported_program().graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.neg.default in targets and torch.ops.aten.sub.Tensor in targets
    torch.testing.assert_close(_run(edge, x, y), torch.relu(x - (-y)) * 2.0)
    assert not ExportPass()(torch.export.export(M(), (x, y)).module()).modified
