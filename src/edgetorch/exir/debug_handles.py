"""Debug handles: one int per source op, kept in ``node.meta["custom"]["debug_handle"]``; the model of what a
runtime event covers (``HandleGroup``) is ``edgetorch.formats.handles``.

The key lives under ``meta["custom"]`` because torch.export copies that dict onto every node produced while
retracing, so all edge nodes decomposed from one ATen op share the handle, and it survives
``torch.export.save/load``.
"""

from __future__ import annotations

import operator
import os
import re

import torch
from torch.export import ExportedProgram

from edgetorch.formats.handles import parse_handle

__all__ = ["get_debug_handle", "set_debug_handle", "assign_debug_handles", "fill_missing_debug_handles",
           "source_frames", "source_location", "nodes_by_handle"]

_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>[^\n]+)\n(?P<code>[^\n]*)')


def get_debug_handle(node: torch.fx.Node) -> int | None:
    """The node's handle; None when it has none (``parse_handle``: never 0, never a bool)."""
    custom = node.meta.get("custom")
    return parse_handle(custom.get("debug_handle")) if isinstance(custom, dict) else None


def set_debug_handle(node: torch.fx.Node, handle: int) -> None:
    custom = node.meta.get("custom")
    custom = dict(custom) if isinstance(custom, dict) else {}
    custom["debug_handle"] = handle
    node.meta["custom"] = custom


def _op_nodes(gm: torch.fx.GraphModule):
    """The op nodes of ``gm``, then of its ``torch.cond`` branches (breadth first, as the reference numbers them)."""
    from edgetorch.exir.control_flow import control_flow_graphs
    for g in control_flow_graphs(gm):
        for node in g.graph.nodes:
            if node.op == "call_function" and node.target is not operator.getitem:
                yield node


def assign_debug_handles(ep: ExportedProgram) -> int:
    """Gives every op node of an ATen program a handle (dense, from 1, graph order); idempotent.

    Nodes that already carry a handle keep it. Returns the largest handle.
    """
    nodes = list(_op_nodes(ep.graph_module))
    top = max((get_debug_handle(n) or 0 for n in nodes), default=0)
    for n in nodes:
        if get_debug_handle(n) is None:
            top += 1
            set_debug_handle(n, top)
    return top


def fill_missing_debug_handles(gm: torch.fx.GraphModule) -> None:
    """Edge nodes created by passes (not derived from a source op) get fresh handles after the largest."""
    nodes = list(_op_nodes(gm))
    top = max((get_debug_handle(n) or 0 for n in nodes), default=0)
    for n in nodes:
        if get_debug_handle(n) is None:
            top += 1
            set_debug_handle(n, top)
    # getitem nodes share the handle of the multi-output node they read from
    from edgetorch.exir.control_flow import control_flow_graphs
    for node in (n for g in control_flow_graphs(gm) for n in g.graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem:
            src = node.args[0]
            if isinstance(src, torch.fx.Node) and get_debug_handle(src) is not None:
                set_debug_handle(node, get_debug_handle(src))


def source_frames(stack_trace: str | None) -> list[tuple[str, int, str, str]]:
    """Parses a node's stack trace into (file, line, function, code) frames, outermost first."""
    if not stack_trace:
        return []
    return [(m["file"], int(m["line"]), m["fn"].strip(), m["code"].strip()) for m in _FRAME_RE.finditer(stack_trace)]


def source_location(stack_trace: str | None) -> str:
    """The innermost frame of user code (outside torch) as ``file:line in fn: code``; "" if unknown."""
    frames = source_frames(stack_trace)
    if not frames:
        return ""
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    file, line, fn, code = (user or frames)[-1]
    return f"{file}:{line} in {fn}: {code}"


def nodes_by_handle(graph: torch.fx.Graph) -> dict[int, list[torch.fx.Node]]:
    """{debug handle: its op nodes in graph order} (``operator.getitem`` skipped): the one walk from handles to
    the nodes of a graph (then of its ``torch.cond`` branches), in first-appearance order of the handles."""
    from edgetorch.exir.control_flow import control_flow_graphs
    out: dict[int, list[torch.fx.Node]] = {}
    gm = graph.owning_module
    graphs = [g.graph for g in control_flow_graphs(gm)] if isinstance(gm, torch.fx.GraphModule) else [graph]
    for n in (n for g in graphs for n in g.nodes):
        if n.op == "call_function" and n.target is not operator.getitem:
            h = get_debug_handle(n)
            if h is not None:
                out.setdefault(h, []).append(n)
    return out
