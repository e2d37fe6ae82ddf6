"""Delegation summaries where the reference's users import them from (``devtools.backend_debug``):
``get_delegation_info(graph_module)`` counts, per operator, the nodes that run inside delegates and outside, with
``DelegationBreakdown`` per operator as the reference reports it; ``print_delegation_info`` prints the summary and
the per-operator table.

The counts are ``exir.backend.get_delegation_info``'s: an operator is keyed by its ATen name (``"mm"``,
``"add.Tensor"``), where the reference keys it by node name without its numeric suffix (``"aten_mm_default"``), and
``getitem`` nodes (the unpacking of a multi-output call, no computation) are not counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from edgetorch.exir.backend.delegation_info import DelegationInfo
from edgetorch.exir.backend.delegation_info import get_delegation_info as _counts

__all__ = ["DelegationBreakdown", "DelegationInfo", "get_delegation_info", "print_delegation_info"]


@dataclass
class DelegationBreakdown:
    """How many nodes of operator ``op_type`` run inside delegates (``delegated``) and outside
    (``non_delegated``). Unpacks as ``(delegated, non_delegated)``."""

    op_type: str = ""
    delegated: int = 0
    non_delegated: int = 0

    def __iter__(self) -> Iterator[int]:
        return iter((self.delegated, self.non_delegated))


def get_delegation_info(graph_module: torch.fx.GraphModule) -> DelegationInfo:
    """The delegation summary of a lowered graph module (``edge.exported_program().graph_module``):
    ``num_delegated_subgraphs``, ``num_delegated_nodes``, ``num_non_delegated_nodes``, ``get_summary()``,
    ``get_operator_delegation_dataframe()``, and ``delegation_by_operator`` {op: ``DelegationBreakdown``}."""
    info = _counts(graph_module)
    info.delegation_by_operator = {op: DelegationBreakdown(op, d, n)
                                   for op, (d, n) in info.delegation_by_operator.items()}
    return info


def print_delegation_info(graph_module: torch.fx.GraphModule) -> None:
    """Prints the summary and the per-operator table (through ``tabulate`` when installed)."""
    info = get_delegation_info(graph_module)
    print(info.get_summary())
    df = info.get_operator_delegation_dataframe()
    try:
        from tabulate import tabulate
    except ImportError:
        print(df.to_string())
    else:
        print(tabulate(df, headers="keys", tablefmt="fancy_grid"))
