"""Re-proves a method's memory plan from its instructions alone: what the compiler proved before writing the
file, checked again by the loader (``Verification.InternalConsistency`` and ``Full``) so that an edited file
cannot make the runtime read memory nothing wrote or two live tensors share arena bytes.

* **live ranges** (``live_ranges``): each planned value's ``[first, last]`` instruction. A view's output is an
  alias of the root of its first tensor argument; a use of an alias is a use of its root; inputs are live from
  -1, outputs until the end. The compiler's ``exir.memory_planning.verify_memory_plan`` uses the same function.
* **no overlap** (``find_overlap``): no two planned values live at one instruction share arena bytes.
* **def-use** (``check_plan``): a planned value is read only after an instruction wrote it, or it is an input
  (with jumps, on every path: ``formats.control_flow.check_paths``);
  kernel and delegate outputs are planned or mutable-buffer values (or views of written ones), view outputs are
  aliases;
  inputs are planned tensors (or the plain values export specialised), each named once; every output is defined;
  one method names each mutable buffer once.

Pure Python on the plan's dataclasses (no torch), so the compiler and the runtime both use it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from edgetorch.errors import ProgramFormatError
from edgetorch.formats import control_flow
from edgetorch.formats import program as pf
from edgetorch.formats._program_checks import _overlaps

__all__ = ["tensor_ids", "elements_overlap", "live_ranges", "find_overlap", "check_io", "check_plan"]

_SCALAR_INPUTS = (bool, int, float, str, type(None), pf.SymIntV)


def tensor_ids(values: list, vid: int) -> list[int]:
    """The tensor values an argument names: itself, or the items of a tensor list (None items left out)."""
    v = values[vid] if 0 <= vid < len(values) else None
    if isinstance(v, pf.TensorDef):
        return [vid]
    if isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)):
        return [i for i in v.items if i >= 0]
    return []


def _tensor_args(plan: pf.PlanDef) -> list[list[int]]:
    """Per instruction, the tensor values its arguments name (tensor lists expanded), computed once."""
    values = plan.values
    expand: list[tuple[int, ...]] = []
    for vid, v in enumerate(values):
        if isinstance(v, pf.TensorDef):
            expand.append((vid,))
        elif isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)):
            expand.append(tuple(i for i in v.items if i >= 0))
        else:
            expand.append(())
    n = len(values)
    return [[t for a in ins.call.args if 0 <= a < n for t in expand[a]] for ins in plan.instructions]


def elements_overlap(sizes: list[int], strides: list[int]) -> bool:
    """Whether two elements of a layout share an address (a tensor a kernel writes must not)."""
    return _overlaps(sizes, strides)


def _is_view(call: object) -> bool:
    return isinstance(call, pf.KernelCallDef) and call.kind == pf.CALL_VIEW


def live_ranges(plan: pf.PlanDef, targs: list[list[int]] | None = None) -> dict[int, tuple[int, int]]:
    """Each planned value's [first, last] instruction, derived from the emitted instructions alone (``targs``:
    ``_tensor_args(plan)``, when the caller has it)."""
    values = plan.values
    targs = _tensor_args(plan) if targs is None else targs
    planned = {i for i, v in enumerate(values) if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED}
    root: dict[int, int] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for vid in plan.inputs:
        if vid in planned:
            first.setdefault(vid, -1)
            last[vid] = -1
    for at, ins in enumerate(plan.instructions):  # instruction order: first seen is first, last seen is last
        call = ins.call
        args = targs[at]
        if args and _is_view(call):
            r0 = root.get(args[0], args[0])
            for o in call.outputs:
                root[o] = r0
        for vid in (*args, *call.outputs):
            r = root.get(vid, vid)
            if r in planned:
                if r not in first:
                    first[r] = at
                last[r] = at
    end = len(plan.instructions)
    for vid in plan.outputs:
        r = root.get(vid, vid)
        if r in planned:
            first.setdefault(r, end)
            last[r] = end
    return {k: (first[k], last[k]) for k in first}


def find_overlap(plan: pf.PlanDef, targs: list[list[int]] | None = None
                 ) -> tuple[int, int, tuple[int, int], tuple[int, int]] | None:
    """Two planned values (``a``, ``b``, their live ranges) live at one instruction that share arena bytes, or
    None. A sweep over the instructions keeps the live values ordered by arena offset (pairwise disjoint, or the
    plan is refused), so a new value need only be compared with its neighbours: O(n log n)."""
    spans = live_ranges(plan, targs)
    order = sorted((s[0], k) for k, s in spans.items() if plan.values[k].nbytes > 0)
    active: list[tuple[int, int, int]] = []  # (arena offset, end, value), sorted by offset
    for first, k in order:
        active = [a for a in active if spans[a[2]][1] >= first]  # drop the values dead before ``first``
        v = plan.values[k]
        item = (v.arena_offset, v.arena_offset + v.nbytes, k)
        j = bisect.bisect_left(active, item)
        for other in active[max(j - 1, 0):j + 1]:
            if other[0] < item[1] and item[0] < other[1]:
                return other[2], k, spans[other[2]], spans[k]
        active.insert(j, item)
    return None


def _fail(plan: pf.PlanDef, msg: str, fld: str) -> None:
    raise ProgramFormatError(f"method '{plan.name}': {msg} (the file is inconsistent: corrupted or edited?)",
                             field=f"{plan.name}.{fld}")


def check_io(plan: pf.PlanDef) -> None:
    """Inputs are planned tensors, unplanned static ones no instruction writes (``alloc_graph_input=False``) or
    plain values, each named once; each mutable buffer is named once."""
    seen: set[int] = set()
    for j, vid in enumerate(plan.inputs):
        v = plan.values[vid]
        name = plan.input_names[j] if j < len(plan.input_names) else str(j)
        if isinstance(v, pf.TensorDef) and v.placement != pf.PLACEMENT_PLANNED and (
                v.placement != pf.PLACEMENT_DYNAMIC or v.sym_shape or v.storage_offset):  # DYNAMIC: unplanned
            _fail(plan, f"input {j} ('{name}') is a tensor of placement {v.placement}; the runtime copies inputs "
                  "into planned arena slots (or, unplanned, runs on static-shaped ones)", f"inputs[{j}]")
        if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_DYNAMIC and any(
                vid in getattr(ins.call, "outputs", ()) for ins in plan.instructions):
            _fail(plan, f"input {j} ('{name}') is unplanned but an instruction writes it", f"inputs[{j}]")
        if not isinstance(v, (pf.TensorDef, *_SCALAR_INPUTS)):
            _fail(plan, f"input {j} ('{name}') is a {type(v).__name__}, which no caller can pass", f"inputs[{j}]")
        if isinstance(v, pf.TensorDef) and vid in seen:
            _fail(plan, f"input {j} ('{name}') names value {vid}, as an earlier input does", f"inputs[{j}]")
        seen.add(vid)
    names = [mb.name for mb in plan.mutable_buffers]
    for j, n in enumerate(names):
        if n in names[:j]:
            _fail(plan, f"mutable buffer '{n}' is named twice (two entries would share one state)",
                  f"mutable_buffers[{j}].name")


def _reads(plan: pf.PlanDef, targs: list[list[int]]) -> Iterator[tuple[int, list[int], list[int], bool]]:
    for k, ins in enumerate(plan.instructions):
        c = ins.call
        yield k, targs[k], c.outputs, _is_view(c)


def check_plan(plan: pf.PlanDef) -> None:
    """Def-use, output placements, inputs and buffers, then overlap; ``ProgramFormatError`` naming the value and
    the instruction at fault."""
    check_io(plan)
    vals = plan.values
    targs = _tensor_args(plan)
    root: dict[int, int] = {}
    written = {vid for vid in plan.inputs}
    made: set[int] = set()  # alias values made by a view so far
    for k, args, outs, view in _reads(plan, targs):
        for a in args:
            _check_read(plan, a, root, written, made, k)
        for o in outs:
            v = vals[o]
            if view:
                ok = isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_ALIAS
            else:  # an elementwise op may write into a dying input that is a view (of bytes already written)
                ok = isinstance(v, pf.TensorDef) and (v.placement in (pf.PLACEMENT_PLANNED, pf.PLACEMENT_MUTABLE) or (
                    v.placement == pf.PLACEMENT_ALIAS and o in made and root.get(o, o) in written))
            if not ok:
                what = "a view" if view else "a kernel or delegate call"
                _fail(plan, f"instruction {k} ({what}) writes value {o}, which is not "
                      f"{'an alias' if view else 'a planned or mutable-buffer tensor, nor a view of a written one'}",
                      f"instructions[{k}].outputs")
            if view:
                made.add(o)
                if args:
                    root[o] = root.get(args[0], args[0])
            else:
                written.add(o)
    for j, o in enumerate(plan.outputs):
        for t in tensor_ids(vals, o):
            _check_read(plan, t, root, written, made, -1 - j)
    if control_flow.has_jumps(plan):  # written before in the instruction order is not enough: on every path
        planned = {i for i, v in enumerate(vals) if isinstance(v, pf.TensorDef)
                   and v.placement == pf.PLACEMENT_PLANNED and v.nbytes > 0}
        control_flow.check_paths(plan, targs, root, planned)
    clash = find_overlap(plan, targs)
    if clash is not None:
        a, b, sa, sb = clash
        va, vb = vals[a], vals[b]
        _fail(plan, f"values {a} (arena bytes [{va.arena_offset}, {va.arena_offset + va.nbytes}), live at "
              f"instructions {sa[0]}..{sa[1]}) and {b} (bytes [{vb.arena_offset}, {vb.arena_offset + vb.nbytes}), "
              f"live at {sb[0]}..{sb[1]}) share arena bytes while both are live", f"values[{b}].arena_offset")


def _check_read(plan: pf.PlanDef, vid: int, root: dict[int, int], written: set[int], made: set[int], at: int) -> None:
    """A read by instruction ``at`` (or, for ``at < 0``, by output ``-1 - at``): of an alias a view made, and of
    bytes an instruction wrote (or an input)."""
    r = root.get(vid, vid)
    if r in written:
        return
    v = plan.values[vid]
    who, fld = (f"instruction {at}", f"instructions[{at}].args") if at >= 0 else (f"output {-1 - at}",
                                                                               f"outputs[{-1 - at}]")
    if isinstance(v, pf.TensorDef) and v.placement in (pf.PLACEMENT_ALIAS, pf.PLACEMENT_DYNAMIC) \
            and vid not in made:
        _fail(plan, f"{who} reads value {vid}, an alias no earlier view made", fld)
    rv = plan.values[r]
    if isinstance(rv, pf.TensorDef) and rv.placement == pf.PLACEMENT_PLANNED and rv.nbytes > 0:
        via = f" (through the view value {vid})" if r != vid else ""
        _fail(plan, f"{who} reads planned value {r}{via} before any instruction wrote it: its arena bytes would "
              "hold whatever the memory held", fld)
