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
from edgetorch.formats.plan_check import find_overlap, live_ranges  # noqa: F401 - live_ranges: callers' API

__all__ = ["Buffer", "MemoryPlan", "peak_live_bytes", "ALGORITHMS", "plan_memory", "verify_memory_plan"]


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


#: ``ExecutorchBackendConfig.memory_planning_algo`` values: "greedy" tries every order (first fit, then best fit)
#: and keeps the smallest arena; a single order's name tries only that order
ALGORITHMS = ("greedy", "greedy_by_size", "greedy_by_start", "greedy_by_size_x_lifetime")


def plan_memory(buffers: list[Buffer], alignment: int = 64, algorithm: str = "greedy") -> MemoryPlan:
    """Places every buffer with ``algorithm`` (one of :data:`ALGORITHMS`); returns offsets, the arena size and
    the live-bytes lower bound."""
    if algorithm not in ALGORITHMS:
        raise MemoryPlanError(f"unknown memory planning algorithm {algorithm!r} "
                              f"(ExecutorchBackendConfig.memory_planning_algo: one of {', '.join(ALGORITHMS)})")
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
    if algorithm != "greedy":
        orders = {algorithm: orders[algorithm]}
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


def verify_memory_plan(plan: pf.PlanDef) -> None:
    """Refuses a plan in which two planned tensors live at the same instruction and share arena bytes, or one
    lies outside the arena. Raises ``MemoryPlanError`` naming both values and the instructions involved. The
    lifetimes and the overlap test are ``formats.plan_check``'s, which the loader runs again on every file."""
    for k, v in enumerate(plan.values):
        if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED and v.nbytes > 0 and (
                v.arena_offset < 0 or v.arena_offset + v.nbytes > plan.arena_size):
            raise MemoryPlanError(f"method '{plan.name}': value {k} occupies arena bytes [{v.arena_offset}, "
                                  f"{v.arena_offset + v.nbytes}) outside the {plan.arena_size}-byte arena")
    clash = find_overlap(plan)
    if clash is not None:
        a, b, (fa, la), (fb, lb) = clash
        va, vb = plan.values[a], plan.values[b]
        raise MemoryPlanError(
            f"method '{plan.name}': values {a} (bytes [{va.arena_offset}, {va.arena_offset + va.nbytes}), live at "
            f"instructions {fa}..{la}) and {b} (bytes [{vb.arena_offset}, {vb.arena_offset + vb.nbytes}), live at "
            f"{fb}..{lb}) share arena bytes while both are live")
