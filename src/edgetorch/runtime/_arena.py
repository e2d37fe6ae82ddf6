"""Binding a method's tensors to memory: its arena, strided views of it (and of mapped constants) with typed
errors, and the shapes of dynamic tensors as a caller sees them (``runtime.method``)."""

from __future__ import annotations

import json
from typing import Any

import torch

from edgetorch.errors import ProgramFormatError
from edgetorch.formats import program as pf

__all__ = ["allocate_arena", "strided", "sym_sizes", "shape_text"]


def allocate_arena(plan: pf.PlanDef) -> torch.Tensor:
    try:
        return torch.empty(plan.arena_size, dtype=torch.uint8)
    except (RuntimeError, MemoryError) as e:  # a size the verifier accepted (Minimal) but memory cannot hold
        raise ProgramFormatError(f"method '{plan.name}': cannot allocate its {plan.arena_size}-byte arena ({e})",
                                 field=f"{plan.name}.arena_size") from None


def strided(base: torch.Tensor, sizes: Any, strides: Any, offset: int, what: str, fld: str) -> torch.Tensor:
    """``as_strided`` with a typed error when the layout leaves its storage (what InternalConsistency refuses
    before; under Minimal this is the check)."""
    try:
        return torch.as_strided(base, sizes, strides, offset)
    except RuntimeError as e:
        raise ProgramFormatError(f"{what} lies outside its storage ({str(e).splitlines()[0][:200]}) (the file is "
                                 "inconsistent: corrupted or edited?)", field=fld) from None


def sym_sizes(v: pf.TensorDef) -> list:
    try:
        return json.loads(v.sym_shape)["sizes"]
    except (ValueError, KeyError, TypeError):
        return list(v.sizes)


def shape_text(info: Any, slot: torch.Tensor) -> str:
    """A tensor input's expected shape, ``<= n`` for a dynamic dim (``info``: its ``TensorInfo``)."""
    if not info.dynamic_dims:
        return str(list(info.shape))
    return " x ".join(f"<= {s}" if d in info.dynamic_dims else str(s) for d, s in enumerate(info.shape))
