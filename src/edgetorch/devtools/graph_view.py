"""The edge graph of one method as a small, drawable DAG: what the HTML report and the Model Explorer export show.

``extract_graph(etrecord, method)`` reads the ETRecord's edge program (before lowering; the compact reference
graph, so no program is deserialized) and returns an ``EdgeGraph``: user inputs, one node per op, the outputs.
Parameters and constants (``get_attr``) are left out, ``operator.getitem`` is folded into the op it reads from.
By default ops that share a debug handle (the edge ops one ATen op decomposed into) are merged into one node, so
the graph has one node per debug handle, which is the unit the gap table and the runtime's events speak of.

Each node carries its debug handle, the delegate partition that runs it (from the ETRecord's ``delegate_map`` and
``debug_handle_map``: the handles each ``DELEGATE_CALL`` instruction covers), its module path and its source
line. ``layout(graph)`` places the nodes in layers (longest path from the inputs, then a few barycentric sweeps
to reduce crossings) and splits a long graph into pages at module boundaries, so a ViT-B/16 stays drawable.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgetorch.errors import EdgeTorchError

if TYPE_CHECKING:  # torch is imported where a graph module is read: the report imports this module without it
    import torch.fx

__all__ = ["GraphViewError", "GraphNode", "Partition", "EdgeGraph", "partitions_of", "graph_from_module",
           "extract_graph", "Placed", "Layout", "paginate", "layout", "rows_for_nodes"]


class GraphViewError(EdgeTorchError, ValueError):
    """The ETRecord has no edge graph for the method, or a layout argument is out of range."""


@dataclass
class GraphNode:
    """One node of the drawable graph. ``kind`` is ``"op"``, ``"input"`` or ``"output"``; ``op`` the short
    operator name(s) (``"convolution"``, ``"view, permute"``); ``names`` the edge program's node names."""

    id: str
    op: str
    kind: str = "op"
    names: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    debug_handle: int | None = None
    partition: str | None = None
    module: str = ""
    source: str = ""
    stack_trace: str = ""


@dataclass
class Partition:
    """One delegate call: the backend, the instruction id of its ``DELEGATE_CALL`` and the handles it runs."""

    id: str
    backend: str
    instruction_id: int
    handles: list[int]


@dataclass
class EdgeGraph:
    """Nodes in topological (program) order; ``partitions`` by id."""

    method: str
    nodes: list[GraphNode]
    partitions: dict[str, Partition] = field(default_factory=dict)

    def by_id(self) -> dict[str, GraphNode]:
        return {n.id: n for n in self.nodes}

    def by_handle(self) -> dict[int, GraphNode]:
        return {n.debug_handle: n for n in self.nodes if n.debug_handle is not None}


def _short_op(node: torch.fx.Node) -> str:
    t = node.target
    name = getattr(t, "__name__", None) or str(t)
    schema = getattr(t, "_schema", None)
    if schema is not None:
        name = schema.name.split("::", 1)[-1]
    return name


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1]
    return str(path[0] if isinstance(path, (tuple, list)) else path)


def partitions_of(etrecord: Any, method: str) -> dict[str, Partition]:
    """The delegate partitions of ``method``: one per ``DELEGATE_CALL`` instruction of the ETRecord."""
    calls = (getattr(etrecord, "delegate_map", None) or {}).get(method) or {}
    handle_map = (getattr(etrecord, "debug_handle_map", None) or {}).get(method) or {}
    out: dict[str, Partition] = {}
    for iid, info in sorted(calls.items()):
        handles = handle_map.get(iid, [])
        handles = [handles] if isinstance(handles, int) else [int(h) for h in handles]
        backend = str((info or {}).get("name", "delegate"))
        pid = f"{backend} #{iid}"
        out[pid] = Partition(pid, backend, int(iid), handles)
    return out


def _edge_module(etrecord: Any, method: str) -> torch.fx.GraphModule:
    gm = None
    view = getattr(etrecord, "edge_reference_graph", None)
    if callable(view):
        gm = view(method)
    if gm is None:
        ep = (getattr(etrecord, "edge_programs", None) or {}).get(method)
        gm = ep.graph_module if ep is not None else None
    if gm is None:
        raise GraphViewError(f"the ETRecord holds no edge program for method '{method}'")
    return gm


