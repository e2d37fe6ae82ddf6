"""Numeric debugging across the executions of a program: every call recorded in an ETDump (e.g. an LLM's
``prefill`` then one ``decode`` per generated token), with the mutable-buffer state (KV caches) carried over.

Every execute block of an ETDump recorded with a debug buffer starts with the call's inputs (``input:<name>``
debug events, see ``formats.etdump.is_input_event``). ``GenerationReplay`` replays the reference program of
each method (from the ETRecord) on that same sequence of inputs, from the first execution on: the buffers the
reference graphs update in place are shared by name between the methods and start from their initial values,
so the reference for execution *k* sees the state the earlier executions left, like the runtime did. The
replay goes forward once and keeps its results (gap tables, reference outputs); asking for an earlier
execution than the current position restarts it from the initial state.

Used through ``Inspector.executions``, ``calculate_numeric_gap(execution=k)``, ``generation_gaps()`` and
``first_divergence_across_executions()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import pandas as pd
import torch
import torch.fx
import torch.utils._pytree as pytree

from edgetorch.devtools.inspector.comparators import NumericalComparatorBase, get_comparator, larger_is_worse
from edgetorch.devtools.inspector.events import _signature
from edgetorch.devtools.inspector.numeric_gap import (
    RuntimeEntry,
    compare_values,
    compute_numeric_gap,
    reference_handles,
    resolve_entry,
    runtime_entries,
    runtime_values,
)
from edgetorch.errors import InspectorError
from edgetorch.formats import etdump as ed


class InspectorView(Protocol):
    """What the replay reads of an Inspector (``inspector.Inspector`` is one): its ETDump and event blocks, the
    logged values, the reference programs and the nodes of each debug handle."""

    event_blocks: list[Any]
    observer_effects: list[Any]
    last_gap_coverage: Any

    @property
    def etdump(self) -> ed.ETDump: ...

    def inflate(self, value: ed.Value) -> Any: ...

    def nodes_by_handle(self, method: str) -> dict[int, list[Any]]: ...

    def reference_module(self, method: str, reference_graph: str | None = None
                         ) -> tuple[torch.fx.GraphModule, str]: ...

    def first_divergence(self, df: pd.DataFrame, threshold: float) -> pd.Series | None: ...


class Execution(NamedTuple):
    """One recorded call: its global ``index`` (execution order across methods), its ``method`` and ``run``,
    its index among the calls of that method."""

    index: int
    method: str
    run: int


@dataclass
class ExecutionRecord:
    """Where an execution's events are in the Inspector, and the inputs and outputs it logged."""

    execution: Execution
    block: int  # index in ``Inspector.event_blocks``
    block_run: int  # run index inside that block
    inputs: list[Any] | None  # the logged flat inputs (None: the ETDump did not record them)
    outputs: list[Any]  # the logged program outputs


@dataclass
class Divergence:
    """The first execution, and in it the first op (``row`` of its gap table), whose gap crosses a threshold."""

    execution: int
    method: str
    run: int
    row: pd.Series
    table: pd.DataFrame

    @property
    def op(self) -> list[str]:
        """The reference (ATen) ops of the diverging row."""
        return list(self.row["aot_ops"])


def _sorted_values(values: list[tuple[int, ed.Value]], inflate: Any) -> list[Any]:
    return [inflate(v) for _, v in sorted(values, key=lambda x: x[0])]


def execution_records(etdump: ed.ETDump, inflate: Any) -> list[ExecutionRecord]:
    """One record per execute block, in execution order, located as ``gen_event_blocks`` groups them."""
    keys: dict[tuple, int] = {}
    seen: dict[tuple, int] = {}
    per_method: dict[str, int] = {}
    records = []
    for run in etdump.run_data:
        if not run.events:
            continue
        key = (run.name, run.method, _signature(run))
        block = keys.setdefault(key, len(keys))
        block_run = seen.get(key, 0)
        seen[key] = block_run + 1
        if run.name != ed.EXECUTE_BLOCK:
            continue
        method = run.method or "forward"
        ins: list[tuple[int, ed.Value]] = []
        outs: list[tuple[int, ed.Value]] = []
        for e in run.events:
            d = e.debug_event
            if d is None:
                continue
            if ed.is_input_event(d):
                ins.append((d.output_index, d.debug_entry))
            elif d.debug_entry.output:
                outs.append((d.output_index, d.debug_entry))
        ex = Execution(len(records), method, per_method.get(method, 0))
        per_method[method] = ex.run + 1
        records.append(ExecutionRecord(ex, block, block_run, _sorted_values(ins, inflate) if ins else None,
                                       _sorted_values(outs, inflate)))
    return records


