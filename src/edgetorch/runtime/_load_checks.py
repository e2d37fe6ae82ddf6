"""Checks a method's plan before anything of it runs: every operator is allowed and fits its instruction's
kind (``check_operators``), and every kernel call fits its operator on the planned shapes (``check_kernel``)."""

from __future__ import annotations

from typing import Any

import torch

from edgetorch.errors import OperatorNotAllowedError, ProgramFormatError
from edgetorch.formats import program as pf
from edgetorch.runtime import ops as _ops
from edgetorch.runtime._shapes import resolve

_KIND_CHECKED: dict[tuple[Any, int], str | None] = {}


def _kind_check(op: Any, kind: int) -> str | None:
    key = (op, kind)
    if key not in _KIND_CHECKED:
        why = _ops.check_call_kind(op, kind)
        if len(_KIND_CHECKED) > 4096:
            return why
        _KIND_CHECKED[key] = why
    return _KIND_CHECKED[key]


def check_operators(plan: pf.PlanDef) -> dict[int, torch._ops.OpOverload]:
    """Resolves the operator of every kernel instruction through the allow-list and checks that its schema fits
    the instruction's kind; ``OperatorNotAllowedError`` names the first instruction at fault."""
    ops: dict[int, torch._ops.OpOverload] = {}
    for k, ins in enumerate(plan.instructions):
        c = ins.call
        if not isinstance(c, pf.KernelCallDef):
            continue
        opdef = plan.operators[c.op_index]
        where = (f"method '{plan.name}': instruction {k} ({ins.node_name}) calls {opdef.name}."
                 f"{opdef.overload or 'default'}")
        op = ops.get(c.op_index)
        if op is None:
            try:
                op = ops[c.op_index] = _ops.resolve_operator(opdef.name, opdef.overload)
            except OperatorNotAllowedError as e:
                raise OperatorNotAllowedError(f"{where}: {e.message}", field=f"{plan.name}.operators[{c.op_index}]"
                                              ) from None
        why = _kind_check(op, c.kind)
        if why is not None:
            raise OperatorNotAllowedError(f"{where} as a {pf.CALL_KIND_NAMES.get(c.kind, '?')} call, but {why}",
                                          field=f"{plan.name}.instructions[{k}].kind")
    return ops


# -- every kernel call against its operator, on the planned shapes ------------------------------------------------
# Before an instruction first runs, each argument must be of the kind its schema names (a tensor where a Tensor
# is expected, an int list where an int[] is, ...), and the kernels that trust their arguments' sizes (the CPU
# batch norm reads ``C`` elements of every statistic without checking: a hash-valid file that moved one to an
# empty tensor crashed the process) get the shapes they need checked by an explicit rule (``_RULES``). Torch's
# meta kernels would check every op, but the first one loads torch's compiler stack (2-3 s per process on the
# shared machine), so they are not used at load; a kernel's output shape is checked after its first run
# instead (``Method._first_run``).

_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,), "SymInt": (int,), "float": (int, float), "bool": (bool,), "str": (str,),
    "Scalar": (int, float, bool), "number": (int, float, bool), "ScalarType": (torch.dtype,), "Layout": (torch.layout,),
    "MemoryFormat": (torch.memory_format,), "Device": (torch.device, str),
}


def _fits(t: Any, v: Any) -> bool:
    """Whether the value ``v`` is of the JIT schema type ``t``."""
    v = resolve(v)
    if isinstance(t, torch.OptionalType):
        return v is None or _fits(t.getElementType(), v)
    if isinstance(t, torch.TensorType):  # torch wraps a Python number passed for a Tensor (``mul.out(x, 2.0)``)
        return isinstance(v, (torch.Tensor, int, float, bool))
    if isinstance(t, torch.ListType):
        return isinstance(v, (list, tuple)) and all(_fits(t.getElementType(), x) for x in v)
    want = _SCALARS.get(str(t))
    if want is None:
        return True  # a type the program format cannot express (the call is parsed by torch when it runs)
    if want == (int,) and isinstance(v, bool):
        return False
    return isinstance(v, want)


def _check_kinds(op: Any, pos: list, kw: dict) -> str | None:
    args = iter(pos)
    for a in op._schema.arguments:
        if a.is_out:
            continue
        v = kw[a.name] if a.kwarg_only else next(args, None)
        if not _fits(a.real_type, v):
            got = type(resolve(v)).__name__
            return f"argument '{a.name}' must be {a.real_type}, the program passes {got}"
    return None


