"""Event tracing for the runtime: ``ProgramTracer`` records ETDump events while a program loads and runs, and
copies every intermediate output into a debug-buffer sink (``runtime.debug_sink``: ``BufferSink``, a fixed
in-memory buffer; ``FileSink``, a stream to a named file, or to an anonymous in-memory file for
``debug_buffer_size="auto"``).

Only imported when ``load_program`` is asked for an ETDump or a debug buffer; the ``Program`` then attaches its
tracer to every method it builds as the method's ``MethodObserver`` (``runtime.observer``): the method's run
loop calls the tracer before and after each instruction. Everything that does not depend on the inputs is
worked out once per method when the tracer attaches: a plan of named steps (``_Step``: which instructions to
time, which bytes to copy from where, and for each copied tensor the first later instruction that overwrites
its arena bytes). A traced run then adds two clock reads per instruction and, per output tensor, an offset
allocation and a queue entry: a writer thread copies the bytes into the sink while the next kernels run, and
the run only waits for it before an instruction that would overwrite bytes not yet copied (and at the end of
the run). Events are kept as compact per-run records and only turned into ``formats.etdump`` objects by
``etdump()``/``write()``.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from edgetorch._fileio import atomic_write
from edgetorch.errors import EdgeTorchError
from edgetorch.formats import etdump as ed
from edgetorch.formats import program as pf
from edgetorch.formats.alignment import debug_bytes
from edgetorch.formats.control_flow import has_jumps
from edgetorch.formats.dtypes import contiguous_strides, dtype_code
from edgetorch.runtime._copy import clone
from edgetorch.runtime._shapes import SymScalar
from edgetorch.runtime.debug_sink import (  # noqa: F401 (BufferSink, MAX_DEBUG_BUFFER_BYTES: re-exported)
    MAX_DEBUG_BUFFER_BYTES,
    BufferSink,
    DebugSink,
    FileSink,
    InlineWriter,
    Writer,
    is_sink_file,
    make_sink,
)

__all__ = ["ASYNC_MIN_BYTES", "ProgramTracer"]

_STATIC_PLACEMENTS = (pf.PLACEMENT_PLANNED, pf.PLACEMENT_CONSTANT, pf.PLACEMENT_ALIAS, pf.PLACEMENT_MUTABLE)
_clock = time.perf_counter_ns
ASYNC_MIN_BYTES = 2 << 20  # runs storing less copy inline, without a writer thread


def _raw_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (0-dim and every dtype, bfloat16 included)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The address range [lo, hi) of the storage bytes a tensor covers (empty for empty tensors)."""
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    return lo, lo + (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


# ----------------------------------------------------------------------------------------------
# Per-method static trace plan
# ----------------------------------------------------------------------------------------------

@dataclass
class _Out:
    """One logged value: an instruction output or a program output."""

    index: int  # output index within the instruction (or the program)
    vid: int
    name: str
    dynamic: bool  # resolved at run time (not a fixed tensor slot)
    template: ed.Tensor | None = None  # static tensors: everything but the offset
    slot: int = -1  # static tensors with bytes: index of their offset in the run's offsets list
    scalar: Any = None  # static non-tensor values
    shared: bool = False  # a program output logged (dynamically) by the instruction that last wrote it


@dataclass(eq=False, slots=True)
class _Log:
    """What a traced run does to log one value. A static tensor: ``prepare`` (if any) first copies it into
    private staging memory, then its ``nbytes`` at ``address`` (``data`` views them) are queued as the run's
    static blob number ``mark``. A value only known at run time (``data`` None): ``prepare`` logs it."""

    prepare: Callable[[], Any] | None
    address: int = 0
    data: memoryview | None = None
    nbytes: int = 0
    mark: int = 0


@dataclass(eq=False, slots=True)
class _Step:
    """One instruction of a traced run: its profile event, the values it logs, and the blob mark the writer
    must have reached before it runs (``wait_for``; 0: no wait), because it overwrites their arena bytes."""

    instruction: int
    name: str  # the profile event's name ("native_call_addmm.out", "DELEGATE_CALL")
    delegate: bool
    outs: list[_Out] = field(default_factory=list)
    logs: list[_Log] = field(default_factory=list)
    wait_for: int = 0


class _MethodTrace:
    """What a traced run of one method does, worked out once when the tracer attaches: a ``_Step`` per
    instruction that runs (VIEW instructions ran at load), the program outputs to log, and ``run_bytes``, what
    one run stores in the debug buffer: the plan's ``debug_buffer_bytes``, which emission computed with
    ``formats.program.run_debug_bytes`` from the one list of logged values (``formats.program.logged_values``)
    plus what the delegates' ``PreprocessResult.debug_buffer_bytes`` declared."""

    def __init__(self, tracer: ProgramTracer, method: Any, log_values: bool) -> None:
        self.method = method
        self.name = method.name
        code = method.plan.instructions  # the schema's codes, not the display strings of InstructionInfo
        # with jumps, a step may not run: each output is logged when its instruction ran (never from a fixed plan)
        self.branchy = has_jumps(method.plan)
        self.steps = [_Step(i.index, i.name, isinstance(code[i.index].call, pf.DelegateCallDef))
                      for i in sorted(method.instructions, key=lambda i: i.index) if not pf.is_view(code[i.index])]
        self.by_instruction: list[_Step | None] = [None] * len(method.plan.instructions)
        for step in self.steps:
            self.by_instruction[step.instruction] = step
        self.program_outs: list[_Out] = []
        self.out_logs: list[_Log] = []
        self.num_slots = 0
        self._sizes: list[int] = []  # bytes of every tensor a run logs (upper bounds for dynamic ones)
        self._slot_of: dict[int, int] = {}  # vid -> offsets slot of a stored instruction output
        self._dynamic_of: set[int] = set()  # vids an instruction logs at run time (dynamic)
        self._staging: list[torch.Tensor] = []
        # per static blob: (step that produced it, [lo, hi) source address range or None if private)
        self._blobs: list[tuple[int, tuple[int, int] | None]] = []
        self.run_bytes = 0
        if log_values:
            self._plan_logs(tracer)
            self.run_bytes = self._planned_bytes()
            for step, need in zip(self.steps, self._needs()):
                step.wait_for = need

    def _plan_logs(self, tracer: ProgramTracer) -> None:
        """Plans the logging of the inputs (bytes only: logged at the start of every run), of every output of
        every step, and of the program outputs."""
        m = self.method
        plan = m.plan
        self._sizes.extend(pf.value_nbytes(plan, v) for v in plan.inputs)
        outputs = {i.index: i for i in m.instructions}
        for i, step in enumerate(self.steps):
            info = outputs[step.instruction]
            for j, vid in enumerate(info.outputs):
                step.outs.append(self._out(tracer, i, j, vid, info.node_name, step.instruction, step.logs))
        names = plan.output_names
        for j, vid in enumerate(plan.outputs):
            name = names[j] if j < len(names) else f"output_{j}"
            slot = self._slot_of.get(vid)
            if slot is not None:  # the bytes logged after the instruction that wrote it (still live)
                first = next(o for step in self.steps for o in step.outs if o.slot == slot)
                self.program_outs.append(_Out(j, vid, name, False, first.template, slot))
            elif vid in self._dynamic_of:  # logged at run time after its last writer: its event is reused
                self.program_outs.append(_Out(j, vid, name, True, shared=True))
            else:
                self.program_outs.append(self._out(tracer, len(self.steps), j, vid, name, -1, self.out_logs))

    def _planned_bytes(self) -> int:
        """The plan's ``debug_buffer_bytes`` (the one figure, which ``MethodMeta`` shows): the tracer logs
        exactly ``formats.program.logged_values`` (a program output an instruction logged, static or dynamic, is
        not logged again), so its own values take that figure. Never less than them: a file edited by hand may
        promise less."""
        return max(self.method.plan.debug_buffer_bytes, debug_bytes(self._sizes))

    def _out(self, tracer: ProgramTracer, step: int, j: int, vid: int, name: str, k: int, logs: list[_Log]) -> _Out:
        m = self.method
        v = m.plan.values[vid]
        cur = m.value(vid)
        reshaped = (bool(m.plan.symbols) and (bool(v.sym_shape) or v.placement == pf.PLACEMENT_ALIAS)
                    or (self.branchy and k >= 0)) if isinstance(v, pf.TensorDef) else False  # set per run
        if isinstance(v, pf.TensorDef) and v.placement in _STATIC_PLACEMENTS and isinstance(cur, torch.Tensor) \
                and not reshaped:
            return self._static_out(step, j, vid, name, cur, logs)
        if isinstance(v, pf.TensorDef) or isinstance(cur, (torch.Tensor, list, tuple)):
            if reshaped:  # reserved at its upper bound, so a fixed buffer sized by run_bytes never overflows
                self._sizes.append(v.nbytes)
            if k >= 0:
                self._dynamic_of.add(vid)
            logs.append(_Log(functools.partial(tracer._log_dynamic, self, k, j, vid, name)))
            return _Out(j, vid, name, True)
        return _Out(j, vid, name, False, scalar=cur)

    def _static_out(self, step: int, j: int, vid: int, name: str, cur: torch.Tensor, logs: list[_Log]) -> _Out:
        """A tensor with fixed storage: its bytes are queued right after the step that wrote them."""
        sizes = list(cur.shape)
        nbytes = cur.numel() * cur.element_size()
        o = _Out(j, vid, name, False, ed.Tensor(dtype_code(cur.dtype), sizes, contiguous_strides(sizes),
                                                 ed.NO_OFFSET, nbytes))
        if not nbytes:
            return o
        o.slot = self.num_slots
        self.num_slots += 1
        self._slot_of[vid] = o.slot  # the last writer: an in-place op rewrites its input's slot
        self._sizes.append(nbytes)
        mark = len(self._blobs) + 1
        if cur.is_contiguous():
            logs.append(_Log(None, cur.data_ptr(), _raw_bytes(cur), nbytes, mark))
            self._blobs.append((step, _span(cur)))
        else:  # copied into private staging memory first (kept until the run's end)
            stage = torch.empty(nbytes, dtype=torch.uint8)
            self._staging.append(stage)
            dst = stage.view(cur.dtype).view(cur.shape)
            logs.append(_Log(functools.partial(dst.copy_, cur), stage.data_ptr(), _raw_bytes(stage), nbytes, mark))
            self._blobs.append((step, None))
        return o

    def _needs(self) -> list[int]:
        """For each step, the blob mark the writer must have reached before it runs: a blob's deadline is
        the first later step writing to an address range that overlaps its source bytes."""
        written: list[list[tuple[int, int]]] = []
        outputs = {i.index: i.outputs for i in self.method.instructions}
        for step in self.steps:
            spans = []
            for vid in outputs[step.instruction]:
                t = self.method.value(vid)
                if isinstance(t, torch.Tensor) and t.numel():
                    spans.append(_span(t))
            written.append(spans)
        by_step: dict[int, list[tuple[int, int, int]]] = {}
        for mark, (step, rng) in enumerate(self._blobs, 1):
            if rng is not None:
                by_step.setdefault(step, []).append((rng[0], rng[1], mark))
        needs, pending, reached = [], [], 0
        for i, spans in enumerate(written):
            need = 0
            if pending and spans:
                keep = []
                for lo, hi, mark in pending:
                    if any(lo < whi and wlo < hi for wlo, whi in spans):
                        need = max(need, mark)
                    else:
                        keep.append((lo, hi, mark))
                pending = keep
            needs.append(need if need > reached else 0)
            reached = max(reached, need)
            pending.extend(by_step.get(i, ()))
        return needs


# ----------------------------------------------------------------------------------------------
# Recorded runs
# ----------------------------------------------------------------------------------------------

@dataclass
class _ExecRun:
    trace: _MethodTrace
    bundled_input_index: int
    times: list[int] = field(default_factory=list)  # (start, end) per step, in step order
    offsets: list[int] = field(default_factory=list)  # one per stored static tensor, in logging order
    extra: dict[int, list[ed.Event]] = field(default_factory=dict)  # instruction id -> delegate/dynamic events
    inputs: list[ed.Event] = field(default_factory=list)  # one debug event per method input
    dynamic: dict[int, ed.Value] = field(default_factory=dict)  # vid -> value its last writer logged
    ran: list[int] = field(default_factory=list)  # a method with jumps: the instructions that ran, in order
    start: int = 0
    end: int = 0

    def _debug(self, o: _Out, chain: int, k: int, output: bool) -> ed.Event:
        """The debug event of a value with a static plan (dynamic ones were recorded in ``extra``)."""
        if o.template is not None:
            t = o.template
            off = self.offsets[o.slot] if o.slot >= 0 else ed.NO_OFFSET
            value = ed.Value(ed.ValueType.Tensor, tensor=ed.Tensor(t.scalar_type, t.sizes, t.strides, off, t.nbytes),
                             output=output)
        else:
            value = _scalar_value(o.scalar)
            value.output = output
        return ed.Event(debug_event=ed.DebugEvent(chain, k, -1, "", value, o.index, o.name))

    def to_run_data(self) -> ed.RunData:
        mt, times = self.trace, self.times
        events: list[ed.Event] = list(self.inputs)
        steps = [mt.by_instruction[k] for k in self.ran] if mt.branchy else mt.steps  # the steps that ran
        for i, step in enumerate(steps):
            k = step.instruction
            events.append(ed.Event(profile_event=ed.ProfileEvent(step.name, 0, k, start_time=times[2 * i],
                                                                 end_time=times[2 * i + 1])))
            events.extend(self.extra.get(k, ()))
            events.extend(self._debug(o, 0, k, False) for o in step.outs if not o.dynamic)
        events.extend(self._debug(o, -1, -1, True) for o in mt.program_outs if not o.dynamic)
        events.extend(ed.Event(debug_event=ed.DebugEvent(-1, -1, -1, "", replace(self.dynamic[o.vid], output=True),
                                                         o.index, o.name)) for o in mt.program_outs
                      if o.shared and o.vid in self.dynamic)  # (with jumps, its writer may not have run)
        events.extend(self.extra.get(-1, ()))
        events.append(ed.Event(profile_event=ed.ProfileEvent(ed.METHOD_EXECUTE, -1, -1, start_time=self.start,
                                                             end_time=self.end)))
        return ed.RunData(ed.EXECUTE_BLOCK, mt.name, self.bundled_input_index, events)


def _scalar_value(v: Any) -> ed.Value:
    if v is None:
        return ed.Value(ed.ValueType.Null)
    if isinstance(v, bool):
        return ed.Value(ed.ValueType.Bool, bool_value=v)
    if isinstance(v, int):
        return ed.Value(ed.ValueType.Int, int_value=v)
    if isinstance(v, float):
        return ed.Value(ed.ValueType.Double, double_value=v)
    if isinstance(v, str):
        return ed.Value(ed.ValueType.String, string_value=v)
    raise TypeError(f"cannot log a value of type {type(v).__name__} in an ETDump")


def _no_stamp(t: int) -> None:
    pass


def _stop(writer: Writer | InlineWriter) -> None:
    """Ends a failed run's writer; its own error, if any, is dropped for the run's."""
    try:
        writer.finish()
    except BaseException:
        pass


# ----------------------------------------------------------------------------------------------
# The tracer
# ----------------------------------------------------------------------------------------------

class ProgramTracer:
    """Records an ETDump for one loaded program: a "load" block per method it attaches to and an "Execute"
    block per ``Method.execute``, with a profile event per instruction and, when a debug buffer is configured,
    a debug event per instruction output and per program output (tensor bytes go to the sink).

    It is the ``MethodObserver`` (``runtime.observer``) of every method of its program, and the
    ``DelegateEvents`` a backend is handed while its DELEGATE_CALL runs. It reads only public ``Method`` and
    ``Program`` API.

    ``debug_buffer_size``: 0 (profiling only), an int (fixed in-memory buffer of that many bytes, kept across
    runs until full) or "auto" (in memory, grows by what each run needs). ``debug_buffer_path``: stream the
    tensor bytes to that file instead (no size limit unless ``debug_buffer_size`` is an int > 0).
    """

    def __init__(self, program: Any, debug_buffer_size: int | str = 0,
                 debug_buffer_path: str | os.PathLike | None = None) -> None:
        self._program = program
        self._sink = make_sink(debug_buffer_size, debug_buffer_path)
        self._traces: dict[str, _MethodTrace] = {}
        self._runs: list[_ExecRun | ed.RunData] = []
        self._bundled_input_index = -1
        self.run_id = ed.new_run_id()  # identity of this recording: in the ETDump and the debug buffer trailer
        self._lent: dict[int, tuple[int, int]] = {}  # data_ptr -> (offset, nbytes) lent to a delegate this run
        # set by each run that logs values: a blob's offset comes from ``_alloc``, is noted in the run by
        # ``_note`` and the blob is queued for the writer by ``_put``
        self._alloc: Callable[[int], int] | None = None
        self._note: Callable[[int], None] | None = None
        self._put: Callable[[tuple], None] | None = None
        self._run_lock = threading.RLock()  # one traced run at a time per program (begin_run .. end_run)
        self._idle()

    def _idle(self) -> None:
        """No run in progress: forgets the state of the last one."""
        self._run: _ExecRun | None = None
        self._ran: Callable[[int], None] | None = None  # a method with jumps: notes each instruction that runs
        self._stamp: Callable[[int], None] = _no_stamp  # appends a clock read to the run's times
        self._steps: list[_Step | None] = []  # the running method's steps, by instruction id
        self._writer: Writer | InlineWriter | None = None  # the running debug-buffer writer
        self._mark = 0  # the sink's used bytes when the run began (a failed run rolls back to it)
        self._delegate_k = -1  # instruction id of the DELEGATE_CALL in progress
        self._lent.clear()

    # -- configuration ------------------------------------------------------------------------------
    @property
    def sink(self) -> DebugSink | None:
        return self._sink

    @property
    def logs_intermediates(self) -> bool:
        return self._sink is not None

    def set_bundled_input_index(self, index: int) -> None:
        """Tags the following runs with the bundled test-case index they ran (-1: none)."""
        self._bundled_input_index = int(index)

    def required_debug_buffer_bytes(self, method_name: str) -> int:
        """Bytes one run of ``method_name`` stores in the debug buffer: the plan's ``debug_buffer_bytes``
        (``formats.program.run_debug_bytes`` at emission: every value of ``formats.program.logged_values``, 64-byte
        aligned, plus what its delegates' ``PreprocessResult`` declared), known before the method loads. A fixed
        ``debug_buffer_size`` must be at least runs x this."""
        mt = self._traces.get(method_name)
        if mt is not None:
            return mt.run_bytes
        return self._program.plan(method_name).debug_buffer_bytes

    # -- attaching -----------------------------------------------------------------------------------
    def attach(self, method: Any, init_span: tuple[int, int] | None = None) -> None:
        """Becomes ``method``'s observer, planning what its runs log. ``init_span``: the ``perf_counter_ns``
        interval its construction took, recorded as a "load" block ("Method::init", and "Program::load_method"
        from its start to the end of this call)."""
        mt = _MethodTrace(self, method, self._sink is not None)
        self._traces[method.name] = mt
        method.observer = self
        if init_span is not None:
            t0, t1 = init_span
            self._runs.append(ed.RunData(ed.LOAD_BLOCK, method.name, -1, [
                ed.Event(profile_event=ed.ProfileEvent(ed.METHOD_INIT, start_time=t0, end_time=t1)),
                ed.Event(profile_event=ed.ProfileEvent(ed.PROGRAM_LOAD_METHOD, start_time=t0,
                                                       end_time=time.perf_counter_ns())),
            ]))

    def _trace_for(self, method: Any) -> _MethodTrace:
        mt = self._traces.get(method.name)
        if mt is None or mt.method is not method:  # a Method made the observer by hand
            mt = self._traces[method.name] = _MethodTrace(self, method, self._sink is not None)
        return mt

    # -- MethodObserver ------------------------------------------------------------------------------
    def begin_run(self, method: Any) -> None:
        """Starts an "Execute" block: reserves the run's bytes (or raises ``DebugBufferOverflowError`` before
        anything is stored), starts the writer and logs the inputs. One run at a time per program: the tracer
        (its sink, writer and current run) is the program's, shared by its methods, so a run of another method
        on another thread waits here until ``end_run`` (a per-Method lock alone let two runs interleave)."""
        self._run_lock.acquire()
        try:
            self._begin_run(method)
        except BaseException:
            self._run_lock.release()
            raise

    def _begin_run(self, method: Any) -> None:
        mt = self._trace_for(method)
        run = _ExecRun(mt, self._bundled_input_index)
        sink = self._sink
        if sink is not None:
            sink.method = mt.name
            sink.reserve(mt.run_bytes, mt.name)  # raises before anything of this run is allocated
            self._mark = sink.used_bytes
            self._writer = Writer(sink) if mt.run_bytes >= ASYNC_MIN_BYTES else InlineWriter(sink)
        self._run, self._steps, self._stamp = run, mt.by_instruction, run.times.append
        self._ran = run.ran.append if mt.branchy else None
        if sink is not None:  # what each logged blob calls: its offset, noted in the run, queued for the writer
            self._alloc, self._note, self._put = sink.alloc, run.offsets.append, self._writer.q.put
        try:
            if sink is not None:
                self._log_inputs(mt, run)
        except BaseException:
            self._end_run(method, False)
            raise
        run.start = time.perf_counter_ns()

    def before_instruction(self, k: int) -> None:
        step = self._steps[k]
        need = step.wait_for
        if need and self._writer.done < need:
            self._writer.wait(need)  # the instruction overwrites arena bytes not yet copied
        if step.delegate:
            self._delegate_k = k
        if self._ran is not None:
            self._ran(k)
        self._stamp(_clock())

    def after_instruction(self, k: int) -> None:
        self._stamp(_clock())
        step = self._steps[k]
        if step.delegate:
            self._delegate_k = -1
        if step.logs:
            self._log(step.logs)

    def end_run(self, method: Any, ok: bool) -> None:
        """Logs the program outputs and waits for the writer (a successful run), or drops everything the run
        stored (a failed one); then records the block and lets the next run of the program begin."""
        try:
            self._end_run(method, ok)
        finally:
            self._run_lock.release()

    def _end_run(self, method: Any, ok: bool) -> None:
        run, writer = self._run, self._writer
        try:
            if ok and writer is not None:
                self._log(run.trace.out_logs)
                self._writer = None
                writer.finish()
            run.end = time.perf_counter_ns()
        except BaseException:
            ok = False
            raise
        finally:
            if not ok and writer is not None:
                _stop(writer)
                self._sink.rollback(self._mark)
            self._idle()
        if ok:
            self._runs.append(run)

    def _log(self, logs: list[_Log]) -> None:
        """Runs a step's logs: static blobs get their offset and are queued for the writer."""
        alloc, note, put = self._alloc, self._note, self._put
        for lg in logs:
            if lg.prepare is not None:
                lg.prepare()
            if lg.data is not None:
                off = alloc(lg.nbytes)
                note(off)
                put((off, lg.address, lg.data, None, lg.mark))

    def _log_inputs(self, mt: _MethodTrace, run: _ExecRun) -> None:
        """Logs the method's flat inputs of this call (copied in already) as ``input:<name>`` debug events."""
        plan = mt.method.plan
        names = plan.input_names
        for j, vid in enumerate(plan.inputs):
            v = mt.method.value(vid)
            v = v.value if isinstance(v, SymScalar) else v
            name = ed.INPUT_EVENT_PREFIX + (names[j] if j < len(names) else f"input_{j}")
            run.inputs.append(ed.Event(debug_event=ed.DebugEvent(
                ed.INPUT_INSTRUCTION_ID, ed.INPUT_INSTRUCTION_ID, -1, "", self._value(v), j, name)))

    def _store(self, t: torch.Tensor, snapshot: bool = True) -> ed.Tensor:
        """Queues a copy of a tensor only known at run time. ``snapshot``: copy it first (single-threaded)
        into memory of its own, as its storage may change before the writer gets to it; without, a contiguous
        tensor is queued as it is (its owner promises to leave it alone until the run ends)."""
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        sizes = list(t.shape)
        nbytes = t.numel() * t.element_size()
        plain = t.is_contiguous() and not (t.is_conj() or t.is_neg())  # its storage bytes are its values
        lent = self._lent.get(t.data_ptr()) if plain and not snapshot and nbytes else None
        if lent is not None and lent[1] == nbytes:
            # written in place by the delegate into memory this tracer lent it: nothing to copy
            return ed.Tensor(dtype_code(t.dtype), sizes, contiguous_strides(sizes), lent[0], nbytes)
        if snapshot or not plain:
            t = clone(t)
        off = ed.NO_OFFSET
        if nbytes:
            off = self._sink.alloc(nbytes)
            self._writer.q.put((off, t.data_ptr(), _raw_bytes(t), t, 0))
        return ed.Tensor(dtype_code(t.dtype), sizes, contiguous_strides(sizes), off, nbytes)

    def _value(self, v: Any, snapshot: bool = True) -> ed.Value:
        if isinstance(v, torch.Tensor):
            return ed.Value(ed.ValueType.Tensor, tensor=self._store(v, snapshot))
        if isinstance(v, (list, tuple)) and all(isinstance(x, torch.Tensor) for x in v):
            return ed.Value(ed.ValueType.TensorList, tensor_list=[self._store(x, snapshot) for x in v])
        return _scalar_value(v)

    def _log_dynamic(self, mt: _MethodTrace, k: int, j: int, vid: int, name: str) -> None:
        value = self._value(mt.method.value(vid))
        chain = 0 if k >= 0 else -1
        value.output = k < 0
        if k >= 0:
            self._run.dynamic[vid] = value
        self._run.extra.setdefault(k, []).append(
            ed.Event(debug_event=ed.DebugEvent(chain, k, -1, "", value, j, name)))

    # -- delegate API --------------------------------------------------------------------------------
    def _delegate_ids(self, name_or_id: int | str, api: str) -> tuple[int, str]:
        if self._run is None or self._delegate_k < 0:
            raise EdgeTorchError(f"tracer.{api} may only be called by a backend while its DELEGATE_CALL "
                                 "instruction executes")
        if isinstance(name_or_id, bool) or not isinstance(name_or_id, (int, str)):
            raise TypeError(f"delegate debug identifier must be an int or a str, got {name_or_id!r}")
        if isinstance(name_or_id, int):
            if name_or_id < 0:
                raise ValueError(f"delegate debug identifier must be >= 0, got {name_or_id}")
            return name_or_id, ""
        if not name_or_id:
            raise ValueError("delegate debug identifier must not be empty")
        return -1, name_or_id

    def log_delegate_profile(self, name_or_id: int | str, start_ns: int, end_ns: int,
                             metadata: bytes = b"") -> None:
        """Records a backend-internal timed event inside the running DELEGATE_CALL (times in ns, or in the
        backend's own unit; ``metadata`` is kept as opaque bytes)."""
        id_int, id_str = self._delegate_ids(name_or_id, "log_delegate_profile")
        k = self._delegate_k
        self._run.extra.setdefault(k, []).append(ed.Event(profile_event=ed.ProfileEvent(
            str(name_or_id), 0, k, id_int, id_str, bytes(metadata), int(start_ns), int(end_ns))))

    def delegate_output_buffer(self, shape: list[int] | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """A contiguous tensor in the debug buffer itself that the running DELEGATE_CALL may fill (e.g. bind
        as an output of its engine) and then log with ``log_delegate_output(..., snapshot=False)`` at no copy.
        None when there is nothing to lend (no debug buffer, a file sink, an empty tensor): log a tensor of the
        backend's own then. Lent memory is only valid until the run ends."""
        self._delegate_ids(0, "delegate_output_buffer")
        sink = self._sink
        if sink is None:
            return None
        nbytes = 1
        for d in shape:
            nbytes *= int(d)
        nbytes *= dtype.itemsize
        lent = sink.lend(nbytes)
        if lent is None:
            return None
        off, raw = lent
        t = raw.view(dtype).view(tuple(shape))
        self._lent[t.data_ptr()] = (off, nbytes)
        return t

    def log_delegate_output(self, name_or_id: int | str, value: Any, *, snapshot: bool = True) -> None:
        """Records a backend-internal output (tensor, list of tensors, int, bool, float, str) inside the
        running DELEGATE_CALL; tensor bytes go to the debug buffer. Ignored without a debug buffer.

        ``snapshot=False`` lets a backend skip the copy taken before the bytes are queued: it promises that
        the tensors' memory stays unchanged until the method run ends (e.g. buffers of its own that only its
        next run rewrites)."""
        id_int, id_str = self._delegate_ids(name_or_id, "log_delegate_output")
        if self._sink is None:
            return
        k = self._delegate_k
        self._run.extra.setdefault(k, []).append(ed.Event(debug_event=ed.DebugEvent(
            0, k, id_int, id_str, self._value(value, snapshot), 0, "")))

    # -- results -------------------------------------------------------------------------------------
    @property
    def num_runs(self) -> int:
        """Execute blocks recorded so far."""
        return sum(isinstance(r, _ExecRun) for r in self._runs)

    def etdump(self) -> ed.ETDump:
        """Everything recorded so far as an ``ETDump`` (load blocks and execute blocks in order)."""
        runs = [r.to_run_data() if isinstance(r, _ExecRun) else r for r in self._runs]
        used = self._sink.used_bytes if self._sink is not None else 0
        return ed.ETDump(ed.ETDUMP_SCHEMA_VERSION, self._program.content_hash, runs, used, self.run_id)

    def write(self, etdump_path: str | os.PathLike, debug_buffer_path: str | os.PathLike | None = None) -> None:
        """Writes the ETDump (atomically) and, when intermediates were recorded, the used prefix of the debug
        buffer. A streaming file sink needs no ``debug_buffer_path`` (its file is complete after a flush);
        given another path, the stream is copied there. The debug buffer ends with a trailer naming the program
        and this recording (``formats.etdump.DebugBufferTrailer``); the ETDump records the same run id and the
        CRC-32 of the buffer's data."""
        sink = self._sink
        crc = [-1]
        if sink is not None:
            phash, used = self._program.content_hash, sink.used_bytes
            if debug_buffer_path is not None and not is_sink_file(sink, debug_buffer_path):
                sink.flush()
                chunks = sink.chunks() if isinstance(sink, FileSink) else [sink.getvalue()]
                atomic_write(debug_buffer_path, ed.sealed_chunks(chunks, phash, self.run_id, crc))
            elif sink.path is not None:
                sink.flush()
                crc = [ed.seal_in_place(sink.path, used, phash, self.run_id)]
            elif sink.used_bytes:
                raise EdgeTorchError(
                    f"intermediate outputs were recorded ({sink.used_bytes} bytes in the in-memory debug "
                    "buffer): pass debug_buffer_path to write them next to the ETDump")
        dump = self.etdump()
        dump.debug_buffer_crc32 = crc[-1]
        atomic_write(etdump_path, [ed.serialize_etdump(dump)])

    def clear(self) -> None:
        """Forgets every recorded block and rewinds the debug buffer (methods stay loaded)."""
        self._runs.clear()
        if self._sink is not None:
            self._sink.rollback(0)

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()
