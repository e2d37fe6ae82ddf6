"""Control-flow instructions of a program (``JumpFalseCall``, ``MoveCall``, schema version 4): what a file may
hold and what paths through a method are.

* ``JUMP_FALSE { cond_value_index, destination_instruction }``: when the condition value is false, the next
  instruction is ``destination_instruction``, else the following one. The condition is a ``Bool`` (``False``: an
  unconditional jump), an ``Int`` or a ``SymInt`` (0 is false) or a one-element ``BOOL`` tensor. A destination is
  strictly after the jump and at most the instruction count (the end): no loops, so every run ends and every
  path is a subsequence of the instruction order.
* ``MOVE { move_from, move_to }``: copies a tensor into a planned tensor of the same dtype and shape (the branch
  result of a ``torch.cond`` into the cond's output).

``check_instruction`` checks one of them (the runtime calls it at load under every verification level);
``check_paths`` re-proves def-use along every path (``Verification.InternalConsistency``): a value written in one
branch only is not written for the code after the branches, so reading it there is refused like any read of
unwritten arena bytes.
"""

from __future__ import annotations

from edgetorch.formats import _program_defs as pf
from edgetorch.formats.errors import ProgramFormatError

__all__ = ["is_control", "has_jumps", "check_instruction", "cond_kind", "check_paths"]

_BOOL = 11  # ScalarType.BOOL


def is_control(call: object) -> bool:
    return isinstance(call, (pf.JumpFalseCallDef, pf.MoveCallDef))


def has_jumps(plan: pf.PlanDef) -> bool:
    return any(isinstance(ins.call, pf.JumpFalseCallDef) for ins in plan.instructions)


def _fail(plan: pf.PlanDef, k: int, fld: str, msg: str) -> None:
    raise ProgramFormatError(f"method '{plan.name}': instruction {k}: {msg} (the file is inconsistent: corrupted "
                             "or edited?)", field=f"{plan.name}.instructions[{k}].{fld}")


def cond_kind(plan: pf.PlanDef, vid: int) -> str | None:
    """What a jump's condition value is: ``"false"`` / ``"true"`` (a constant), ``"int"`` (an Int or SymInt,
    0 false), ``"tensor"`` (a one-element bool tensor); None when it may not be a condition."""
    v = plan.values[vid]
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, pf.SymIntV)):
        return "int"
    if isinstance(v, pf.TensorDef) and v.scalar_type == _BOOL and not v.sym_shape and _numel(v.sizes) == 1:
        return "tensor"
    return None


def _numel(sizes: list[int]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def check_instruction(plan: pf.PlanDef, k: int) -> None:
    """A jump's condition and destination, or a move's two tensors; ``ProgramFormatError`` naming the field."""
    c = plan.instructions[k].call
    n = len(plan.values)
    if isinstance(c, pf.JumpFalseCallDef):
        if not 0 <= c.cond_value_index < n or cond_kind(plan, c.cond_value_index) is None:
            _fail(plan, k, "cond_value_index", f"jump condition {c.cond_value_index} is not a bool, an int or a "
                  "one-element bool tensor of the method")
        if not k < c.destination_instruction <= len(plan.instructions):
            _fail(plan, k, "destination_instruction", f"jump destination {c.destination_instruction} is not "
                  f"after the jump and within the {len(plan.instructions)} instructions (only forward jumps)")
    elif isinstance(c, pf.MoveCallDef):
        for fld, vid in (("move_from", c.move_from), ("move_to", c.move_to)):
            if not 0 <= vid < n or not isinstance(plan.values[vid], pf.TensorDef):
                _fail(plan, k, fld, f"move {fld} {vid} is not a tensor value of the method")
        src, dst = plan.values[c.move_from], plan.values[c.move_to]
        if dst.placement != pf.PLACEMENT_PLANNED:
            _fail(plan, k, "move_to", f"move target {c.move_to} is not a planned tensor (placement {dst.placement})")
        if (src.scalar_type, list(src.sizes), src.sym_shape or "") != (dst.scalar_type, list(dst.sizes),
                                                                          dst.sym_shape or ""):
            _fail(plan, k, "move_to", f"move from value {c.move_from} (dtype {src.scalar_type}, sizes {src.sizes}) "
                  f"to value {c.move_to} (dtype {dst.scalar_type}, sizes {dst.sizes}): a move keeps dtype and shape")


def check_paths(plan: pf.PlanDef, targs: list[list[int]], root: dict[int, int], planned: set[int]) -> None:
    """Def-use along every path: each planned tensor (root of an alias) an instruction or an output reads was
    written on every path reaching it (or is an input). ``targs``: each instruction's tensor arguments; ``root``:
    alias -> base; ``planned``: the planned values with bytes."""
    n = len(plan.instructions)
    incoming: dict[int, set[int]] = {}
    cur: set[int] | None = set(plan.inputs)
    for k in range(n + 1):
        came = incoming.pop(k, None)
        if cur is None:
            cur = came
        elif came is not None:
            cur = cur & came
        if cur is None:
            continue  # unreachable: never runs
        if k == n:
            break
        for a in targs[k]:
            r = root.get(a, a)
            if r in planned and r not in cur:
                _fail(plan, k, "args", f"reads planned value {r} that is not written on every path to it (a value "
                      "one branch writes is unwritten when the other ran)")
        c = plan.instructions[k].call
        if isinstance(c, pf.JumpFalseCallDef):
            kind = cond_kind(plan, c.cond_value_index)
            if kind != "true":
                d = c.destination_instruction
                incoming[d] = set(cur) if d not in incoming else incoming[d] & cur
            if kind == "false":
                cur = None
            continue
        if not pf.is_view(plan.instructions[k]):
            cur.update(root.get(o, o) for o in c.outputs)
    for j, o in enumerate(plan.outputs):
        r = root.get(o, o)
        if isinstance(plan.values[o], pf.TensorDef) and r in planned and (cur is None or r not in cur):
            raise ProgramFormatError(
                f"method '{plan.name}': output {j} reads planned value {r} that is not written on every path "
                "(the file is inconsistent: corrupted or edited?)", field=f"{plan.name}.outputs[{j}]")
