"""A reference ``.pte`` given where an ETRecord is expected (``parse_etrecord("model.pte")``, ``Inspector(etrecord=
"model.pte")``): when the reference's ETRecord is absent, the program alone joins the ETDump's events to what they
call. Each instruction of a method becomes a handle group of its own (``KERNEL``, or ``DELEGATE_CALL`` with its
backend) under a synthetic debug handle ``instruction index + 1``, whose handle-table row names the kernel's
operator (``aten::mm.out``) or the delegate call; there are no programs, so no numeric gap (the Inspector says it
needs the ETRecord), but event blocks, perf tables and ``op_types`` work."""

from __future__ import annotations

from typing import Any

from edgetorch.formats.handles import DELEGATE_CALL, KERNEL, HandleGroup
from edgetorch.formats.program_executorch import is_executorch_program, read_executorch_program

PRODUCER = "executorch"


def is_reference_program(source: Any) -> bool:
    """True for a path, bytes or binary file holding a reference ``.pte`` (identifier "ET12")."""
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return is_executorch_program(source)
        if hasattr(source, "read"):
            pos = source.tell()
            try:
                return is_executorch_program(source.read(8))
            finally:
                source.seek(pos)
        with open(source, "rb") as f:
            return is_executorch_program(f.read(8))
    except (OSError, ValueError, TypeError):
        return False


class ProgramSource:
    """The lazy-source interface of ``ETRecord`` (``_archive.ArchiveSource``) for a record made of a program
    alone: no programs, no reference graphs, handle tables from the instructions."""

    def __init__(self, tables: dict[str, dict[int, list[Any]]]) -> None:
        self._tables = tables
        self.references: dict[str, Any] = {}
        self.edge_references: dict[str, Any] = {}
        self.graph_map_references: dict[str, Any] = {}
        self.handles = {m: m for m in tables}

    def keys(self, role: str) -> list[str]:
        return list(self._tables) if role == "edge" else []

    def programs(self, role: str) -> dict[str, Any]:
        return {}

    def is_stored(self, role: str, key: str, ep: Any) -> bool:
        return False

    def handle_table(self, method: str) -> dict[int, list[Any]]:
        return self._tables[method]


def read_reference_program(source: Any, path: str | None = None) -> tuple[dict[str, Any], dict[str, Any],
                                                                          ProgramSource]:
    """The ``ETRecord`` keyword arguments, extra attributes and lazy source of a reference ``.pte``."""
    from edgetorch.devtools.etrecord._reference import NodeInfo

    if hasattr(source, "read"):
        data = source.read()
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        with open(source, "rb") as f:
            data = f.read()
    prog = read_executorch_program(data, path)
    groups: dict[str, list[HandleGroup]] = {}
    tables: dict[str, dict[int, list[Any]]] = {}
    for method, instrs in prog.methods.items():
        gs, table = [], {}
        for i in instrs:
            if i.chain != 0 or i.kind not in ("kernel", "delegate"):
                continue  # control flow, moves and frees call nothing; other chains share instruction ids
            h = i.index + 1
            if i.kind == "kernel":
                gs.append(HandleGroup(KERNEL, i.index, (h,)))
                table[h] = [NodeInfo(f"instruction_{i.index}", str(i.target).split(".")[0], None, None, False)]
            else:
                gs.append(HandleGroup(DELEGATE_CALL, i.index, (h,), backend=i.target))
                table[h] = [NodeInfo(f"instruction_{i.index}", f"executorch_call_delegate[{i.target}]", None, None,
                                     False)]
        groups[method], tables[method] = gs, table
    return dict(handle_groups=groups), {"producer": PRODUCER, "num_outputs": {}}, ProgramSource(tables)
