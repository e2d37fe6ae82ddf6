"""Delegation summary: how many ops of each type run inside delegates vs on the portable backend."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import pandas as pd
import torch

from edgetorch.exir.backend.lowered import is_delegate_call, lowered_module_of

__all__ = ["DelegationInfo", "get_delegation_info"]

_SKIP = {operator.getitem}


def _op_name(node: torch.fx.Node) -> str:
    t = node.target
    return t._schema.name.split("::")[-1] + ("" if t._overloadname == "default" else f".{t._overloadname}") \
        if isinstance(t, torch._ops.OpOverload) else str(t)


@dataclass
class DelegationInfo:
    num_delegated_subgraphs: int
    num_delegated_nodes: int
    num_non_delegated_nodes: int
    delegation_by_operator: dict[str, tuple[int, int]]  # op -> (delegated, non-delegated)

    def get_summary(self) -> str:
        return (f"Total delegated subgraphs: {self.num_delegated_subgraphs}\n"
                f"Number of delegated nodes: {self.num_delegated_nodes}\n"
                f"Number of non-delegated nodes: {self.num_non_delegated_nodes}\n")

    def get_operator_delegation_dataframe(self) -> pd.DataFrame:
        rows = [{"op_type": op, "occurrences_in_delegated_graphs": d, "occurrences_in_non_delegated_graphs": n}
                for op, (d, n) in sorted(self.delegation_by_operator.items())]
        df = pd.DataFrame(rows, columns=["op_type", "occurrences_in_delegated_graphs",
                                         "occurrences_in_non_delegated_graphs"])
        total = pd.DataFrame([{"op_type": "Total", "occurrences_in_delegated_graphs": self.num_delegated_nodes,
                               "occurrences_in_non_delegated_graphs": self.num_non_delegated_nodes}])
        return pd.concat([df, total], ignore_index=True)


def get_delegation_info(graph_module: torch.fx.GraphModule) -> DelegationInfo:
    """Counts ops per type inside delegate calls (the original partitions of the ``lowered_module_*`` submodules
    they call) and outside."""
    by_op: dict[str, list[int]] = {}
    subgraphs = delegated = non_delegated = 0
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target in _SKIP:
            continue
        if is_delegate_call(node):
            subgraphs += 1
            lowered = lowered_module_of(node, graph_module)
            for inner in lowered.original_module.graph.nodes:
                if inner.op == "call_function" and inner.target not in _SKIP:
                    by_op.setdefault(_op_name(inner), [0, 0])[0] += 1
                    delegated += 1
        else:
            by_op.setdefault(_op_name(node), [0, 0])[1] += 1
            non_delegated += 1
    return DelegationInfo(subgraphs, delegated, non_delegated, {k: (v[0], v[1]) for k, v in by_op.items()})