def _inputs_from_record(records: list[ExecutionRecord], etrecord: Any) -> None:
    """An ETDump that logged no inputs (the reference runtime's): execution k of a method takes the ETRecord's
    k-th representative input of that method, when the record holds exactly one per execution of it."""
    reps = getattr(etrecord, "representative_inputs", None) or {}
    runs: dict[str, int] = {}
    for r in records:
        runs[r.execution.method] = runs.get(r.execution.method, 0) + 1
    for r in records:
        samples = reps.get(r.execution.method) or []
        if r.inputs is None and len(samples) == runs[r.execution.method]:
            r.inputs = list(samples[r.execution.run])


def _state_targets(gm: torch.fx.GraphModule) -> list[str]:
    """The attributes (buffers) the graph updates in place: its mutable state."""
    targets = []
    for n in gm.graph.nodes:
        if n.op == "get_attr" and any(isinstance(u.target, torch._ops.OpOverload) and u.target._schema.is_mutable
                                      for u in n.users):
            targets.append(str(n.target))
    return list(dict.fromkeys(targets))


def _state_writers(gm: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    """Per state attribute, the last in-place op writing it (the op whose output is the buffer's new value)."""
    writers: dict[str, torch.fx.Node] = {}
    for n in gm.graph.nodes:
        t = n.target
        if n.op != "call_function" or not (isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable):
            continue
        for i, a in enumerate(t._schema.arguments):
            v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
            if a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.fx.Node) \
                    and v.op == "get_attr":
                writers[str(v.target)] = n
    return writers


def logged_state(gm: torch.fx.GraphModule, entries: list[RuntimeEntry]) -> dict[str, torch.Tensor]:
    """The runtime's values of the state attributes after one run, as that run logged them (the output of the
    op writing each, finest entry first); an attribute whose writer logged nothing is left out."""
    last, _ = reference_handles(gm)
    order = {h: i for i, h in enumerate(last)}
    by_node = {n: h for h, n in last.items()}
    handle_of = {}
    for target, w in _state_writers(gm).items():
        if w.target is torch.ops.aten.copy_.default and isinstance(w.args[1], torch.fx.Node):
            w = w.args[1]  # a functional graph's buffer update: copy_(buffer, new value)
        if w in by_node:
            handle_of[by_node[w]] = target
    state: dict[str, torch.Tensor] = {}
    for e in sorted(entries, key=lambda e: e.is_delegate_call):  # a kernel (or an op inside) before a call
        res = resolve_entry(e, last, order)
        if isinstance(res, str) or res[0] not in handle_of or handle_of[res[0]] in state:
            continue
        h, index = res
        want = last[h].meta.get("val")
        vals = runtime_values(e, h, index, want)
        got = vals.get(0) if isinstance(vals, dict) else None
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.numel() == want.numel():
            state[handle_of[h]] = got.reshape(want.shape)
    return state


def _owner(gm: torch.nn.Module, target: str) -> tuple[torch.nn.Module, str]:
    *path, name = target.split(".")
    return (gm.get_submodule(".".join(path)) if path else gm), name


@contextlib.contextmanager
def _bound(gm: torch.fx.GraphModule, state: dict[str, torch.Tensor]) -> Iterator[None]:
    """Points the graph's state attributes at the shared ``state`` tensors while the block runs (the graph may
    be a cached, shared module: its own attributes are restored afterwards)."""
    saved = []
    for target in _state_targets(gm):
        owner, name = _owner(gm, target)
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, state[target])
    try:
        yield
    finally:
        for owner, name, t in saved:
            setattr(owner, name, t)


def _first_tensor(v: Any) -> torch.Tensor | None:
    for x in pytree.tree_leaves(v):
        if isinstance(x, torch.Tensor):
            return x
    return None