def graph_from_module(gm: torch.fx.GraphModule, method: str = "forward",
                      partitions: dict[str, Partition] | None = None, group_by_handle: bool = True) -> EdgeGraph:
    """The drawable graph of an FX graph module (see the module docstring)."""
    import torch.fx

    partitions = partitions or {}
    part_of = {h: p.id for p in partitions.values() for h in p.handles}
    alias: dict[str, str | None] = {}  # fx node name -> graph node id (None: left out)
    nodes: dict[str, GraphNode] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            alias[n.name] = None
        elif n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node):
            alias[n.name] = alias.get(n.args[0].name)
        elif n.op in ("placeholder", "output", "call_function"):
            alias[n.name] = _add_node(n, nodes, alias, part_of, group_by_handle)
    return EdgeGraph(method, list(nodes.values()), dict(partitions))


def _add_node(n: torch.fx.Node, nodes: dict[str, GraphNode], alias: dict[str, str | None],
              part_of: dict[int, str], group_by_handle: bool) -> str:
    from edgetorch.exir.debug_handles import get_debug_handle, source_location

    inputs = [alias.get(a.name) for a in n.all_input_nodes]
    if n.op == "placeholder":
        node = GraphNode(n.name, n.name, kind="input", names=[n.name])  # labelled with the input's name
    elif n.op == "output":
        node = GraphNode("output", "output", kind="output", names=[n.name])
    else:
        h = get_debug_handle(n)
        h = h if h else None
        nid = f"h{h}" if (h is not None and group_by_handle) else n.name
        node = nodes.get(nid)
        if node is not None:  # another edge op of the same handle
            node.names.append(n.name)
            if _short_op(n) not in node.op.split(", "):
                node.op += ", " + _short_op(n)
            node.inputs += [i for i in inputs if i and i != nid and i not in node.inputs]
            return nid
        trace = n.meta.get("stack_trace") or ""
        node = GraphNode(nid, _short_op(n), names=[n.name], debug_handle=h,
                         partition=part_of.get(h) if h is not None else None, module=_module_path(n),
                         source=source_location(trace), stack_trace=trace)
    node.inputs = list(dict.fromkeys(i for i in inputs if i and i != node.id))
    nodes[node.id] = node
    return node.id


def extract_graph(etrecord: Any, method: str = "forward", group_by_handle: bool = True) -> EdgeGraph:
    """The edge graph of ``method`` from an ``ETRecord`` (object, or anything with ``edge_reference_graph`` /
    ``edge_programs``, ``delegate_map`` and ``debug_handle_map``)."""
    gm = _edge_module(etrecord, method)
    return graph_from_module(gm, method, partitions_of(etrecord, method), group_by_handle)


# -- layout -------------------------------------------------------------------------------------------------

@dataclass
class Placed:
    """A node's position on its page: layer (row) and slot (column) from the top left."""

    id: str
    page: int
    layer: int
    slot: int


@dataclass
class Layout:
    """Pages of placed nodes; ``pages[k]`` lists node ids in order, ``placed`` maps an id to its position."""

    pages: list[list[str]]
    placed: dict[str, Placed]
    widths: list[int]   # slots of the widest layer, per page
    heights: list[int]  # layers, per page
    row_len: dict[tuple[int, int], int] = field(default_factory=dict)  # (page, layer) -> nodes in that layer


def _common_prefix(a: str, b: str) -> int:
    pa, pb = a.split("."), b.split(".")
    k = 0
    while k < min(len(pa), len(pb)) and pa[k] == pb[k] and pa[k]:
        k += 1
    return k


def paginate(graph: EdgeGraph, max_nodes: int = 90) -> list[list[str]]:
    """Splits the nodes (in program order) into pages of at most ``max_nodes``, cutting where consecutive nodes
    share the shortest module-path prefix (between transformer blocks, say), nearest to 2/3 of the maximum."""
    if max_nodes < 2:
        raise GraphViewError(f"max_nodes must be >= 2, got {max_nodes}")
    ids = [n.id for n in graph.nodes]
    mods = [n.module for n in graph.nodes]
    pages: list[list[str]] = []
    start = 0
    while len(ids) - start > max_nodes:
        lo, hi, target = start + max_nodes // 3, start + max_nodes, start + (2 * max_nodes) // 3
        cut = min(range(lo, hi + 1), key=lambda i: (_common_prefix(mods[i - 1], mods[i]), abs(i - target)))
        pages.append(ids[start:cut])
        start = cut
    pages.append(ids[start:])
    return [p for p in pages if p]


