"""The activation memory profiler: a method's memory plan as a Chrome trace (``chrome://tracing``, Perfetto).

``generate_memory_trace(program_manager, "trace.json")`` writes one trace "thread" (``tid``) per instruction at
which some planned tensor is live (in instruction order; the method's inputs come first, at step -1, and its
outputs last, at step ``len(instructions)``), and on it one complete event (``ph: "X"``) per tensor live there:
``dur`` its planned bytes, ``ts`` its byte offset in the arena (``enable_memory_offsets=True``) or the running sum
of the bytes before it on that thread, ``pid`` the memory id (1: the method's one arena). The event's name and
``args`` name the node whose result the tensor holds at that step (edgetorch may write a later op's result into a
dead operand's slot), its op, module (``fqn``), source line and the bytes, plus edgetorch's ``instruction`` (the step)
and ``value`` (the value id in the plan). The layout is the reference's (``executorch.util.activation_memory_
profiler``); the figures are edgetorch's plan: the tensors placed in the arena with their planned bytes and
their live ranges from the instructions (``formats.plan_check.live_ranges``, what the loader checks the plan
against; a view's uses count as uses of the tensor it views). Mutable buffers, constants and inputs left
unplanned (``alloc_graph_input=False``) take no arena bytes and are not drawn.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from edgetorch._fileio import atomic_write
from edgetorch.errors import EdgeTorchError, MethodNotFoundError
from edgetorch.exir.program import ExecutorchProgramManager
from edgetorch.formats import program as pf
from edgetorch.formats.plan_check import live_ranges

__all__ = ["Allocation", "MemoryTraceError", "Write", "generate_memory_trace", "planned_allocations"]


class MemoryTraceError(EdgeTorchError, ValueError):
    """The memory trace cannot be drawn (not an edgetorch ``ExecutorchProgramManager``); a ``ValueError`` as the
    reference raises."""


@dataclass(frozen=True)
class Write:
    """An instruction that writes a planned tensor (an input: step -1, the input's name)."""

    instruction: int
    name: str  # the node (or input) name
    op_name: str  # "aten::relu.out", "delegate:<backend>", or the input's name
    fqn: str  # the module the node came from ("" when unknown)
    source: str


@dataclass(frozen=True)
class Allocation:
    """One planned tensor of a method: where it lies in the arena, the instructions it is live at and what writes
    it. edgetorch writes an op's result into its operand's slot when that operand is dead afterwards, so one
    tensor may hold the results of several nodes in turn (``writes``, in order)."""

    value: int  # value id in the plan
    memory_offset: int
    size_bytes: int
    first: int  # first instruction it is live at (-1: an input)
    last: int  # last one (len(instructions): a method output)
    writes: tuple[Write, ...]

    @property
    def name(self) -> str:
        return self.writes[0].name

    def write_at(self, step: int) -> Write:
        """What the tensor holds at ``step``: the last write at or before it (the first before any)."""
        held = self.writes[0]
        for w in self.writes:
            if w.instruction <= step:
                held = w
        return held


def _writes(plan: pf.PlanDef, fqns: dict[str, str]) -> dict[int, list[Write]]:
    """Each value -> the instructions that name it as an output (a tensor list's items included), in order."""
    out: dict[int, list[Write]] = {}
    for vid, name in zip(plan.inputs, plan.input_names):
        out.setdefault(vid, []).append(Write(-1, name, name, fqns.get(name, ""), ""))
    for at, ins in enumerate(plan.instructions):
        for o in ins.call.outputs:
            v = plan.values[o] if 0 <= o < len(plan.values) else None
            items = v.items if isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)) else (o,)
            name = ins.node_name or f"instruction_{at}"
            for i in items:
                out.setdefault(i, []).append(Write(at, name, _op_name(plan, ins), fqns.get(name, ""), ins.source))
    return out


def _op_name(plan: pf.PlanDef, ins: pf.InstructionDef) -> str:
    call = ins.call
    if isinstance(call, pf.KernelCallDef):
        op = plan.operators[call.op_index]
        return f"{op.name}.{op.overload or 'default'}"
    return f"delegate:{plan.delegates[call.delegate_index].backend_id}"


def _module_paths(manager: ExecutorchProgramManager, method: str) -> dict[str, str]:
    """Node name -> the innermost module it came from (``nn_module_stack``), from the method's edge program."""
    try:
        graph = manager.exported_program(method).graph
    except Exception:  # a manager without its edge programs: no module paths
        return {}
    paths = {}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            paths[node.name] = str(list(stack.values())[-1][0])
    return paths


def planned_allocations(executorch_program_manager: ExecutorchProgramManager,
                        method_name: str = "forward") -> list[Allocation]:
    """Every tensor of ``method_name`` placed in the arena (bytes > 0), ordered by first live instruction."""
    if not isinstance(executorch_program_manager, ExecutorchProgramManager):
        raise MemoryTraceError("generate_memory_trace expects an edgetorch ExecutorchProgramManager (what "
                               f"to_executorch returns), got {type(executorch_program_manager).__name__}")
    plans = {p.name: p for p in executorch_program_manager.program.plans}
    if method_name not in plans:
        raise MethodNotFoundError(f"method '{method_name}' is not in the program; it has {sorted(plans)}")
    plan = plans[method_name]
    writes = _writes(plan, _module_paths(executorch_program_manager, method_name))
    out = []
    for vid, (first, last) in sorted(live_ranges(plan).items(), key=lambda kv: (kv[1][0], kv[0])):
        v = plan.values[vid]
        if v.nbytes > 0:
            ws = writes.get(vid) or [Write(first, f"value_{vid}", f"value_{vid}", "", "")]
            out.append(Allocation(vid, v.arena_offset, v.nbytes, first, last, tuple(ws)))
    return out


def generate_memory_trace(executorch_program_manager: ExecutorchProgramManager,
                          chrome_trace_filename: str | os.PathLike, enable_memory_offsets: bool = False,
                          method_name: str = "forward", ommit_metadata: bool = False) -> None:
    """Writes ``method_name``'s memory plan as a Chrome trace JSON (``{"traceEvents": [...]}``, see the module
    docstring) to ``chrome_trace_filename``, atomically. ``ommit_metadata`` (the reference's spelling) leaves
    ``args`` empty."""
    allocations = planned_allocations(executorch_program_manager, method_name)
    steps = sorted({t for a in allocations for t in range(a.first, a.last + 1)})
    live: dict[int, list[Allocation]] = {t: [] for t in steps}
    for a in allocations:
        for t in range(a.first, a.last + 1):
            live[t].append(a)
    events: list[dict[str, Any]] = []
    for tid, t in enumerate(steps):
        start = 0
        for a in live[t]:
            w = a.write_at(t)
            args: dict[str, Any] = {} if ommit_metadata else {
                "op_name": w.op_name, "Memory ID": 1, "fqn": w.fqn, "source": w.source, "bytes": a.size_bytes,
                "instruction": t, "value": a.value}
            events.append({"name": w.name, "cat": "memory_allocation", "ph": "X",
                           "ts": a.memory_offset if enable_memory_offsets else start, "dur": a.size_bytes,
                           "pid": 1, "tid": tid, "args": args})
            start += a.size_bytes
    text = json.dumps({"traceEvents": events}, indent=2)
    atomic_write(chrome_trace_filename, [text.encode("ascii")])