class GenerationReplay:
    """Replays the reference programs over the recorded sequence of executions (see the module docstring)."""

    def __init__(self, inspector: InspectorView, reference_graph: str | None = None) -> None:
        self.inspector = inspector
        self.reference_graph = reference_graph
        self.records = execution_records(inspector.etdump, inspector.inflate)
        _inputs_from_record(self.records, getattr(inspector, "etrecord", None))
        self._modules: dict[str, tuple[torch.fx.GraphModule, str]] = {}
        self._initial: dict[str, torch.Tensor] = {}
        self._state: dict[str, torch.Tensor] = {}
        #: the runtime's state before ``_position``, as the executions logged it (the reference's where not)
        self._rt_state: dict[str, torch.Tensor] = {}
        self._position = 0  # the state is the one before this execution
        self.reference_outputs: dict[int, Any] = {}
        self._tables: dict[tuple, pd.DataFrame] = {}

    # -- the reference programs and their shared state ------------------------------------------------------
    def _prepare(self) -> None:
        """Builds the reference of every method run, of one kind for all (buffers are shared by attribute
        name, which differs between ATen and edge graphs): the ATen programs when each method has one with
        all its debug handles, else the edge programs. Then the initial state, from the first graph naming
        each buffer."""
        methods = list(dict.fromkeys(r.execution.method for r in self.records))
        mods = {m: self.inspector.reference_module(m, self.reference_graph) for m in methods}
        if self.reference_graph is None and len({used for _, used in mods.values()}) > 1:
            mods = {m: self.inspector.reference_module(m, "edge_dialect_exported_program") for m in methods}
        for gm, _used in mods.values():
            for target in _state_targets(gm):
                if target not in self._initial:
                    owner, name = _owner(gm, target)
                    self._initial[target] = getattr(owner, name).detach().clone()
                    self._state[target] = self._initial[target].clone()
        self._rt_state = dict(self._state)
        self._modules = mods

    def module(self, method: str) -> tuple[torch.fx.GraphModule, str]:
        if not self._modules:
            self._prepare()
        return self._modules[method]

    def reset(self) -> None:
        """Back to the initial state, before the first execution."""
        for target, t in self._initial.items():
            self._state[target] = t.clone()
        self._rt_state = dict(self._state)
        self._position = 0

    def record(self, index: int) -> ExecutionRecord:
        if not 0 <= index < len(self.records):
            raise InspectorError(f"execution {index} is not in the ETDump ({len(self.records)} executions "
                                 "recorded)")
        rec = self.records[index]
        if rec.inputs is None:
            raise InspectorError(f"execution {index} ({rec.execution.method}) has no logged inputs: record the "
                                 "ETDump with a debug buffer (debug_buffer_size=... or debug_buffer_path=...)")
        return rec

    def _seek(self, index: int) -> None:
        """Advances (or restarts and advances) the replay so that the state is the one before ``index``."""
        if self._position > index:
            self.reset()
        while self._position < index:
            self._advance()

    def _advance(self) -> None:
        k = self._position
        rec = self.record(k)
        gm, _ = self.module(rec.execution.method)
        with torch.no_grad(), _bound(gm, self._state):
            self.reference_outputs[k] = gm(*pytree.tree_leaves(tuple(rec.inputs)))
        self._runtime_state_after(rec)
        self._position = k + 1

    def _runtime_state_after(self, rec: ExecutionRecord) -> None:
        """The runtime's state after ``rec``: what its state writers logged; an attribute it writes but did not
        log takes the reference's value, one it does not write keeps the runtime's."""
        gm, _ = self.module(rec.execution.method)
        logged = logged_state(gm, runtime_entries(self.inspector.event_blocks[rec.block].events, rec.block_run))
        for target in _state_writers(gm):
            if target in self._state:
                self._rt_state[target] = logged.get(target, self._state[target])

    # -- results ----------------------------------------------------------------------------------------------
    def gap_table(self, index: int, distance: str | NumericalComparatorBase = "MSE",
                  local: bool = True) -> pd.DataFrame:
        """The per-op gap table of execution ``index`` against the reference run on the state it saw."""
        key = (index, distance, local) if isinstance(distance, str) else None
        if key is not None and key in self._tables:
            return self._tables[key]
        rec = self.record(index)
        self._seek(index)
        captured: dict[str, Any] = {}
        df = self._compute(rec, get_comparator(distance), local, captured)
        self._adopt(index, captured)  # the reference output of this execution, and the state after it
        df.attrs["output_gap"] = self.output_gap(index, distance)
        if key is not None:
            self._tables[key] = df
        return df

    def _adopt(self, index: int, captured: dict[str, Any]) -> None:
        """Takes the gap walk's reference output and end state as this execution's (no second forward pass);
        falls back to a plain run when the walk could not say."""
        state = captured.get("state") or {}
        if "output" not in captured or not set(self._state) <= set(state):
            self._advance()
            return
        self.reference_outputs[index] = captured["output"]
        for target in self._state:
            self._state[target] = state[target]
        self._runtime_state_after(self.records[index])
        self._position = index + 1

    def _compute(self, rec: ExecutionRecord, comparator: NumericalComparatorBase, local: bool,
                 capture: dict[str, Any] | None = None) -> pd.DataFrame:
        insp = self.inspector
        if comparator.inspector is None:
            comparator.inspector = insp
        method = rec.execution.method
        gm, used = self.module(method)
        entries = runtime_entries(insp.event_blocks[rec.block].events, rec.block_run)
        nodes_by_h = insp.nodes_by_handle(method)
        view_only = {h for h, ns in nodes_by_h.items() if ns and all(n.is_view for n in ns)}
        with _bound(gm, self._state):
            df, cov = compute_numeric_gap(gm, tuple(pytree.tree_leaves(tuple(rec.inputs))), entries, comparator,
                                          view_only=view_only, local=local, capture=capture,
                                          runtime_state=self._rt_state)
        df.attrs.update(reference_graph=used, method=method, execution=rec.execution.index, run=rec.execution.run,
                        distance=getattr(comparator, "name", type(comparator).__name__))
        effects = [oe for oe in insp.observer_effects if oe.method == method]
        df.attrs["observer_effect"] = max((oe.max for oe in effects), default=None)
        insp.last_gap_coverage = cov
        return df

    def output_gap(self, index: int, distance: str | NumericalComparatorBase = "MSE") -> float | None:
        """Gap between the runtime's first program output of execution ``index`` (e.g. the logits) and the
        reference replay's (None when they cannot be paired)."""
        rec = self.record(index)
        if index not in self.reference_outputs:
            self._seek(index)
            self._advance()
        ref = _first_tensor(self.reference_outputs[index])
        rt = _first_tensor(rec.outputs)
        if ref is None or rt is None or ref.numel() != rt.numel() or ref.dtype != rt.dtype:
            return None
        return compare_values(get_comparator(distance), ref, rt.reshape(ref.shape))[0]


