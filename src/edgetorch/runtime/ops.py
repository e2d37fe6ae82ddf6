"""Resolves operator names stored in a program to callable ATen kernels."""

from __future__ import annotations

import functools

import torch

from edgetorch.errors import ProgramFormatError


@functools.cache
def resolve_operator(name: str, overload: str) -> torch._ops.OpOverload:
    """``("aten::addmm", "out")`` -> ``torch.ops.aten.addmm.out``; unknown names raise ProgramFormatError."""
    ns, _, op = name.partition("::")
    if not ns or not op:
        raise ProgramFormatError(f"operator name '{name}' is not of the form namespace::name", field="operators")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        raise ProgramFormatError(
            f"operator {name}.{overload or 'default'} is not available in this runtime", field="operators") from None
