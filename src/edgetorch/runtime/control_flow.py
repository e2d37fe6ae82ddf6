"""Control flow at run time: the ``JUMP_FALSE`` and ``MOVE`` instructions (``formats.control_flow``) and the run
loop of a method that has jumps.

A method without jumps keeps its straight run loop (``Method._run``); one with jumps runs here: a program counter
walks the compiled calls, a jump whose condition is false sends it to its destination, and only the instructions
that run see the observer's hooks (an ETDump records the branch that ran, nothing of the other). Both kinds are
checked when the method loads, under every verification level (``formats.control_flow.check_instruction``): a
condition of a kind no jump reads, a backward or out-of-range destination, a move between tensors of different
dtype or shape, or into anything but a planned tensor, is a ``ProgramFormatError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from edgetorch.errors import DebugBufferOverflowError, ProgramFormatError
from edgetorch.formats import control_flow as fcf
from edgetorch.formats import program as pf
from edgetorch.runtime._shapes import SymScalar

__all__ = ["Jump", "compile_control", "run_with_jumps", "NAMES"]

#: the profile event names of the control instructions (the reference's)
NAMES = {pf.JumpFalseCallDef: ("JF_CALL", "JUMP_FALSE"), pf.MoveCallDef: ("MOVE_CALL", "MOVE")}


class Jump:
    """A compiled ``JUMP_FALSE``: calling it reads the condition; ``taken`` then says whether the run jumps."""

    __slots__ = ("slots", "vid", "destination", "taken")

    def __init__(self, slots: list, vid: int, destination: int) -> None:
        self.slots, self.vid, self.destination, self.taken = slots, vid, destination, False

    def __call__(self) -> None:
        v = self.slots[self.vid]
        if isinstance(v, torch.Tensor):
            self.taken = not bool(v.reshape(()).item())
        else:
            self.taken = not (v.value if isinstance(v, SymScalar) else v)


def _move(slots: list, src: int, dst: int) -> Callable[[], None]:
    def move() -> None:
        slots[dst].copy_(slots[src])
    return move


def compile_control(method: Any, k: int, ins: pf.InstructionDef) -> tuple[Callable[[], Any], str, str]:
    """The call of control instruction ``k`` of ``method``, its profile event name and its kind."""
    plan, slots = method.plan, method._slots
    fcf.check_instruction(plan, k)
    c = ins.call
    name, kind = NAMES[type(c)]
    if isinstance(c, pf.JumpFalseCallDef):
        jump = method._jumps[k] = Jump(slots, c.cond_value_index, c.destination_instruction)
        return jump, name, kind
    for fld, vid in (("move_from", c.move_from), ("move_to", c.move_to)):
        if not isinstance(slots[vid], torch.Tensor):
            raise ProgramFormatError(f"method '{plan.name}': instruction {k} moves value {vid}, which no earlier "
                                     "instruction made (the file is inconsistent: corrupted or edited?)",
                                     field=f"{plan.name}.instructions[{k}].{fld}")
    return _move(slots, c.move_from, c.move_to), name, kind


def run_with_jumps(method: Any, fast: list[tuple[int, Callable[[], Any]]], observer: Any) -> None:
    """The run loop of a method with jumps: ``fast`` are its compiled calls (VIEWs ran at load), the observer's
    hooks (``runtime.observer``) wrap the run and each instruction that runs."""
    n = len(method.plan.instructions)
    table: list[Callable[[], Any] | None] = [None] * n
    for k, call in fast:
        table[k] = call
    jumps = method._jumps
    before = after = None
    if observer is not None:
        observer.begin_run(method)
        before, after = observer.before_instruction, observer.after_instruction
    ok = False
    try:
        k = 0
        while k < n:
            call = table[k]
            if call is None:
                k += 1
                continue
            if before is not None:
                before(k)
            try:
                call()
            except (DebugBufferOverflowError, ProgramFormatError):
                raise
            except Exception as e:
                raise method._instruction_error(k, e) from e
            if after is not None:
                after(k)
            j = jumps.get(k)
            k = j.destination if j is not None and j.taken else k + 1
        ok = True
    finally:
        if observer is not None:
            observer.end_run(method, ok)
