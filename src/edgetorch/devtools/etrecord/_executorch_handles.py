"""Debug handles of a reference ETRecord's ATen program: as the reference does, each edge node's provenance chain
(``from_node``) names the ATen node it came from (the ancestor whose graph id is ``export_graph_id``), and that
node gets the edge node's handle (``propagate_handles``); ``aten_handle_bound`` bounds those handles from the
documents alone, before any graph is built."""

from __future__ import annotations

import json
from typing import Any

from edgetorch.formats.handles import parse_handle

_MAX_DEPTH = 200


def _ancestors(raw: Any, depth: int = 0) -> list[tuple[str, int]]:
    """(name, graph id) of every NodeSource on a ``from_node`` chain (a JSON string or a parsed list)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            return []
    out: list[tuple[str, int]] = []
    if not isinstance(raw, list) or depth > _MAX_DEPTH:
        return out
    for src in raw:
        if isinstance(src, dict):
            name, gid = src.get("name"), src.get("graph_id")
            if isinstance(name, str) and isinstance(gid, int):
                out.append((name, gid))
            out += _ancestors(src.get("from_node"), depth + 1)
    return out


def _split_outputs(n: Any, edge_nodes: int) -> bool:
    """An ATen node with several tensor outputs (``unbind``) that the edge program computes with several ops
    (one per output): its value is not the last of those ops' value, which is what the runtime's kernels of its
    handle leave; it gets no handle (the reference Inspector skips such rows; the gap reference is then the edge
    program, whose last op of the handle is what ran last)."""
    val = n.meta.get("val")
    return isinstance(val, (list, tuple)) and len(val) > 1 and edge_nodes > 1


def _by_ancestor(edge_meta: dict[str, Any]) -> dict[tuple[str, int], int]:
    """{(ATen node name, graph id): handle} of the edge nodes' ``from_node`` ancestors (the first handle wins)."""
    by_ancestor: dict[tuple[str, int], int] = {}
    for raw_h, chain in edge_meta.values():
        h = int(raw_h) if isinstance(raw_h, str) and raw_h.isdigit() and len(raw_h) < 12 else raw_h
        if parse_handle(h) is None:
            continue
        for anc in _ancestors(chain):
            by_ancestor.setdefault(anc, h)
    return by_ancestor


def _doc_names(x: Any, out: set[str], depth: int = 0) -> None:
    """Every ``name`` / ``as_name`` string of a program document's nodes (node names and output names: a superset
    of the names the deserialized graph's op and getitem nodes get)."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(x, list):
        for v in x:
            _doc_names(v, out, depth + 1)
    elif isinstance(x, dict):
        for k, v in x.items():
            if k in ("name", "as_name") and isinstance(v, str):
                out.add(v)
            else:
                _doc_names(v, out, depth + 1)


def _doc_multi_output(node: dict[str, Any]) -> bool:
    """Whether a document's node has several outputs (its deserialized ``val`` is a list of more than one)."""
    outs = node.get("outputs")
    if not isinstance(outs, list):
        return False
    if len(outs) > 1:
        return True
    one = outs[0] if outs and isinstance(outs[0], dict) else {}
    return isinstance(one.get("as_tensors"), list) and len(one["as_tensors"]) > 1


def aten_handle_bound(doc: dict[str, Any], edge_meta: dict[str, Any], graph_id: int | None,
                      edge_nodes: dict[int, int]) -> set[int]:
    """A superset of the handles ``propagate_handles`` gives the ATen program of document ``doc``, read from the
    documents alone (no deserialization): the handles of ancestors whose name occurs in the document, less those
    of multi-output nodes that ``_split_outputs`` leaves without one."""
    names: set[str] = set()
    nodes = doc.get("graph_module", {}).get("graph", {}).get("nodes")
    _doc_names(nodes, names)
    by_name = {x["name"]: x for x in nodes or [] if isinstance(x, dict) and isinstance(x.get("name"), str)}
    bound: set[int] = set()
    for (name, gid), h in _by_ancestor(edge_meta).items():
        if (graph_id is not None and gid != graph_id) or name not in names:
            continue
        node = by_name.get(name)
        if node is not None and edge_nodes.get(h, 1) > 1 and _doc_multi_output(node):
            continue  # _split_outputs: no handle (a getitem of it may still carry one, under its own name)
        bound.add(h)
    return bound


def propagate_handles(aten: Any, edge_meta: dict[str, Any], graph_id: int | None,
                      edge_nodes: dict[int, int] | None = None) -> int:
    """Gives each ATen node the handle of the edge nodes descending from it (see the module docstring; ``edge_nodes``:
    {handle: how many edge op nodes carry it}); returns how many ATen nodes got one."""
    from edgetorch.exir.debug_handles import set_debug_handle

    by_ancestor = _by_ancestor(edge_meta)
    n_set = 0
    for n in aten.graph.nodes:
        if n.op != "call_function":
            continue
        h = by_ancestor.get((n.name, graph_id)) if graph_id is not None else None
        if h is None and graph_id is None:
            h = next((v for (name, _gid), v in by_ancestor.items() if name == n.name), None)
        if h is not None and not _split_outputs(n, (edge_nodes or {}).get(h, 1)):
            set_debug_handle(n, h)
            n_set += 1
    return n_set
