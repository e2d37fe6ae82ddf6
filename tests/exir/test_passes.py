"""EdgeProgramManager.transform: passes edit a copy, new nodes get handles, the result runs."""

from __future__ import annotations

import pytest
import torch

from edgetorch.errors import ExportError
from edgetorch.exir import to_edge
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.runtime import Runtime


class M(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 3


def relu_to_clamp(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    for n in gm.graph.nodes:
        if n.target == torch.ops.aten.relu.default:
            with gm.graph.inserting_before(n):
                c = gm.graph.call_function(torch.ops.aten.clamp.default, (n.args[0], 0.0))
            c.meta = dict(n.meta)
            n.replace_all_uses_with(c)
            gm.graph.erase_node(n)
    return gm


def add_zero(gm: torch.fx.GraphModule) -> None:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    src = out.args[0][0]
    with gm.graph.inserting_before(out):
        z = gm.graph.call_function(torch.ops.aten.add.Scalar, (src, 0.0))
    z.meta["val"] = src.meta["val"]
    out.args = ((z,),)


def test_transform_edits_a_copy_and_runs():
    x = torch.randn(5)
    epm = to_edge(torch.export.export(M(), (x,)), generate_etrecord=True)
    before = [n.target for n in epm.exported_program().graph.nodes]
    new = epm.transform([relu_to_clamp, add_zero])
    assert [n.target for n in epm.exported_program().graph.nodes] == before
    targets = [n.target for n in new.exported_program().graph.nodes]
    assert torch.ops.aten.clamp.default in targets and torch.ops.aten.relu.default not in targets
    added = next(n for n in new.exported_program().graph.nodes if n.target == torch.ops.aten.add.Scalar)
    assert get_debug_handle(added) > max(get_debug_handle(n) or 0 for n in epm.exported_program().graph.nodes)
    out = Runtime.get().load_program(new.to_executorch().buffer).load_method("forward").execute_structured(x)
    torch.testing.assert_close(out, M()(x))


def test_failing_pass_names_itself():
    def broken(gm):
        raise RuntimeError("boom")

    epm = to_edge(torch.export.export(M(), (torch.randn(3),)))
    with pytest.raises(ExportError, match="pass broken failed"):
        epm.transform([broken])
