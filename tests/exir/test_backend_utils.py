"""``exir.backend.utils.format_delegated_graph`` / ``print_delegated_graph`` (issue 26): every node of the lowered
graph, and under each delegate its backend and every node of the partition it compiled."""

from __future__ import annotations

import pytest
import torch

from edgetorch.exir import to_edge
from edgetorch.exir.backend import LoweredBackendModule
from edgetorch.exir.backend.utils import format_delegated_graph, print_delegated_graph
from tests.exir.nested_backend import ADD_MUL, NAME, OpTypePartitioner


class _M(torch.nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(torch.relu(x + y) * y) - x


def test_each_delegate_is_expanded_under_its_get_attr(capsys):
    edge = to_edge(torch.export.export(_M(), (torch.randn(3), torch.randn(3)))).to_backend(
        OpTypePartitioner(ADD_MUL))
    gm = edge.exported_program().graph_module
    text = format_delegated_graph(gm)
    lines = text.splitlines()
    assert lines[0] == "graph():"
    lowered = [(n, getattr(gm, n.target)) for n in gm.graph.nodes if n.op == "get_attr"
               and isinstance(getattr(gm, n.target), LoweredBackendModule)]
    assert lowered
    for node, module in lowered:
        at = lines.index("  " + node.format_node())
        assert lines[at + 1] == f"      backend_id: {NAME}" and lines[at + 2] == "      lowered graph():"
        inner = [ln.strip() for ln in lines[at + 3:at + 3 + len(module.original_module.graph.nodes)]]
        assert inner == [n.format_node() for n in module.original_module.graph.nodes]
        assert any("aten.relu" in ln for ln in inner)
    top = [ln for ln in lines[1:] if ln.startswith("  %") or ln.startswith("  return")]
    assert top == ["  " + n.format_node() for n in gm.graph.nodes]
    print_delegated_graph(gm)
    assert capsys.readouterr().out == text + "\n"
    with pytest.raises(TypeError, match="GraphModule"):
        format_delegated_graph(edge.exported_program())