def _batch_norm(pos: list, kw: dict) -> str | None:
    """``(x, weight, bias, running_mean, running_var, ...)``: every statistic None or ``C`` contiguous elements of
    the input's dtype family, ``x`` at least 2-D."""
    x = pos[0]
    if not isinstance(x, torch.Tensor):  # the schema's Tensor also admits a Python number (torch wraps it)
        return f"input must be a tensor, the program passes {type(x).__name__}"
    if x.dim() < 2:
        return f"input must have at least 2 dims, has shape {list(x.shape)}"
    c = x.shape[1]
    for name, t in zip(("weight", "bias", "running_mean", "running_var"), pos[1:5]):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != c):
            has = list(t.shape) if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
            return f"{name} must have shape [{c}] (the input's channels), has {has}"
    return None


def _layer_norm(pos: list, kw: dict) -> str | None:
    x, shape, weight, bias = pos[0], list(resolve(pos[1])), pos[2], pos[3]
    if any(t is not None and not isinstance(t, torch.Tensor) for t in (x, weight, bias)) or x is None:
        return "input, weight and bias must be tensors (or None), the program passes a number"
    if list(x.shape[x.dim() - len(shape):]) != shape or len(shape) > x.dim():
        return f"normalized_shape {shape} does not end the input's shape {list(x.shape)}"
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and list(t.shape) != shape:
            return f"{name} must have shape {shape}, has {list(t.shape)}"
    return None


_RULES: dict[str, Any] = {
    "aten::_native_batch_norm_legit_no_training": _batch_norm, "aten::_native_batch_norm_legit": _batch_norm,
    "aten::native_batch_norm": _batch_norm, "aten::batch_norm": _batch_norm,
    "aten::native_layer_norm": _layer_norm, "aten::layer_norm": _layer_norm,
}


def check_kernel(method: str, k: int, ins: pf.InstructionDef, op: Any, pos: list, kw: dict) -> None:
    """Refuses (``ProgramFormatError`` naming method, instruction, node, operator and argument) a kernel
    instruction whose arguments are not of the kinds its operator's schema names, or break the shape rule of
    an operator that trusts its arguments' sizes."""
    why = _check_kinds(op, pos, kw)
    if why is None:
        rule = _RULES.get(op._schema.name)
        why = rule(pos, kw) if rule is not None else None
    if why is not None:
        raise ProgramFormatError(f"method '{method}': instruction {k} ({ins.node_name}, {op}): {why} (the file is "
                                 "inconsistent: corrupted or edited?)", field=f"{method}.instructions[{k}].args")


# -- the first run: every kernel writes its planned slot, and only that ----------------------------------------
# Each non-view instruction's output tensors are planned slots (arena views, already shaped for this run). A kernel
# that computes another shape resizes its output: torch gives it fresh storage outside the arena (and a later
# kernel may resize it back, which the final-shape check alone would not see). On a method's first run (and on
# the first run of each new binding of a dynamic method's symbols) every instruction's outputs are compared, right
# after it ran, with what they were before: shape, strides and address.

def _state(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.data_ptr()


def _checked(method: str, k: int, ins: pf.InstructionDef, call: Any, outs: list[torch.Tensor]) -> Any:
    def run() -> None:
        before = [_state(t) for t in outs]
        call()
        for j, (t, b) in enumerate(zip(outs, before)):
            now = _state(t)
            if now != b:
                raise ProgramFormatError(
                    f"method '{method}': instruction {k} ({ins.node_name}) wrote output {j} with shape "
                    f"{list(now[0])} (strides {list(now[1])}) where the program plans {list(b[0])} (strides "
                    f"{list(b[1])}){'' if now[2] == b[2] else ', moving it out of its arena slot'} (the file is "
                    "inconsistent: corrupted or edited?)", field=f"{method}.instructions[{k}].outputs")
    return run


def first_run_calls(method: str, plan: pf.PlanDef, slots: list, fast: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """``fast`` (the run loop's ``(instruction, call)`` list) with every call checking its outputs after it ran."""
    out = []
    for k, call in fast:
        ins = plan.instructions[k]
        outs = [slots[o] for o in ins.call.outputs if isinstance(slots[o], torch.Tensor)]
        out.append((k, _checked(method, k, ins, call, outs)))
    return out