def _worst_local(df: pd.DataFrame, distance: str) -> tuple[float | None, list[str] | None]:
    worse = larger_is_worse(distance, df.attrs)
    best: tuple[float, list[str]] | None = None
    for gap, ops in zip(df["local_gap"], df["aot_ops"]):
        g = gap[0] if gap else None
        if g is None or g != g:
            continue
        if best is None or (g > best[0] if worse else g < best[0]):
            best = (float(g), list(ops))
    if best is None:
        return None, None
    return best if (best[0] != 0 or not worse) else (0.0, None)  # no op adds any error: none is the worst


def generation_gaps(replay: GenerationReplay, distance: str = "MSE") -> pd.DataFrame:
    """One row per execution: ``execution``, ``method``, ``run``, ``output_gap`` (the final output, e.g. the
    logits, against the reference replay), ``worst_local_gap`` and ``worst_op`` (the op adding the most error)."""
    rows = []
    for rec in replay.records:
        ex = rec.execution
        df = replay.gap_table(ex.index, distance)
        worst, op = _worst_local(df, df.attrs.get("distance", distance))
        rows.append({"execution": ex.index, "method": ex.method, "run": ex.run,
                     "output_gap": df.attrs.get("output_gap"), "worst_local_gap": worst, "worst_op": op})
    out = pd.DataFrame(rows, columns=["execution", "method", "run", "output_gap", "worst_local_gap", "worst_op"])
    out.attrs["distance"] = distance
    return out


def first_divergence_across_executions(replay: GenerationReplay, threshold: float,
                                       distance: str = "MSE") -> Divergence | None:
    """The first execution (in order) with a row whose gap crosses ``threshold``, and that row."""
    for rec in replay.records:
        ex = rec.execution
        df = replay.gap_table(ex.index, distance)
        row = replay.inspector.first_divergence(df, threshold)
        if row is not None:
            return Divergence(ex.index, ex.method, ex.run, row, df)
    return None


__all__ = ["Divergence", "Execution", "ExecutionRecord", "GenerationReplay", "InspectorView", "execution_records",
           "first_divergence_across_executions", "generation_gaps", "logged_state"]
