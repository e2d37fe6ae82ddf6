"""The debug tables of an onnxruntime delegate blob: their compact stored form (container version 3) and the
checks every version's tables pass before the runtime or the Inspector reads them.

The tables (``build_debug_tables``): ``groups`` (``[delegate debug id, [ONNX value names]]`` in execution order),
``values`` (id -> edge debug handles), ``intermediates`` (every value a debug run exposes: the groups' names, in
order), ``nodes`` (ONNX node name -> handles, the ids of per-op profile events), ``shapes`` (exposed value ->
``{dtype, shape}``) and ``stats`` (export counters). Versions 1 and 2 store them as header JSON as they are.

Version 3 stores one document, ``{"groups": [[id, [names], [handles]], ...], "nodes": {...}, "shapes": {...},
"stats": {...}}`` (``values`` and ``intermediates`` are derived from ``groups``), as compact JSON compressed with
zlib (``ENCODING``), in the blob's payload; the header names its ``raw_nbytes``. ``inflate`` refuses a declared
size above ``MAX_RAW_BYTES`` before inflating anything and stops inflating one byte past the declared size, so a
decompression bomb costs at most ``raw_nbytes + 1`` bytes of memory. Every failure is a ``DebugTableError``
naming the field (``debug_tables.groups[3]``, ``debug_tables.raw_nbytes``, ...).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from edgetorch.errors import ExportError, FormatError

__all__ = ["KEYS", "ENCODING", "MAX_RAW_BYTES", "DebugTableError", "encode", "inflate", "expand", "check"]

#: the header keys of the debug tables (version 1 and 2 header JSON; version 3 decoded)
KEYS = ("values", "groups", "nodes", "intermediates", "shapes", "stats")
#: the only encoding of a version-3 ``debug_tables`` section
ENCODING = "zlib+json/1"
#: the largest decoded document accepted (a model of 10^5 ONNX nodes needs a few MiB)
MAX_RAW_BYTES = 64 << 20
#: the longest value/node name or dim expression accepted
_MAX_NAME = 4096
_FIELD = "debug_tables"


class DebugTableError(FormatError):
    """A debug table of an onnxruntime delegate blob is malformed; ``field`` names it (``debug_tables.<table>``)."""


def _fail(message: str, where: str = "") -> DebugTableError:
    """The error of ``where`` (a table and its row or key); the message starts with the field it names."""
    field = f"{_FIELD}.{where}" if where else _FIELD
    return DebugTableError(f"{field}: {message}", field=field)


def encode(tables: dict[str, Any]) -> tuple[bytes, int]:
    """(zlib-compressed compact document, its decoded size) of the tables (``KEYS`` of a header). Raises
    ``ExportError`` if ``values`` or ``intermediates`` are not the ones ``groups`` implies (the stored form
    keeps only ``groups``: it would lose them)."""
    groups = [(str(g[0]), [str(v) for v in g[1]]) for g in tables.get("groups", [])]
    values = {str(k): v for k, v in tables.get("values", {}).items()}
    if set(values) != {gid for gid, _ in groups} or len(values) != len(groups):
        raise ExportError("onnxruntime: the debug table 'values' does not map exactly the ids of 'groups'")
    if list(tables.get("intermediates", [])) != [v for _, names in groups for v in names]:
        raise ExportError("onnxruntime: the debug table 'intermediates' is not the values of 'groups' in order")
    doc = {"groups": [[gid, names, [int(h) for h in values[gid]]] for gid, names in groups],
           "nodes": {str(k): [int(h) for h in v] for k, v in tables.get("nodes", {}).items()},
           "shapes": tables.get("shapes") or {}, "stats": tables.get("stats") or {}}
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return zlib.compress(raw, 9), len(raw)


def inflate(data: memoryview | bytes, raw_nbytes: Any) -> dict[str, Any]:
    """The compact document of a version-3 section (``data``: its compressed bytes), checked and expanded to
    the ``KEYS`` tables. At most ``raw_nbytes + 1`` bytes are ever inflated."""
    if not isinstance(raw_nbytes, int) or isinstance(raw_nbytes, bool) or not 0 <= raw_nbytes <= MAX_RAW_BYTES:
        raise _fail(f"declared decoded size {raw_nbytes!r} is not an int in [0, {MAX_RAW_BYTES}]", "raw_nbytes")
    d = zlib.decompressobj()
    try:
        raw = d.decompress(data, raw_nbytes + 1)
    except zlib.error as e:
        raise _fail(f"the compressed debug tables are corrupted: {e}") from None
    if len(raw) > raw_nbytes:
        raise _fail(f"the compressed debug tables inflate past their declared {raw_nbytes} bytes (refused "
                    "before inflating the rest)", "raw_nbytes")
    if not d.eof or d.unused_data or len(raw) != raw_nbytes:
        raise _fail(f"the compressed debug tables inflate to {len(raw)} bytes"
                    f"{'' if d.eof else ', the stream is truncated'}{', with trailing bytes' if d.unused_data else ''}"
                    f" (declared {raw_nbytes})", "raw_nbytes")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise _fail(f"the debug tables are not valid JSON: {e}") from None
    return expand(doc)


def expand(doc: Any) -> dict[str, Any]:
    """The ``KEYS`` tables of a compact document (checked)."""
    if not isinstance(doc, dict) or set(doc) != {"groups", "nodes", "shapes", "stats"}:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise _fail(f"the debug tables document has keys {got}, expected groups, nodes, shapes, stats")
    rows = doc["groups"]
    if not isinstance(rows, list):
        raise _fail(f"'groups' is a {type(rows).__name__}, not a list", "groups")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 3:
            raise _fail("not [id, [value names], [handles]]", f"groups[{i}]")
    tables = {"groups": [[r[0], r[1]] for r in rows], "values": {}, "nodes": doc["nodes"], "shapes": doc["shapes"],
              "stats": doc["stats"]}
    for i, (gid, names, hs) in enumerate(rows):
        _names(names, f"groups[{i}]")
        tables["values"][gid if isinstance(gid, str) else repr(gid)] = _handles(hs, f"groups[{i}]")
    tables["intermediates"] = [v for r in rows for v in r[1]]
    check(tables)
    return tables


def check(tables: dict[str, Any]) -> None:
    """Checks the tables present in ``tables`` (any version) and their agreement; raises ``DebugTableError``."""
    groups = tables.get("groups", [])
    if not isinstance(groups, list):
        raise _fail(f"'groups' is a {type(groups).__name__}, not a list", "groups")
    ids: set[str] = set()
    for i, g in enumerate(groups):
        if not isinstance(g, (list, tuple)) or len(g) != 2:
            raise _fail("not [id, [value names]]", f"groups[{i}]")
        _name(g[0], f"groups[{i}]", "delegate debug id")
        _names(g[1], f"groups[{i}]")
        if g[0] in ids:
            raise _fail(f"delegate debug id '{g[0]}' appears twice", f"groups[{i}]")
        ids.add(g[0])
    for key in ("values", "nodes"):
        table = tables.get(key, {})
        if not isinstance(table, dict):
            raise _fail(f"'{key}' is a {type(table).__name__}, not an object", key)
        for name, hs in table.items():
            where = f"{key}[{str(name)[:80]!r}]"
            _name(name, where, "name")
            _handles(hs, where)
    if "values" in tables and "groups" in tables and set(tables["values"]) != ids:
        extra = sorted(set(tables["values"]) ^ ids)[:3]
        raise _fail(f"'values' and 'groups' name different delegate debug ids (e.g. {extra})", "values")
    inter = tables.get("intermediates", [])
    _names(inter, "intermediates", empty_ok=True)
    _shapes(tables.get("shapes", {}), set(inter) if "intermediates" in tables else None)
    stats = tables.get("stats", {})
    if not isinstance(stats, dict) or any(not isinstance(v, int) or isinstance(v, bool) for v in stats.values()):
        raise _fail("'stats' is not an object of integer counters", "stats")


def _name(v: Any, where: str, what: str) -> None:
    if not isinstance(v, str) or not v or len(v) > _MAX_NAME:
        raise _fail(f"{what} {str(v)[:80]!r} is not a non-empty string of at most {_MAX_NAME} characters",
                    where)


def _names(v: Any, where: str, empty_ok: bool = False) -> None:
    if not isinstance(v, list) or (not v and not empty_ok):
        raise _fail(f"the ONNX value names are not a{'' if empty_ok else ' non-empty'} list", where)
    for k, n in enumerate(v):
        _name(n, where if where.endswith("]") else f"{where}[{k}]", "ONNX value name")


def _handles(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not v or any(not isinstance(h, int) or isinstance(h, bool) or h < 0 for h in v):
        raise _fail(f"the edge debug handles {str(v)[:80]} are not a non-empty list of ints >= 0", where)
    return v


def _shapes(shapes: Any, exposed: set[str] | None) -> None:
    if not isinstance(shapes, dict):
        raise _fail(f"'shapes' is a {type(shapes).__name__}, not an object", "shapes")
    for name, spec in shapes.items():
        where = f"shapes[{str(name)[:80]!r}]"
        if exposed is not None and name not in exposed:
            raise _fail(f"a shape for '{str(name)[:80]}', which no debug run exposes", where)
        if not isinstance(spec, dict) or not isinstance(spec.get("dtype"), str) or not isinstance(
                spec.get("shape"), list):
            raise _fail("not {dtype, shape}", where)
        try:
            kind = np.dtype(spec["dtype"]).kind
        except (TypeError, ValueError):
            kind = ""
        if kind not in "biufc" or not kind:
            raise _fail(f"dtype {spec['dtype'][:40]!r} is not a numeric dtype", where)
        for d in spec["shape"]:
            if isinstance(d, bool) or not (isinstance(d, int) and d >= -1
                                           or isinstance(d, str) and 0 < len(d) <= _MAX_NAME):
                raise _fail(f"dim {str(d)[:80]!r} is neither an int >= -1 nor a dim expression", where)
