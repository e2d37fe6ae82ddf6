"""Reading a lowered graph, where the reference's users import it from (``exir.backend.utils``):
``format_delegated_graph`` / ``print_delegated_graph`` show a graph module with each delegate's backend and the
partition it compiled, inline under the ``get_attr`` that holds it."""

from __future__ import annotations

import torch

from edgetorch.exir.backend.lowered import LoweredBackendModule

__all__ = ["format_delegated_graph", "print_delegated_graph"]


def _lines(graph: torch.fx.Graph, owner: torch.nn.Module, depth: int) -> list[str]:
    pad = "  " * depth
    out = []
    for node in graph.nodes:
        out.append(pad + node.format_node())
        held = getattr(owner, str(node.target), None) if node.op == "get_attr" else None
        if isinstance(held, LoweredBackendModule):
            out.append(f"{pad}    backend_id: {held.backend_id}")
            out.append(f"{pad}    lowered graph():")
            inner = held.original_module
            out += _lines(inner.graph, inner.graph_module, depth + 3)
    return out


def format_delegated_graph(graph_module: torch.fx.GraphModule) -> str:
    """The graph of ``graph_module`` as text (``graph():`` then one node per line), each delegate's
    ``get_attr`` followed by its ``backend_id`` and the partition's own graph (``lowered graph():``) indented
    under it; a nested delegate is expanded the same way."""
    if not isinstance(graph_module, torch.fx.GraphModule):
        raise TypeError(f"format_delegated_graph expects a torch.fx.GraphModule (exported_program().graph_module), "
                        f"got {type(graph_module).__name__}")
    return "\n".join(["graph():", *_lines(graph_module.graph, graph_module, 1)]) + "\n"


def print_delegated_graph(graph_module: torch.fx.GraphModule) -> None:
    """Prints ``format_delegated_graph(graph_module)``."""
    print(format_delegated_graph(graph_module))
