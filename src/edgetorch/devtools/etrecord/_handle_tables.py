"""The ETRecord's handle-group table: its current JSON form (``encode_groups`` / ``decode_groups``) and the
normalisation of the three older side tables (debug handle map, delegate map, delegate outputs) that in-memory
callers and earlier records still hand in (``groups_from_legacy``). Every function raises ``ValueError`` for a
malformed table; the reader turns it into an ``ETRecordFormatError`` naming the entry."""

from __future__ import annotations

import re
from typing import Any

from edgetorch.formats.handles import HandleGroup, groups_from_tables

__all__ = ["HANDLE_GROUPS_FORMAT", "decode_groups", "encode_groups", "groups_from_legacy", "norm_debug_handle_map",
           "norm_delegate_map", "norm_delegate_outputs"]

HANDLE_GROUPS_FORMAT = "edgetorch.handle_groups"


def _int_key(k: Any) -> int:
    if isinstance(k, int) and not isinstance(k, bool) and k >= 0:
        return k
    if isinstance(k, str) and re.fullmatch(r"0|[1-9][0-9]{0,17}", k):
        return int(k)
    raise ValueError(f"instruction id {k!r} is not a non-negative integer")


def _handle(h: Any) -> int:
    if isinstance(h, int) and not isinstance(h, bool):
        return h
    raise ValueError(f"debug handle {h!r} is not an integer")


def _handles(v: Any) -> int | list[int]:
    if isinstance(v, (list, tuple)):
        return [_handle(h) for h in v]
    return _handle(v)


def _per_method(m: Any, what: str) -> dict[str, Any]:
    if not isinstance(m, dict) or not all(isinstance(k, str) for k in m):
        raise ValueError(f"{what} must map method names to per-instruction maps")
    for k, v in m.items():
        if not isinstance(v, (dict, list) if what == "methods" else dict):
            raise ValueError(f"{what}[{k!r}] must be a map keyed by instruction id")
    return m


def norm_debug_handle_map(m: Any) -> dict[str, dict[int, int | list[int]]]:
    return {meth: {_int_key(i): _handles(v) for i, v in d.items()}
            for meth, d in _per_method(m, "debug_handle_map").items()}


def _delegate_id(k: Any) -> int | str:
    if isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool)):
        return k
    raise ValueError(f"delegate debug id {k!r} is neither an int nor a string")


def norm_delegate_entry(e: Any, pairs: bool = False) -> dict[str, Any]:
    if not isinstance(e, dict) or set(e) != {"name", "delegate_map"} or not isinstance(e["name"], str):
        raise ValueError("delegate entry must be {'name': backend id, 'delegate_map': ...}")
    dm = e["delegate_map"]
    if pairs:  # file form: [[id, [handles]], ...] keeps int ids ints
        if not isinstance(dm, list) or not all(isinstance(p, list) and len(p) == 2 for p in dm):
            raise ValueError("delegate_map must be a list of [delegate debug id, handles] pairs")
        items = [(p[0], p[1]) for p in dm]
    else:
        if not isinstance(dm, dict):
            raise ValueError("delegate_map must be a dict")
        items = list(dm.items())
    out: dict[int | str, list[int]] = {}
    for k, v in items:
        hs = _handles(v)
        out[_delegate_id(k)] = hs if isinstance(hs, list) else [hs]
    return {"name": e["name"], "delegate_map": out}


def _output_source(v: Any) -> list[int] | None:
    if v is None:
        return None
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in v) and v[1] >= 0:
        return [v[0], v[1]]
    raise ValueError(f"delegate output source {v!r} is neither null nor [debug handle, output index]")


def norm_delegate_outputs(m: Any) -> dict[str, dict[int, list[list[int] | None]]]:
    """``{method: {instruction id: [[debug handle, output index] | None per delegate output]}}``: the edge op
    (and which of its outputs) each output of a delegate call is."""
    def outs(v: Any) -> list[list[int] | None]:
        if not isinstance(v, (list, tuple)) or len(v) > 1_000_000:
            raise ValueError("delegate outputs must be a list")
        return [_output_source(x) for x in v]
    return {meth: {_int_key(i): outs(v) for i, v in d.items()}
            for meth, d in _per_method(m, "delegate_outputs").items()}


def norm_delegate_map(m: Any, pairs: bool = False) -> dict[str, dict[int, dict[str, Any]]]:
    return {meth: {_int_key(i): norm_delegate_entry(e, pairs) for i, e in d.items()}
            for meth, d in _per_method(m, "delegate_map").items()}


def groups_from_legacy(debug_handle_map: Any, delegate_map: Any = None, delegate_outputs: Any = None,
                       pairs: bool = False) -> dict[str, list[HandleGroup]] | None:
    """The handle groups of the old three tables (in memory, or as the files of earlier records with
    ``pairs``); None without a debug handle map. Raises ``ValueError`` for a malformed table."""
    if debug_handle_map is None:
        return None
    hmap = norm_debug_handle_map(debug_handle_map)
    dmap = {} if delegate_map is None else norm_delegate_map(delegate_map, pairs)
    outs = {} if delegate_outputs is None else norm_delegate_outputs(delegate_outputs)
    return {m: groups_from_tables(d, dmap.get(m), outs.get(m)) for m, d in hmap.items()}


def encode_groups(groups: dict[str, list[HandleGroup]]) -> dict[str, Any]:
    return {"format": HANDLE_GROUPS_FORMAT, "version": 1,
            "methods": {m: [g.to_json() for g in gs] for m, gs in groups.items()}}


def decode_groups(doc: Any) -> dict[str, list[HandleGroup]]:
    """The handle groups of a ``DEBUG_HANDLE_MAP`` entry in the current form; ``ValueError`` if malformed."""
    if set(doc) != {"format", "version", "methods"} or doc["version"] != 1:
        raise ValueError(f"must be {{format: {HANDLE_GROUPS_FORMAT!r}, version: 1, methods}}")
    methods = _per_method(doc["methods"], "methods") if isinstance(doc["methods"], dict) else None
    if methods is None:
        raise ValueError("methods must map method names to lists of handle groups")
    out: dict[str, list[HandleGroup]] = {}
    for m, rows in methods.items():
        if not isinstance(rows, list):
            raise ValueError(f"methods[{m!r}] must be a list of handle groups")
        out[m] = [HandleGroup.from_json(r) for r in rows]
    return out