def _layers(page: list[str], preds: dict[str, list[str]]) -> dict[str, int]:
    on_page = {nid: i for i, nid in enumerate(page)}
    layer: dict[str, int] = {}
    for nid in page:
        ins = [layer[p] for p in preds.get(nid, []) if p in on_page and on_page[p] < on_page[nid]]
        layer[nid] = max(ins, default=-1) + 1
    return layer


def _order(rows: list[list[str]], preds: dict[str, list[str]], succs: dict[str, list[str]], sweeps: int = 4
           ) -> None:
    """Barycentric ordering: each layer sorted by the mean slot of its neighbours in the previous (down) or
    next (up) layer; reduces crossings, in place."""
    for s in range(sweeps):
        down = s % 2 == 0
        seq = range(1, len(rows)) if down else range(len(rows) - 2, -1, -1)
        for k in seq:
            ref = {nid: i for i, nid in enumerate(rows[k - 1 if down else k + 1])}
            nbrs = preds if down else succs

            def key(nid: str, i: int, ref: dict[str, int] = ref, nbrs: dict[str, list[str]] = nbrs) -> float:
                xs = [ref[p] for p in nbrs.get(nid, []) if p in ref]
                return sum(xs) / len(xs) if xs else float(i)

            rows[k] = [nid for _, nid in sorted(((key(nid, i), i), nid) for i, nid in enumerate(rows[k]))]


def layout(graph: EdgeGraph, max_nodes: int = 90) -> Layout:
    """Pages (``paginate``), then per page a layered layout (see the module docstring)."""
    preds = {n.id: n.inputs for n in graph.nodes}
    succs: dict[str, list[str]] = {}
    for n in graph.nodes:
        for p in n.inputs:
            succs.setdefault(p, []).append(n.id)
    pages = paginate(graph, max_nodes)
    placed: dict[str, Placed] = {}
    row_len: dict[tuple[int, int], int] = {}
    widths, heights = [], []
    for k, page in enumerate(pages):
        layer = _layers(page, preds)
        rows: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
        for nid in page:
            rows[layer[nid]].append(nid)
        _order(rows, preds, succs)
        for li, row in enumerate(rows):
            row_len[(k, li)] = len(row)
            for si, nid in enumerate(row):
                placed[nid] = Placed(nid, k, li, si)
        widths.append(max((len(r) for r in rows), default=0))
        heights.append(len(rows))
    return Layout(pages, placed, widths, heights, row_len)


def rows_for_nodes(graph: EdgeGraph, handle_groups: Iterable[tuple[int, tuple[int, ...], int | None]]
                   ) -> tuple[dict[str, int], dict[str, int]]:
    """Links gap-table rows to graph nodes: ``handle_groups`` yields ``(row index, aot_debug_handle tuple,
    instruction id of the row when it is a DELEGATE_CALL row else None)``. A row belongs to the node of its
    group's last handle (the op whose output it compares); a ``DELEGATE_CALL`` row to its partition. When several
    rows name the same node, the one with the smallest group (the finest) wins. Returns
    ``({node id: row}, {partition id: row})``."""
    by_handle = graph.by_handle()
    part_by_call = {p.instruction_id: p.id for p in graph.partitions.values()}
    node_row: dict[str, tuple[int, int]] = {}
    part_row: dict[str, int] = {}
    for row, group, call in handle_groups:
        if call is not None:
            pid = part_by_call.get(call)
            if pid is not None and pid not in part_row:
                part_row[pid] = row
            continue
        node = by_handle.get(group[-1]) if group else None
        if node is None:
            continue
        best = node_row.get(node.id)
        if best is None or len(group) < best[1]:
            node_row[node.id] = (row, len(group))
    return {k: v[0] for k, v in node_row.items()}, part_row
