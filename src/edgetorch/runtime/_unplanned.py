"""Inputs a program leaves out of its arena (``MemoryPlanningPass(alloc_graph_input=False)``: placement
``DYNAMIC`` on an input value): the method runs on the caller's own tensor, without copying it.

Each such input gets a tensor of its own at load (its storage outside the arena). ``execute`` points that slot
tensor at the caller's storage (``Tensor.set_``: every kernel bound to the slot object sees it) when the caller's
tensor has the planned strides and no load-time binding read the slot: a view made at load or a delegate call
(which may hold the slot's memory) would keep reading the old bytes, so such an input, or a tensor of other
strides, is copied into the slot's own storage instead."""

from __future__ import annotations

from typing import Any

import torch

from edgetorch.formats import program as pf
from edgetorch.formats.dtypes import code_dtype
from edgetorch.runtime._copy import copy_into

__all__ = ["UnplannedInputs"]


def _bound_at_load(plan: pf.PlanDef) -> set[int]:
    """Values read by a view instruction or a delegate call (directly or inside a tensor list)."""
    out: set[int] = set()
    for ins in plan.instructions:
        c = ins.call
        if isinstance(c, pf.KernelCallDef) and c.kind != pf.CALL_VIEW:
            continue
        for a in c.args:
            out.add(a)
            v = plan.values[a] if 0 <= a < len(plan.values) else None
            if isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)):
                out.update(v.items)
    return out


class UnplannedInputs:
    """The unplanned inputs of one method (their slots made here, each with its own storage); ``fill(j, slot, x)``
    makes any input ``j`` hold ``x``: ``bind`` runs an unplanned one on ``x`` itself when it can (True) and
    otherwise restores the slot's own storage (False), into which ``x`` is then copied."""

    def __init__(self, plan: pf.PlanDef, slots: list[Any]) -> None:
        self._own: dict[int, tuple[torch.UntypedStorage, tuple[int, ...], tuple[int, ...], bool]] = {}
        bound = _bound_at_load(plan)
        for j, vid in enumerate(plan.inputs):
            v = plan.values[vid]
            if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_DYNAMIC:
                t = slots[vid] = torch.empty_strided(v.sizes, v.strides, dtype=code_dtype(v.scalar_type))
                self._own[j] = (t.untyped_storage(), tuple(t.shape), tuple(t.stride()), vid not in bound)

    def __bool__(self) -> bool:
        return bool(self._own)

    @property
    def zero_copy(self) -> list[int]:
        """The input positions run on the caller's tensors (when their strides match)."""
        return [j for j, own in self._own.items() if own[3]]

    def fill(self, j: int, slot: torch.Tensor, x: torch.Tensor) -> None:
        """Input ``j`` holds ``x``: bound (``bind``) or copied into its slot."""
        if not self._own or not self.bind(j, slot, x):
            copy_into(slot, x)

    def bind(self, j: int, slot: torch.Tensor, x: torch.Tensor) -> bool:
        own = self._own.get(j)
        if own is None:
            return False
        storage, shape, stride, free = own
        if free and tuple(x.stride()) == stride and x.dtype == slot.dtype and not x.is_conj() and not x.is_neg():
            try:
                slot.set_(x)
                return True
            except RuntimeError:  # an inference tensor or another storage set_ cannot share: copy it
                pass
        if slot.untyped_storage().data_ptr() != storage.data_ptr():
            slot.set_(storage, 0, shape, stride)
        return False
