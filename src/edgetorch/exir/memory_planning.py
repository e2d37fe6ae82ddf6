"""Lifetime-based greedy placement of a method's activations in one 64-byte aligned arena.

Input: a list of tensor buffers with their byte size and inclusive lifetime [first, last] in instruction
indices (the planner's caller extends a buffer's lifetime over every use of every alias of it). Two buffers
whose lifetimes intersect never share bytes. Several greedy orders are tried and the smallest arena kept.
``verify_memory_plan`` checks an emitted plan against lifetimes derived from its instructions alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgetorch.errors import MemoryPlanError
from edgetorch.formats import program as pf
from edgetorch.formats.alignment import align


@dataclass
class Buffer:
    key: int  # caller's id (a value index)
    size: int  # bytes
    first: int  # first instruction that writes or reads it (inputs: -1)
    last: int  # last instruction that reads it, through any alias (outputs: end of method)


@dataclass
class MemoryPlan:
    offsets: dict[int, int]  # key -> byte offset in the arena
    arena_size: int
    peak_live_bytes: int  # the most bytes (aligned) live at any one instruction: a lower bound
    algorithm: str


def peak_live_bytes(buffers: list[Buffer], alignment: int = 64) -> int:
    if not buffers:
        return 0
    lo = min(b.first for b in buffers)
    hi = max(b.last for b in buffers)
    delta = np.zeros(hi - lo + 2, dtype=np.int64)
    for b in buffers:
        delta[b.first - lo] += align(b.size, alignment)
        delta[b.last - lo + 1] -= align(b.size, alignment)
    return int(np.cumsum(delta).max())


def _place(buffers: list[Buffer], order: list[int], alignment: int, best_fit: bool) -> tuple[dict[int, int], int]:
    n = len(buffers)
    firsts = np.array([b.first for b in buffers], dtype=np.int64)
    lasts = np.array([b.last for b in buffers], dtype=np.int64)
    sizes = np.array([align(b.size, alignment) for b in buffers], dtype=np.int64)
    offs = np.full(n, -1, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    total = 0
    for i in order:
        mask = placed & (firsts <= lasts[i]) & (lasts >= firsts[i])
        cand = 0
        if mask.any():
            idx = np.nonzero(mask)[0]
            starts = offs[idx]
            ends = starts + sizes[idx]
            srt = np.argsort(starts, kind="stable")
            need = sizes[i]
            best_gap = None
            pos = 0
            for s, e in zip(starts[srt].tolist(), ends[srt].tolist()):
                gap = s - pos
                if gap >= need:
                    if not best_fit:
                        break
                    if best_gap is None or gap < best_gap[0]:
                        best_gap = (gap, pos)
                pos = max(pos, e)
            if best_fit:
                cand = best_gap[1] if best_gap is not None else pos
            else:
                cand = pos
        offs[i] = cand
        placed[i] = True
        total = max(total, cand + int(sizes[i]))
    return {buffers[i].key: int(offs[i]) for i in range(n)}, total


def plan_memory(buffers: list[Buffer], alignment: int = 64) -> MemoryPlan:
    """Places every buffer; returns offsets, the arena size and the live-bytes lower bound."""
    empty = {b.key: 0 for b in buffers if b.size == 0}  # zero-byte tensors need no bytes
    buffers = [b for b in buffers if b.size > 0]
    peak = peak_live_bytes(buffers, alignment)
    if not buffers:
        return MemoryPlan(empty, 0, 0, "none")
    n = len(buffers)
    orders = {
        "greedy_by_size": sorted(range(n), key=lambda i: (-buffers[i].size, buffers[i].first)),
        "greedy_by_start": sorted(range(n), key=lambda i: (buffers[i].first, -buffers[i].size)),
        "greedy_by_size_x_lifetime": sorted(
            range(n), key=lambda i: (-(buffers[i].size * (buffers[i].last - buffers[i].first + 1)), buffers[i].first)),
    }
    best: tuple[dict[int, int], int, str] | None = None
    for best_fit in (False, True):
        for name, order in orders.items():
            offsets, total = _place(buffers, order, alignment, best_fit)
            if best is None or total < best[1]:
                best = (offsets, total, name + ("+best_fit" if best_fit else ""))
            if total <= peak:
                break
        if best[1] <= peak:
            break
    offsets, total, name = best
    offsets.update(empty)
    return MemoryPlan(offsets, align(total, alignment), peak, name)


def live_ranges(plan: pf.PlanDef) -> dict[int, tuple[int, int]]:
    """Each planned value's [first, last] instruction, derived from the emitted instructions alone.

    A view's output is an alias of the root of its first tensor argument; a use of an alias is a use of its
    root. Inputs are live from -1, outputs until the end of the method. Independent of the emitter's own
    lifetime bookkeeping, so it can check it.
    """
    planned = {i for i, v in enumerate(plan.values)
               if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED}
    root: dict[int, int] = {}
    live: dict[int, list[int]] = {}

    def touch(vid: int, at: int) -> None:
        r = root.get(vid, vid)
        if r in planned:
            span = live.setdefault(r, [at, at])
            span[0], span[1] = min(span[0], at), max(span[1], at)

    for vid in plan.inputs:
        touch(vid, -1)
    for at, ins in enumerate(plan.instructions):
        call = ins.call
        args = [t for a in call.args for t in _tensor_ids(plan.values, a)]
        if isinstance(call, pf.KernelCallDef) and call.kind == pf.CALL_VIEW and args:
            for o in call.outputs:
                root[o] = root.get(args[0], args[0])
        for vid in args + list(call.outputs):
            touch(vid, at)
    for vid in plan.outputs:
        touch(vid, len(plan.instructions))
    return {k: (a, b) for k, (a, b) in live.items()}


def _tensor_ids(values: list, vid: int) -> list[int]:
    v = values[vid] if 0 <= vid < len(values) else None
    if isinstance(v, pf.TensorDef):
        return [vid]
    if isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)):
        return [i for i in v.items if i >= 0]
    return []


def verify_memory_plan(plan: pf.PlanDef) -> None:
    """Refuses a plan in which two planned tensors live at the same instruction and share arena bytes, or one
    lies outside the arena. Raises ``MemoryPlanError`` naming both values and the instructions involved."""
    spans = live_ranges(plan)
    keys = sorted(k for k in spans if plan.values[k].nbytes > 0)
    if not keys:
        return
    offs = np.array([plan.values[k].arena_offset for k in keys], dtype=np.int64)
    ends = offs + np.array([plan.values[k].nbytes for k in keys], dtype=np.int64)
    firsts = np.array([spans[k][0] for k in keys], dtype=np.int64)
    lasts = np.array([spans[k][1] for k in keys], dtype=np.int64)
    bad = np.nonzero((offs < 0) | (ends > plan.arena_size))[0]
    if bad.size:
        k = keys[int(bad[0])]
        raise MemoryPlanError(f"method '{plan.name}': value {k} occupies arena bytes [{offs[bad[0]]}, "
                              f"{ends[bad[0]]}) outside the {plan.arena_size}-byte arena")
    for i in range(len(keys)):
        clash = (firsts <= lasts[i]) & (lasts >= firsts[i]) & (offs < ends[i]) & (ends > offs[i])
        clash[: i + 1] = False
        if clash.any():
            j = int(np.nonzero(clash)[0][0])
            raise MemoryPlanError(
                f"method '{plan.name}': values {keys[i]} (bytes [{offs[i]}, {ends[i]}), live at instructions "
                f"{firsts[i]}..{lasts[i]}) and {keys[j]} (bytes [{offs[j]}, {ends[j]}), live at {firsts[j]}.."
                f"{lasts[j]}) share arena bytes while both are live")
