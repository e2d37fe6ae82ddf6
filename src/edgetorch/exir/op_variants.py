"""What kind of kernel call each ATen op becomes: out variant, view (alias) or functional-then-copy."""

from __future__ import annotations

import functools

import torch

__all__ = ["is_view_op", "out_variant"]


def is_view_op(op: torch._ops.OpOverload) -> bool:
    """True when the op returns an alias of an input (a view) and mutates nothing."""
    schema = op._schema
    if schema.is_mutable or not schema.returns:
        return False
    for r in schema.returns:
        ai = r.alias_info
        if ai is None or ai.is_write:
            return False
    return True


def _arg_sig(a: torch.Argument) -> tuple[str, str]:
    return a.name, str(a.type)


@functools.cache
def out_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload of ``op`` that writes its results into ``out`` arguments, or None if there is none.

    An out overload matches when its non-out arguments equal the functional arguments (name and type)
    and it has one out argument per tensor return (or a single list out for a list return).
    """
    schema = op._schema
    if schema.is_mutable:
        return None
    want = [_arg_sig(a) for a in schema.arguments]
    packet = getattr(getattr(torch.ops, op.namespace), op._schema.name.split("::")[-1])
    for name in packet.overloads():
        cand = getattr(packet, name)
        cs = cand._schema
        outs = [a for a in cs.arguments if a.is_out]
        if not outs:
            continue
        nonout = [_arg_sig(a) for a in cs.arguments if not a.is_out]
        if nonout != want:
            continue
        if len(outs) == len(schema.returns):
            return cand
    return None
