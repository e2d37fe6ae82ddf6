"""The one model of what a runtime event covers: ``HandleGroup`` (pure data, no torch).

A debug handle is a positive int naming one source (ATen) op; "no handle" is None, never 0. Emission
(``exir/emit.py``) writes one group per kernel instruction that has a handle, one per delegate call (every handle
its partition computes) and one per op inside a delegate (the backend's debug id and the handles it computes);
the ETRecord stores the groups as one table (``HandleGroup.to_json`` / ``from_json``, the one parser); the
Inspector finds an event's group by ``(instruction id, delegate debug id)`` and uses it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KERNEL", "DELEGATE_CALL", "IN_DELEGATE", "KINDS", "OutputSource", "HandleGroup", "parse_handle",
           "groups_from_tables", "debug_handle_map_of", "delegate_map_of"]

KERNEL = "kernel"  #: one kernel instruction: its op's handle
DELEGATE_CALL = "delegate_call"  #: a delegate call instruction: every handle its partition computes
IN_DELEGATE = "in_delegate"  #: one op (backend debug id) inside a delegate call: the handles it computes
KINDS = (KERNEL, DELEGATE_CALL, IN_DELEGATE)

#: per output of a delegate call: (debug handle, output index) of the edge op computing it, None if unknown
OutputSource = tuple[int, int] | None


@dataclass(frozen=True)
class HandleGroup:
    """The debug handles one runtime event stands for, written by emission, stored by the ETRecord and read by
    the Inspector unchanged. ``delegate_id`` is the backend's debug id of an ``IN_DELEGATE`` op (None
    otherwise); ``backend`` names the delegate of a ``DELEGATE_CALL`` / ``IN_DELEGATE`` group; ``outputs``
    (``DELEGATE_CALL`` only, None when unknown) says which edge op computes each output of the call."""

    kind: str
    instruction_id: int
    handles: tuple[int, ...]
    delegate_id: int | str | None = None
    backend: str | None = None
    outputs: tuple[OutputSource, ...] | None = None

    @property
    def key(self) -> tuple[int, int | str | None]:
        """How a runtime event finds its group: (instruction id, delegate debug id or None)."""
        return self.instruction_id, self.delegate_id

    def to_json(self) -> list[Any]:
        outs = None if self.outputs is None else [None if o is None else list(o) for o in self.outputs]
        return [self.kind, self.instruction_id, list(self.handles), self.delegate_id, self.backend, outs]

    @classmethod
    def from_json(cls, row: Any) -> HandleGroup:
        """The one parser of a stored group; raises ``ValueError`` naming what is wrong."""
        if not (isinstance(row, list) and len(row) == 6 and row[0] in KINDS):
            raise ValueError(f"handle group {str(row)[:80]} is not [kind, instruction, handles, delegate id, "
                             "backend, outputs]")
        kind, iid, hs, did, backend, outs = row
        if not _is_int(iid) or iid < 0:
            raise ValueError(f"instruction id {iid!r} is not a non-negative integer")
        if not isinstance(hs, list):
            raise ValueError(f"handles {hs!r} are not a list")
        if not (did is None or isinstance(did, str) or _is_int(did)) or (did is None) == (kind == IN_DELEGATE):
            raise ValueError(f"delegate debug id {did!r} does not fit a {kind} group")
        if backend is not None and not isinstance(backend, str):
            raise ValueError(f"backend {backend!r} is not a string")
        if outs is not None and (kind != DELEGATE_CALL or not isinstance(outs, list)):
            raise ValueError("only a delegate call lists its output sources")
        return cls(kind, iid, tuple(parse_handle(h, strict=True) for h in hs), did, backend,
                   None if outs is None else tuple(_output_source(o) for o in outs))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_handle(h: Any, strict: bool = False) -> int | None:
    """A debug handle: a positive int (never a bool); anything else is "no handle" (None), or a ``ValueError``
    with ``strict``. Every reader of a handle (graph metadata, stored tables) goes through here."""
    if _is_int(h) and h > 0:
        return h
    if strict:
        raise ValueError(f"debug handle {h!r} is not a positive integer")
    return None


def _output_source(v: Any) -> OutputSource:
    if v is None:
        return None
    if isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v) and v[1] >= 0:
        return parse_handle(v[0], strict=True), v[1]
    raise ValueError(f"delegate output source {v!r} is neither null nor [debug handle, output index]")


def groups_from_tables(debug_handle_map: dict[int, Any], delegate_map: dict[int, dict] | None = None,
                       delegate_outputs: dict[int, list] | None = None) -> list[HandleGroup]:
    """Groups of one method from the three tables of earlier records (``debug_handle_map``: instruction ->
    handle or handle list, ``delegate_map``: instruction -> {name, delegate_map: {debug id: handles}},
    ``delegate_outputs``), already normalised to int keys. A handle of 0 was "no handle"."""
    dmap, outs = delegate_map or {}, delegate_outputs or {}
    groups: list[HandleGroup] = []
    for iid, v in debug_handle_map.items():
        if isinstance(v, (list, tuple)) or iid in dmap:
            hs = tuple(h for h in (v if isinstance(v, (list, tuple)) else [v]) if parse_handle(h) is not None)
            name = dmap.get(iid, {}).get("name")
            src = outs.get(iid)
            groups.append(HandleGroup(DELEGATE_CALL, iid, hs, None, name,
                                      None if src is None else tuple(None if s is None else tuple(s) for s in src)))
            for did, inner in dmap.get(iid, {}).get("delegate_map", {}).items():
                groups.append(HandleGroup(IN_DELEGATE, iid, tuple(inner), did, name))
        elif parse_handle(v) is not None:
            groups.append(HandleGroup(KERNEL, iid, (v,)))
    return groups


def debug_handle_map_of(groups: list[HandleGroup]) -> dict[int, int | list[int]]:
    """The reference's ``debug_handle_map`` view: instruction -> its kernel's handle or its call's handle list."""
    return {g.instruction_id: (g.handles[0] if g.kind == KERNEL else list(g.handles))
            for g in groups if g.kind != IN_DELEGATE}


def delegate_map_of(groups: list[HandleGroup]) -> dict[int, dict[str, Any]]:
    """The reference's ``delegate_map`` view: delegate call -> {name, delegate_map: {debug id: [handles]}}."""
    out: dict[int, dict[str, Any]] = {}
    for g in groups:
        if g.kind == DELEGATE_CALL:
            out[g.instruction_id] = {"name": g.backend, "delegate_map": {}}
    for g in groups:
        if g.kind == IN_DELEGATE and g.instruction_id in out:
            out[g.instruction_id]["delegate_map"][g.delegate_id] = list(g.handles)
    return out
