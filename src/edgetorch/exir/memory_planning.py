"""Lifetime-based greedy placement of a method's activations in one 64-byte aligned arena.

Input: a list of tensor buffers with their byte size and inclusive lifetime [first, last] in instruction
indices (the planner's caller extends a buffer's lifetime over every use of every alias of it). Two buffers
whose lifetimes intersect never share bytes. Several greedy orders are tried and the smallest arena kept.
``verify_memory_plan`` checks an emitted plan against lifetimes derived from its instructions alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edgetorch.errors import MemoryPlanError
from edgetorch.formats import program as pf
from edgetorch.formats.alignment import ALIGNMENT, align
from edgetorch.formats.plan_check import find_overlap, live_ranges

__all__ = ["Buffer", "MemoryPlan", "MemoryPlanningPass", "peak_live_bytes", "ALGORITHMS", "plan_memory",
           "unplan_inputs", "unshare_mutable_buffers", "verify_memory_plan"]


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
    # the arena ends where the last tensor's bytes do, on the loader's boundary: padding a wider alignment adds
    # after the last tensor would be bytes nothing uses (and the loader refuses an arena larger than its tensors)
    end = max(offsets[b.key] + b.size for b in buffers)
    offsets.update(empty)
    return MemoryPlan(offsets, min(align(total, alignment), align(end, ALIGNMENT)), peak, name)


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


class MemoryPlanningPass:
    """The reference's memory-planning options, given to ``ExecutorchBackendConfig(memory_planning_pass=...)``.

    What each one does here:

    - ``memory_planning_algo``: a name from :data:`ALGORITHMS` (None: ``ExecutorchBackendConfig.memory_planning_algo``);
      the reference's algorithm callables / suites are refused (``MemoryPlanError``).
    - ``alignment``: byte alignment of the planned tensors (None: ``ExecutorchBackendConfig.alignment``; a power of
      two of at least 64, the boundary the loader checks every planned tensor against).
    - ``share_mutable_buffers``: True, the methods of one program share each mutable buffer of the same name (one KV
      cache for a prefill and a decode method); False, each method holds its own copy of it.
    - ``alloc_graph_input``: False leaves the inputs out of the arena (``unplan_inputs``: the arena shrinks by
      their bytes) and the runtime runs on the caller's tensors without copying them (``runtime._unplanned``);
      static shapes only (a dynamic-shaped input is refused, ``MemoryPlanError``).
    - ``alloc_graph_output`` / ``alloc_mutable_buffers``: only True. edgetorch's runtime binds every kernel's
      arguments to their slots when a method loads and returns copies of the outputs; it has no API through which
      a caller hands it output or buffer memory, so False is refused (``MemoryPlanError`` naming the field)
      instead of being ignored.
    - ``allow_lifetime_and_storage_overlap``: only False: the planner never lets two live tensors share bytes.

    Not a graph pass: ``to_executorch`` applies it (calling it raises ``MemoryPlanError``)."""

    def __init__(self, memory_planning_algo: str | None = None, allow_lifetime_and_storage_overlap: bool = False,
                 alloc_graph_input: bool = True, alloc_graph_output: bool = True, alloc_mutable_buffers: bool = True,
                 share_mutable_buffers: bool = False, alignment: int | None = None) -> None:
        if memory_planning_algo is not None and (not isinstance(memory_planning_algo, str)
                                                 or memory_planning_algo not in ALGORITHMS):
            raise MemoryPlanError(
                f"MemoryPlanningPass.memory_planning_algo {memory_planning_algo!r}: edgetorch plans with its own "
                f"greedy orders, named by a string: one of {', '.join(ALGORITHMS)} (the reference's algorithm "
                "callables and suites cannot run here)")
        if alignment is not None and (isinstance(alignment, bool) or not isinstance(alignment, int)
                                      or alignment < ALIGNMENT or alignment & (alignment - 1)):
            raise MemoryPlanError(f"MemoryPlanningPass.alignment {alignment!r}: a power of two of at least {ALIGNMENT} "
                                  "(the loader refuses a planned tensor off that boundary; the reference's 16 would "
                                  "not load)")
        refused = {"alloc_graph_output": (alloc_graph_output, True),
                   "alloc_mutable_buffers": (alloc_mutable_buffers, True),
                   "allow_lifetime_and_storage_overlap": (allow_lifetime_and_storage_overlap, False)}
        for name, (value, only) in refused.items():
            if bool(value) != only:
                raise MemoryPlanError(_REFUSED[name].format(name=name, value=value))
        self.memory_planning_algo = memory_planning_algo
        self.allow_lifetime_and_storage_overlap = False
        self.alloc_graph_input = bool(alloc_graph_input)
        self.alloc_graph_output = self.alloc_mutable_buffers = True
        self.share_mutable_buffers = bool(share_mutable_buffers)
        self.alignment = alignment

    def __repr__(self) -> str:
        return (f"MemoryPlanningPass(memory_planning_algo={self.memory_planning_algo!r}, "
                f"share_mutable_buffers={self.share_mutable_buffers}, alignment={self.alignment})")

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise MemoryPlanError("MemoryPlanningPass is not a graph pass in edgetorch: give it to "
                              "to_executorch(ExecutorchBackendConfig(memory_planning_pass=...)), which plans with it")


_WHY = ("edgetorch's runtime binds every kernel's arguments to arena slots when a method loads and has no API "
        "through which a caller hands it that memory")
_REFUSED = {
    "alloc_graph_output": "MemoryPlanningPass.{name}={value}: outputs are always planned; the runtime returns copies "
                          "of them (" + _WHY + ")",
    "alloc_mutable_buffers": "MemoryPlanningPass.{name}={value}: the loaded program always holds its mutable "
                             "buffers itself, from their initial values (" + _WHY + ")",
    "allow_lifetime_and_storage_overlap": "MemoryPlanningPass.{name}={value}: the planner never places two live "
                                          "tensors on the same bytes, and the loader refuses a plan that does",
}


def unshare_mutable_buffers(plans: list[pf.PlanDef]) -> list[pf.PlanDef]:
    """``share_mutable_buffers=False``: a mutable buffer that several methods name becomes one buffer per method
    (renamed ``"<method>::<name>"``), so that each method updates its own copy. Plans are edited in place."""
    users: dict[str, int] = {}
    for p in plans:
        for mb in p.mutable_buffers:
            users[mb.name] = users.get(mb.name, 0) + 1
    for p in plans:
        p.mutable_buffers = [replace(mb, name=f"{p.name}::{mb.name}") if users[mb.name] > 1 else mb
                             for mb in p.mutable_buffers]
    return plans


def unplan_inputs(plan: pf.PlanDef, alignment: int, algorithm: str) -> MemoryPlan:
    """``alloc_graph_input=False``: every planned tensor input of ``plan`` becomes unplanned (placement
    ``DYNAMIC``: the runtime runs on the caller's tensor) and the other planned tensors are placed again, with
    lifetimes derived from the instructions (``formats.plan_check.live_ranges``, which the loader checks the
    plan against). Edits ``plan``; returns the new memory plan. A dynamic-shaped input is refused."""
    for j, vid in enumerate(plan.inputs):
        v = plan.values[vid]
        if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED:
            if v.sym_shape or v.storage_offset:
                name = plan.input_names[j] if j < len(plan.input_names) else str(j)
                raise MemoryPlanError(f"method '{plan.name}': MemoryPlanningPass.alloc_graph_input=False: input "
                                      f"'{name}' has a dynamic shape; only static-shaped inputs can run unplanned")
            v.placement, v.arena_offset = pf.PLACEMENT_DYNAMIC, -1
    ranges = live_ranges(plan)
    buffers = [Buffer(k, v.nbytes, *ranges.get(k, (-1, -1))) for k, v in enumerate(plan.values)
               if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED]
    mp = plan_memory(buffers, alignment, algorithm)
    for k, off in mp.offsets.items():
        plan.values[k].arena_offset = off
    plan.arena_size = mp.arena_size
    verify_memory_plan(plan)
    return mp
