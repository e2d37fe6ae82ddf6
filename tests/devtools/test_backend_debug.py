"""``devtools.backend_debug`` (issue 26), the reference's import path of the delegation summary: per-operator
``DelegationBreakdown`` counts checked against the graph's own nodes."""

from __future__ import annotations

import operator

import torch

from edgetorch.devtools.backend_debug import DelegationBreakdown, get_delegation_info, print_delegation_info
from edgetorch.exir import to_edge
from edgetorch.exir.backend import LoweredBackendModule
from tests.exir.nested_backend import ADD_MUL, OpTypePartitioner


class _M(torch.nn.Module):
    def forward(self, a, x, b):
        z = torch.mm(a, x) + b
        a = z - a
        return torch.relu(torch.mm(a, x) * b)


def test_counts_per_operator_match_the_graph(capsys):
    inputs = (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2))
    edge = to_edge(torch.export.export(_M(), inputs)).to_backend(OpTypePartitioner(ADD_MUL))
    gm = edge.exported_program().graph_module
    info = get_delegation_info(gm)
    lowered = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"
               and isinstance(getattr(gm, n.target), LoweredBackendModule)]
    inside = [n for m in lowered for n in m.original_module.graph.nodes
              if n.op == "call_function" and n.target is not operator.getitem]
    outside = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
               and "delegate" not in str(n.target)]
    assert info.num_delegated_subgraphs == len(lowered) >= 2
    assert (info.num_delegated_nodes, info.num_non_delegated_nodes) == (len(inside), len(outside))
    assert info.delegation_by_operator["mm"] == DelegationBreakdown("mm", 0, 2)
    assert info.delegation_by_operator["relu"] == DelegationBreakdown("relu", 1, 0)
    assert sum(b.delegated for b in info.delegation_by_operator.values()) == len(inside)
    df = info.get_operator_delegation_dataframe()
    assert df.iloc[-1].tolist() == ["Total", len(inside), len(outside)]
    print_delegation_info(gm)
    out = capsys.readouterr().out
    assert "Total delegated subgraphs: " in out and "relu" in out
