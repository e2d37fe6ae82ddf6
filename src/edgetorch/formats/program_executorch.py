"""Reader of the parts of the reference ExecuTorch's program (``.pte``, flatbuffer identifier "ET12") that join its
ETDumps to names without an ETRecord: per method (execution plan), each instruction of each chain with what it
calls, the operator (``aten::mm.out``) of a kernel call or the backend (``XnnpackBackend``) of a delegate call.

The reference's runtime keys every event by (chain index, instruction index): ``instructions(method)`` gives the
same keys. Layout (``program.fbs``; field indices in declaration order, a union taking two): root
``Program{version, execution_plan: [ExecutionPlan], ...}``; ``ExecutionPlan{name, container_meta_type, values,
inputs, outputs, chains: [Chain], operators: [Operator], delegates: [BackendDelegate], ...}``; ``Chain{inputs,
outputs, instructions: [Instruction], stacktrace}``; ``Instruction{instr_args: union(KernelCall 1, DelegateCall 2,
MoveCall 3, JumpFalseCall 4, FreeCall 5)}``; ``KernelCall{op_index, args}``; ``DelegateCall{delegate_index,
args}``; ``Operator{name, overload}``; ``BackendDelegate{id, processed, compile_specs}``. Weights, values and
segments are not read. Every table, vector and string is bounds-checked (``formats._fbread.Table``); an index
outside its table, an unknown instruction kind or a wrong identifier is a ``ProgramFormatError`` naming the field.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from edgetorch.formats._fbread import Table
from edgetorch.formats.errors import ProgramFormatError

__all__ = ["IDENTIFIER", "KINDS", "MAX_INSTRUCTIONS", "Instruction", "ReferenceProgram", "is_executorch_program",
           "read_executorch_program"]

IDENTIFIER = b"ET12"
KINDS = {1: "kernel", 2: "delegate", 3: "move", 4: "jump_false", 5: "free"}
MAX_INSTRUCTIONS = 1 << 22


@dataclass(frozen=True)
class Instruction:
    """One instruction: its (chain, index) key in the reference's events, its kind (``KINDS``) and the operator
    (``"aten::mm.out"``; ``"aten::copy_"`` for a default overload, as the program names it) or delegate backend
    it calls (None for the other kinds)."""

    chain: int
    index: int
    kind: str
    target: str | None

    @property
    def event_name(self) -> str | None:
        """The name the reference's runtime gives this instruction's profile event."""
        if self.kind == "delegate":
            return "DELEGATE_CALL"
        if self.kind == "kernel" and self.target is not None:
            return "native_call_" + self.target.split("::", 1)[-1]
        return None


@dataclass(frozen=True)
class ReferenceProgram:
    """{method: [Instruction]} of a reference program, in plan order."""

    methods: dict[str, list[Instruction]]

    def instructions(self, method: str = "forward") -> dict[tuple[int, int], Instruction]:
        """{(chain, instruction index): Instruction} of ``method`` (``KeyError`` when it has no such method)."""
        return {(i.chain, i.index): i for i in self.methods[method]}


def is_executorch_program(data: Any) -> bool:
    """True when ``data`` carries the reference program's identifier (bytes [4, 8))."""
    mv = memoryview(data)
    return mv.nbytes >= 8 and bytes(mv[4:8]) == IDENTIFIER


def _fail(path: str | None, msg: str, fld: str) -> ProgramFormatError:
    return ProgramFormatError(f"{path or 'program'}: ExecuTorch program: {fld}: {msg}", field=fld)


def _plan(buf: bytes, plan: Table, path: str | None, at: str) -> tuple[str, list[Instruction]]:
    name = plan.string(0)
    ops = [f"{o.string(0)}.{o.string(1)}" if o.string(1) else o.string(0) for o in plan.tables(6)]
    backends = [d.string(0) for d in plan.tables(7)]
    out: list[Instruction] = []
    for c, chain in enumerate(plan.tables(5)):
        instrs = chain.tables(2)
        if len(out) + len(instrs) > MAX_INSTRUCTIONS:
            raise _fail(path, f"more than {MAX_INSTRUCTIONS} instructions", f"{at}.chains")
        for i, ins in enumerate(instrs):
            kind = KINDS.get(ins.scalar(0, "B"))
            where = f"{at}.chains[{c}].instructions[{i}]"
            if kind is None:
                raise _fail(path, f"unknown instruction kind {ins.scalar(0, 'B')}", where)
            target = None
            if kind in ("kernel", "delegate"):
                call = ins.table(1)
                if call is None:
                    raise _fail(path, f"a {kind} call without arguments", where)
                k = call.scalar(0, "i")  # absent: the schema default, 0
                table = ops if kind == "kernel" else backends
                if not 0 <= k < len(table):
                    raise _fail(path, f"{'operator' if kind == 'kernel' else 'delegate'} index {k} outside "
                                      f"[0, {len(table)})", where)
                target = table[k]
            out.append(Instruction(c, i, kind, target))
    return name, out


def read_executorch_program(data: bytes | bytearray | memoryview, path: str | None = None) -> ReferenceProgram:
    """The methods and instructions of a reference ``.pte`` (see the module docstring)."""
    buf = bytes(data)
    if len(buf) < 8 or buf[4:8] != IDENTIFIER:
        raise _fail(path, f"identifier {buf[4:8]!r}, expected {IDENTIFIER!r}", "file_identifier")
    root = Table(buf, struct.unpack_from("<I", buf, 0)[0])
    methods: dict[str, list[Instruction]] = {}
    for p, plan in enumerate(root.tables(1)):
        name, instrs = _plan(buf, plan, path, f"execution_plan[{p}]")
        if name in methods:
            raise _fail(path, f"two methods named {name!r}", f"execution_plan[{p}].name")
        methods[name] = instrs
    if not methods:
        raise _fail(path, "no execution plan", "execution_plan")
    return ReferenceProgram(methods)
