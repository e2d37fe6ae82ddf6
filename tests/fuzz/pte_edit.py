"""Structure-aware edits of a ``.pte``, as an attacker makes them: decode with the project's own reader, change one
field, re-encode with the project's own writer (valid flatbuffer, valid content hash), so that every
verification level's integrity checks pass and only the loader's semantic checks can refuse the file."""

from __future__ import annotations

from collections.abc import Callable

from edgetorch.formats import program as pf


def decode(data: bytes) -> tuple[pf.ProgramDef, bytes]:
    """The program of a ``.pte`` and its segment area (constants and delegate blobs, unchanged by an edit)."""
    h = pf.read_header(data)
    prog = pf.decode_flatbuffer(data[h.flatbuffer_offset:h.flatbuffer_offset + h.flatbuffer_size])
    return prog, bytes(data[h.segment_offset:h.segment_offset + h.segment_size])


def encode(prog: pf.ProgramDef, segments: bytes) -> bytes:
    """A complete ``.pte`` with a content hash that matches its body."""
    return b"".join(bytes(p) for p in pf.build_file_parts(prog, [segments]))


def edit(data: bytes, mutate: Callable[[pf.ProgramDef], None]) -> bytes:
    """``data`` with ``mutate(program)`` applied, re-encoded with a valid hash."""
    prog, seg = decode(data)
    mutate(prog)
    return encode(prog, seg)


def add_value(plan: pf.PlanDef, v: object) -> int:
    """Appends a value to the plan's value table; returns its index."""
    plan.values.append(v)
    return len(plan.values) - 1


def add_operator(plan: pf.PlanDef, name: str, overload: str) -> int:
    """The index of operator ``name``/``overload`` in the plan's table (appended when absent)."""
    for i, o in enumerate(plan.operators):
        if o.name == name and o.overload == overload:
            return i
    plan.operators.append(pf.OperatorDef(name, overload))
    return len(plan.operators) - 1
