"""The Inspector: joins an ETDump (+ debug buffer) with an ETRecord.

It links every runtime event to its debug handles, source ops, stack traces and module paths, tabulates the
profile, and computes per-op numeric gaps against the reference program. Works for every method of a
program (not only ``forward``), with an in-memory ETRecord as well as a saved one, and refuses an ETDump that
was recorded from a different program than the ETRecord describes.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import IO, Any

import pandas as pd
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from edgetorch.devtools.inspector import multisample as _multisample
from edgetorch.devtools.inspector._recording_check import check_recording
from edgetorch.devtools.inspector.comparators import NumericalComparatorBase, get_comparator
from edgetorch.devtools.inspector.events import (
    FRAMEWORK_EVENTS,
    Event,
    EventBlock,
    ObserverEffect,
    TimeScale,
    gen_event_blocks,
    observer_effects,
)
from edgetorch.devtools.inspector.numeric_gap import (
    Coverage,
    compute_numeric_gap,
    reference_handles,
    runtime_entries,
)
from edgetorch.devtools.inspector.reference_runs import fit_reference_etdump, gap_groups
from edgetorch.errors import ArtifactMismatchError, InspectorError, ObserverEffectWarning, artifact_io_error
from edgetorch.formats import etdump as ed
from edgetorch.formats.etdump_executorch import read_any_etdump
from edgetorch.formats.handles import DELEGATE_CALL, KERNEL, HandleGroup

log = logging.getLogger(__name__)

_HIDDEN_COLUMNS = ["raw", "delegate_debug_identifier", "stack_traces", "module_hierarchy", "debug_data"]


class Inspector:
    """Reads an ETDump and (optionally) an ETRecord; see the module docstring.

    ``delegate_time_scale_converter(event name, time)``: converts the start and end times of events inside a
    delegate (which may count in another unit) to ``target_time_scale``; ``delegate_metadata_parser(bytes)``:
    parses their debug metadata (``Event.delegate_debug_metadatas``, the ``delegate_debug_metadata`` column of
    ``to_dataframe(include_delegate_debug_data=True)``); ``enable_module_hierarchy``: links each event to the
    module path of its ops (the ``module_hierarchy`` column, ``find_total_for_module``)."""

    def __init__(self, etdump_path: str | os.PathLike | None = None, etdump_data: bytes | None = None,
                 etrecord: Any = None, source_time_scale: TimeScale = TimeScale.NS,
                 target_time_scale: TimeScale = TimeScale.MS, debug_buffer_path: str | os.PathLike | None = None,
                 delegate_metadata_parser: Any = None, delegate_time_scale_converter: Any = None,
                 enable_module_hierarchy: bool = True,
                 reference_graph_name: str = "edge_dialect_graph_module") -> None:
        if (etdump_path is None) == (etdump_data is None):
            raise InspectorError("give exactly one of etdump_path and etdump_data")
        if (source_time_scale == TimeScale.CYCLES) != (target_time_scale == TimeScale.CYCLES):
            raise InspectorError("CYCLES must be used for both source_time_scale and target_time_scale or neither")
        if etdump_path is not None:
            path = os.fspath(etdump_path)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                raise InspectorError(f"ETDump file not found: {path}") from None
            except OSError as e:  # a directory, no permission: a typed error naming the path
                raise artifact_io_error(e, "ETDump file", path) from None
            self._etdump = read_any_etdump(data, path)
        else:
            self._etdump = read_any_etdump(etdump_data)
        self._debug_buffer = None
        if debug_buffer_path is not None:
            from edgetorch.devtools.etdump import DebugBuffer

            self._debug_buffer = DebugBuffer(debug_buffer_path)
            self._debug_buffer.check_identity(self._etdump)  # refuses another program's or recording's buffer
        self._has_tensor_data = any(
            e.debug_event is not None and e.debug_event.debug_entry.val in (ed.ValueType.Tensor,
                                                                            ed.ValueType.TensorList)
            for r in self._etdump.run_data for e in r.events)
        if self._has_tensor_data and self._debug_buffer is None:
            log.warning("the ETDump logged intermediate tensors but no debug_buffer_path was given: "
                        "debug_data will hold None and calculate_numeric_gap is unavailable")
        self._etrecord = self._load_etrecord(etrecord)
        fit_reference_etdump(self._etdump, self._etrecord)  # a reference ETDump: methods named, delegate inputs cut
        self._check_hashes()
        check_recording(self._etdump, self._etrecord)  # every logged value as the runtime and the ETRecord say
        self.source_time_scale = source_time_scale
        self.target_time_scale = target_time_scale
        self.reference_graph_name = reference_graph_name
        self._default_reference = _default_reference(reference_graph_name, self._etrecord)
        _check_callables(delegate_metadata_parser=delegate_metadata_parser,
                         delegate_time_scale_converter=delegate_time_scale_converter)
        self.delegate_metadata_parser = delegate_metadata_parser
        self.delegate_time_scale_converter = delegate_time_scale_converter
        self.enable_module_hierarchy = bool(enable_module_hierarchy)
        self.event_blocks: list[EventBlock] = gen_event_blocks(self._etdump, self.inflate, source_time_scale,
                                                               target_time_scale, delegate_time_scale_converter,
                                                               delegate_metadata_parser)
        self._handle_nodes: dict[str, dict[int, list[torch.fx.Node]]] = {}
        self._replays: dict[str | None, Any] = {}  # see replay()
        self._float_reference: Any = None  # see float_reference
        if self._etrecord is not None:
            self._associate()
            self._attach_reference_outputs()
        self.last_gap_coverage: Coverage | None = None
        #: per delegate call that measured it: how much exposing its intermediates changed its final outputs
        self.observer_effects: list[ObserverEffect] = observer_effects(self.event_blocks)
        _warn_observer_effects(self.observer_effects)

    # -- loading -------------------------------------------------------------------------------------------
    @staticmethod
    def _load_etrecord(etrecord: Any) -> Any:
        if etrecord is None:
            return None
        from edgetorch.devtools.etrecord import ETRecord, parse_etrecord

        if isinstance(etrecord, (str, os.PathLike)):
            return parse_etrecord(etrecord)
        if isinstance(etrecord, ETRecord):
            return etrecord
        raise InspectorError(f"etrecord must be a path or an ETRecord, got {type(etrecord).__name__}")

    def _check_hashes(self) -> None:
        rec = self._etrecord
        dump_hash = self._etdump.program_hash
        rec_hash = getattr(rec, "program_hash", None) if rec is not None else None
        if rec_hash and dump_hash and rec_hash != dump_hash:
            raise ArtifactMismatchError(
                f"the ETDump was recorded from program {dump_hash[:16]}…, but the ETRecord describes program "
                f"{rec_hash[:16]}…: pair the ETDump with the ETRecord generated for the .pte that produced it")
        if self._debug_buffer is not None and self._etdump.debug_buffer_bytes:
            have = self._debug_buffer.size
            if have < self._etdump.debug_buffer_bytes:
                raise ArtifactMismatchError(
                    f"debug buffer {self._debug_buffer.path} has {have} bytes but the ETDump's tensors need "
                    f"{self._etdump.debug_buffer_bytes}: wrong or truncated debug buffer file")

    def inflate(self, value: ed.Value) -> Any:
        """The value an ETDump ``Value`` logged: a tensor read from the debug buffer (None without one), a list of
        them, or a scalar."""
        if self._debug_buffer is not None:
            return self._debug_buffer.value(value)
        if value.val == ed.ValueType.Tensor:
            return self._tensor(value.tensor)
        if value.val == ed.ValueType.TensorList:
            return [self._tensor(x) for x in value.tensor_list or []]
        from edgetorch.devtools.etdump import DebugBuffer

        return DebugBuffer(b"").value(value)  # scalars need no buffer

    def release_debug_buffer_pages(self) -> None:
        """Lets the OS drop the pages of the debug buffer file this process has read so far (values read later
        fault back in from the file): an analysis that visits a large buffer once, call by call, then holds one
        call's values at a time. Tensors already handed out stay valid. A no-op without a mapped buffer."""
        if self._debug_buffer is not None:
            self._debug_buffer.release_pages()

    def _tensor(self, t: ed.Tensor) -> torch.Tensor | None:
        if t.numel == 0:
            return torch.empty(t.sizes, dtype=t.dtype)
        if self._debug_buffer is None:
            return None
        return self._debug_buffer.tensor(t)

    # -- ETRecord association ------------------------------------------------------------------------------
    def nodes_by_handle(self, method: str) -> dict[int, list[Any]]:
        """Edge nodes per debug handle (``NodeInfo``: name, op, stack_trace, nn_module_stack, is_view)."""
        if method not in self._handle_nodes:
            table = self._etrecord.handle_table(method) if self._etrecord is not None else None
            self._handle_nodes[method] = dict(table or {})
        return self._handle_nodes[method]

    def _associate(self) -> None:
        """Gives every event its handle group, found by (instruction id, delegate debug id), then links it."""
        for block in self.event_blocks:
            groups = {g.key: g for g in (self._etrecord.handle_groups or {}).get(block.method, [])}
            nodes = self.nodes_by_handle(block.method)
            gap = gap_groups(groups.values()) if self._etrecord.producer == "executorch" else {}
            for ev in block.events:
                did = ev.delegate_debug_identifier if ev.is_delegated_op else None
                g = groups.get((ev.instruction_id, did)) or (did is not None and groups.get((ev.instruction_id,
                                                                                             str(did))))
                if g and ev.name not in FRAMEWORK_EVENTS:
                    self._link(ev, g, nodes)
                    if ev.name == ed.OPERATOR_CALL:  # the reference's kernel scope: its kernel's event has the values
                        ev.handle_group = None
                    elif g in gap:  # split between a delegate call and kernels (reference_runs.gap_groups)
                        ev.handle_group = gap[g]
                elif did is not None and (call := groups.get((ev.instruction_id, None))) is not None:
                    ev.delegate_backend_name = call.backend  # a backend's own event (no handles): its backend

    def _attach_reference_outputs(self) -> None:
        """A bundled run's block gets the expected outputs the ETRecord recorded for its input."""
        for block in self.event_blocks:
            refs = (self._etrecord.reference_outputs or {}).get(block.method)
            if refs and block.bundled_input_index is not None and block.bundled_input_index < len(refs):
                block.reference_output = refs[block.bundled_input_index]

    def _link(self, ev: Event, g: HandleGroup, nodes_by_h: dict[int, list[Any]]) -> None:
        """The event's handles, backend, and the ops, stack traces and module paths of the nodes they name."""
        ev.handle_group, ev.delegate_backend_name = g, g.backend
        ev.debug_handles = g.handles[0] if g.kind == KERNEL else list(g.handles)
        ev.num_outputs = len(g.outputs) if g.kind == DELEGATE_CALL and g.outputs is not None else ev.num_outputs
        for n in (n for h in g.handles for n in nodes_by_h.get(h, [])):
            ev.op_types.append(n.op)
            if n.stack_trace:
                ev.stack_traces.setdefault(n.name, n.stack_trace)
            if n.nn_module_stack is not None and self.enable_module_hierarchy:
                ev.module_hierarchy.setdefault(n.name, n.nn_module_stack)

    # -- tables --------------------------------------------------------------------------------------------
    def to_dataframe(self, include_units: bool = True, include_delegate_debug_data: bool = False) -> pd.DataFrame:
        frames = [b.to_dataframe(include_units) for b in self.event_blocks]
        if not frames:
            return pd.DataFrame()
        df = pd.concat(frames, ignore_index=True)
        if not self.enable_module_hierarchy:
            df = df.drop(columns=["module_hierarchy"])
        if include_delegate_debug_data:
            md = [e.delegate_debug_metadatas for b in self.event_blocks for e in b.events]
            df["delegate_debug_metadata"] = md
        return df

    def _display_frame(self, include_units: bool, include_delegate_debug_data: bool = False) -> pd.DataFrame:
        df = self.to_dataframe(include_units, include_delegate_debug_data)
        if df.empty:
            return df
        if self._etdump.producer == "executorch":  # as the reference prints: its OPERATOR_CALL scopes hidden
            df = df[df["event_name"] != ed.OPERATOR_CALL].reset_index(drop=True)
        return df.drop(columns=[c for c in _HIDDEN_COLUMNS if c in df.columns])

    def print_data_tabular(self, file: IO[str] = sys.stdout, include_units: bool = True,
                           include_delegate_debug_data: bool = False, rows: int = 0) -> None:
        """Prints the profile as a table (rich); ``rows`` > 0 prints the first ``rows`` rows and says how many
        more there are."""
        from rich.console import Console
        from rich.table import Table

        df = self._display_frame(include_units, include_delegate_debug_data)
        more = len(df) - rows if 0 < rows < len(df) else 0
        if more:
            df = df.iloc[:rows]
        table = Table(title="edgetorch profile", show_lines=False,
                      caption=f"... {more} more rows (--rows 0 shows all)" if more else None)
        for c in df.columns:
            if c in ("event_name", "event_block_name"):
                table.add_column(str(c), no_wrap=True)
            else:
                table.add_column(str(c), overflow="fold")
        from rich.markup import escape

        for _, row in df.iterrows():
            table.add_row(*[escape(_fmt(v)) for v in row.tolist()])
        Console(file=file, width=240).print(table)

    def save_data_to_tsv(self, file: str | os.PathLike | IO[str], include_units: bool = True,
                         include_delegate_debug_data: bool = False) -> None:
        """Writes the printed profile table as tab-separated values (the reference's keywords: time units in the
        headers, and a ``delegate_debug_metadata`` column)."""
        df = self._display_frame(include_units, include_delegate_debug_data)
        if isinstance(file, (str, os.PathLike)):
            from edgetorch._fileio import atomic_write

            atomic_write(file, [df.to_csv(sep="\t", index=False).encode()])
        else:
            df.to_csv(file, sep="\t", index=False)

    def get_op_list(self, event_block: str, show_delegated_ops: bool | None = True) -> dict[str, list[Event]]:
        """{op type: [events running it]} of the event block named ``event_block`` (every block of that name),
        framework events and the reference's ``OPERATOR_CALL`` scopes left out; ``show_delegated_ops=False``
        leaves out the ops a backend logs inside a delegate call. Raises ``InspectorError`` for an unknown
        block name."""
        blocks = [b for b in self.event_blocks if b.name == event_block]
        if not blocks:
            raise InspectorError(f"no event block named {event_block!r}; blocks: "
                                 f"{sorted({b.name for b in self.event_blocks})}")
        ops: dict[str, list[Event]] = {}
        for ev in (e for b in blocks for e in b.events):
            if ev.name in FRAMEWORK_EVENTS or ev.name == ed.OPERATOR_CALL or (ev.is_delegated_op
                                                                            and not show_delegated_ops):
                continue
            for op in dict.fromkeys(ev.op_types):
                ops.setdefault(op, []).append(ev)
        return ops

    def write_tensorboard_artifact(self, path: str | os.PathLike, gaps: bool | None = None) -> dict[str, int]:
        """Writes the profile and, when they can be computed, the numeric gaps as TensorBoard event files in the
        directory ``path`` (``inspector.tensorboard``: needs ``tensorboardX`` or ``tensorboard``; without either,
        ``InspectorError`` says what to install). Returns how many scalars of each kind were written."""
        from edgetorch.devtools.inspector.tensorboard import write_tensorboard_artifact

        return write_tensorboard_artifact(self, path, gaps)

    def find_total_for_module(self, module_name: str) -> float:
        """Sum of average times (target unit) of the events whose module path contains ``module_name``."""
        if not self.enable_module_hierarchy:
            raise InspectorError("find_total_for_module needs the module paths: create the Inspector with "
                                 "enable_module_hierarchy=True")
        total = 0.0
        for block in self.event_blocks:
            for ev in block.events:
                if ev.perf_data is None or ev.name in FRAMEWORK_EVENTS or ev.name == ed.OPERATOR_CALL:
                    continue  # the reference's OPERATOR_CALL scope would count its kernel twice
                if any(module_name in str(k) or module_name in str(v[0])
                       for stack in ev.module_hierarchy.values() for k, v in (stack or {}).items()):
                    total += ev.perf_data.avg
        return total

    def get_exported_program(self, graph: str | None = None, method: str = "forward") -> ExportedProgram | None:
        if self._etrecord is None:
            log.warning("no ETRecord was given")
            return None
        if graph is None:
            return self._etrecord.edge_programs.get(method)
        gm = self._etrecord.graph_map or {}
        return gm.get(graph if "/" in graph else f"{graph}/{method}")

    @property
    def etrecord(self) -> Any:
        return self._etrecord

    @property
    def etdump(self) -> ed.ETDump:
        return self._etdump

    @property
    def observer_effect(self) -> float | None:
        """The largest observer effect any delegate call reported (None: none was measured)."""
        return max((oe.max for oe in self.observer_effects), default=None)

    @property
    def methods(self) -> list[str]:
        return list(dict.fromkeys(b.method for b in self.event_blocks if b.name != ed.LOAD_BLOCK))

    # -- numeric gap ---------------------------------------------------------------------------------------
    def _block_for(self, method: str) -> EventBlock:
        blocks = [b for b in self.event_blocks if b.method == method and b.name != ed.LOAD_BLOCK
                  and any(e.instruction_id is not None for e in b.events)]
        if not blocks:
            raise InspectorError(f"the ETDump has no execution of method '{method}'; methods run: {self.methods}")
        return blocks[0]

    def reference_module(self, method: str, reference_graph: str | None = None) -> tuple[torch.fx.GraphModule, str]:
        """The reference program of ``method`` as a runnable ``GraphModule`` and the name of the graph used:
        ``reference_graph`` None picks the ATen program when it carries every debug handle of the edge program,
        else the edge program (``"exported_program"`` / ``"edge_dialect_exported_program"`` ask for one, any
        other name a ``graph_map`` entry)."""
        rec = self._etrecord
        if reference_graph in (None, "exported_program"):
            edge_handles = set(self.nodes_by_handle(method))
            # a reference record tells, from its documents, when the ATen program cannot carry every handle:
            # it is then not deserialized at all (the choice is the same)
            bound = rec.aten_handle_bound(method) if reference_graph is None else None
            lacking = bound is not None and not edge_handles <= bound | {0}
            gm = None if lacking else rec.reference_graph(method)
            if gm is not None:
                last, _ = reference_handles(gm)
                if last and edge_handles <= set(last) | {0}:
                    return gm, "exported_program"
            if gm is not None or lacking:
                log.info("the ATen program of '%s' lacks some debug handles; using the edge program", method)
            elif reference_graph == "exported_program":
                raise InspectorError(f"the ETRecord holds no ATen program for method '{method}'")
        if reference_graph in (None, "exported_program", "edge_dialect_exported_program"):
            gm = rec.edge_reference_graph(method)  # compact: no program deserialization, weights mapped
            if gm is not None:
                return gm, "edge_dialect_exported_program"
            edge = rec.edge_programs.get(method)
            if edge is None:
                raise InspectorError(f"the ETRecord holds no edge program for method '{method}'")
            return edge.module(), "edge_dialect_exported_program"
        ep = self.get_exported_program(reference_graph, method)
        if ep is None:
            raise InspectorError(f"no graph '{reference_graph}' in the ETRecord (graph_map: "
                                 f"{sorted(rec.graph_map or {})})")
        return ep.module(), reference_graph

    def calculate_numeric_gap(self, distance: str | NumericalComparatorBase = "MSE", method: str | None = None,
                              reference_graph: str | None = None, run: int = 0, local: bool = True,
                              inputs: tuple | None = None, execution: int | None = None,
                              disable_debug_handle_valdiation: bool = False) -> pd.DataFrame:
        """Per-op gaps between the reference program and the runtime intermediates.

        Rows follow execution order; ``gap`` is the accumulated gap, ``local_gap`` the gap of the op re-run on
        the runtime's own inputs; ``rel_error`` / ``local_rel_error`` the same as relative L2 errors,
        ``noise_floor`` the relative error rounding explains and ``verdict`` exact / noise / real
        (``inspector.noise``; ``find_culprits`` keeps the real ones).
        ``run`` picks which recorded execution (and representative input) to use; for a program with mutable
        state, a run that earlier calls changed the state of is replayed as ``execution`` does.
        ``execution`` (an index into ``self.executions``, any method) instead replays the reference on the
        recorded inputs of every execution up to that one, mutable state carried over (``method``, ``run`` and
        ``inputs`` are then ignored; see ``inspector.generation``).
        ``df.attrs["coverage"]`` (also ``self.last_gap_coverage``) says what was matched and why the rest was not.
        ``disable_debug_handle_valdiation`` (sic, the reference's keyword) is accepted for its callers: edgetorch
        takes the ATen program as reference only when it carries every handle, and the edge program otherwise.
        """
        if self._etrecord is None:
            raise InspectorError("calculate_numeric_gap needs an ETRecord (pass etrecord=...)")
        reference_graph = getattr(self, "_default_reference", None) if reference_graph is None else reference_graph
        if reference_graph == "float":  # issue 15: the float model as reference (every recorded sample)
            from edgetorch.devtools.inspector.float_reference import float_numeric_gap
            return float_numeric_gap(self, distance, method, local=local)
        comparator = get_comparator(distance)
        if comparator.inspector is None:
            comparator.inspector = self
        if method is None:
            runs = self.methods
            method = "forward" if "forward" in runs or not runs else runs[0]
        if not self._has_tensor_data:
            raise InspectorError("the ETDump holds no intermediate outputs: load the program with "
                                 "debug_buffer_size=<bytes>|'auto' or debug_buffer_path=... and run it again")
        if self._debug_buffer is None:
            raise InspectorError("calculate_numeric_gap needs the debug buffer: pass debug_buffer_path=...")
        if execution is None and inputs is None:
            execution = self._stateful_execution(method, run, reference_graph)
        if execution is not None:
            return self.replay(reference_graph).gap_table(execution, distance, local)
        if inputs is None:
            reps = (self._etrecord.representative_inputs or {}).get(method)
            if not reps:
                raise InspectorError(f"the ETRecord has no representative inputs for method '{method}': call "
                                     "etrecord.update_representative_inputs(inputs) before saving it")
            block = self._block_for(method)
            # a bundled run says which test case it executed; otherwise run i used sample i
            idx = block.bundled_input_index if block.bundled_input_index is not None else run
            if idx >= len(reps):
                raise InspectorError(f"run {run} (test case {idx}) has no representative input "
                                     f"({len(reps)} recorded)")
            inputs = reps[idx]
        block = self._block_for(method)
        entries = runtime_entries(block.events, run)
        gm, used = self.reference_module(method, reference_graph)
        flat = pytree.tree_leaves(tuple(inputs))
        nodes_by_h = self.nodes_by_handle(method)
        view_only = {h for h, ns in nodes_by_h.items() if ns and all(n.is_view for n in ns)}
        df, cov = compute_numeric_gap(gm, tuple(flat), entries, comparator, view_only=view_only, local=local)
        df.attrs["reference_graph"] = used
        df.attrs["method"] = method
        df.attrs["distance"] = getattr(comparator, "name", type(comparator).__name__)
        effects = [oe for oe in self.observer_effects if oe.method == method]
        df.attrs["observer_effect"] = max((oe.max for oe in effects), default=None)
        self.last_gap_coverage = cov
        return df

    def calculate_numeric_gap_over(self, samples: Any, program: Any, distance: str | NumericalComparatorBase = "MSE",
                                   method: str | None = None, top: int = 5, reference_graph: str | None = None,
                                   progress: Any = None) -> pd.DataFrame:
        """Per-op gap statistics over many inputs (``inspector.multisample``): re-runs ``program`` (a .pte path,
        its bytes, an ExecutorchProgramManager or a BundledProgram) with the runtime and its tracer on every
        sample of ``samples`` (an iterable of input tuples, or a BundledProgram's test suite), streaming (one
        sample's intermediates in memory at a time), and returns per-op mean / max / p99 of ``gap``,
        ``local_gap``, ``rel_error`` and ``local_rel_error``, the worst case in the usual columns (so
        ``find_culprits`` works on it) and the stability of the culprit ranking across samples;
        ``df.attrs["samples"]`` is N."""
        if self._etrecord is None:
            raise InspectorError("calculate_numeric_gap_over needs an ETRecord (pass etrecord=...)")
        if method is None:
            runs = self.methods
            method = "forward" if "forward" in runs or not runs else runs[0]
        return numeric_gap_over_samples(self._etrecord, program, samples, distance, method, top, reference_graph,
                                        progress)

    def _stateful_execution(self, method: str, run: int, reference_graph: str | None) -> int | None:
        """For a program with mutable state (a KV cache), the global execution index of ``method``'s call ``run``
        when earlier calls changed the state it started from (issue 23: ``run=k`` compared call k against a
        reference run from the initial state); None when the state is the initial one (or there is none). Also
        when the method's runs fall into several event blocks (the runs of a ``torch.cond`` program that took
        different branches): call ``run`` is then found among all of them."""
        from edgetorch.devtools.inspector.generation import _state_targets

        gm, _ = self.reference_module(method, reference_graph)
        blocks = [b for b in self.event_blocks if b.method == method and b.name != ed.LOAD_BLOCK
                  and any(e.instruction_id is not None for e in b.events)]
        if not _state_targets(gm) and len(blocks) <= 1:  # torch.cond: runs of two branches are two blocks
            return None
        found = next((e.index for e in self.executions if e.method == method and e.run == run), None)
        if found is None:
            raise InspectorError(f"method '{method}' has no recorded run {run} (recorded: "
                                 f"{sum(e.method == method for e in self.executions)})")
        return found or None  # the first call of all starts from the initial state: the plain comparison

    # -- across executions (inspector.generation) ---------------------------------------------------------
    def replay(self, reference_graph: str | None = None) -> Any:
        """The replay of the reference programs over the recorded executions (``generation.GenerationReplay``),
        built once per reference graph."""
        from edgetorch.devtools.inspector.generation import GenerationReplay

        if self._etrecord is None:
            raise InspectorError("replaying executions needs an ETRecord (pass etrecord=...)")
        if self._debug_buffer is None:
            raise InspectorError("replaying executions needs the debug buffer: pass debug_buffer_path=...")
        if reference_graph not in self._replays:
            self._replays[reference_graph] = GenerationReplay(self, reference_graph)
        return self._replays[reference_graph]

    @property
    def float_reference(self) -> Any:
        """The float-model reference of this Inspector (``float_reference.FloatReference``): the graphs, readings
        and float values ``calculate_numeric_gap(reference_graph="float")`` builds once and keeps."""
        if self._float_reference is None:
            from edgetorch.devtools.inspector.float_reference import FloatReference

            self._float_reference = FloatReference(self)
        return self._float_reference

    @property
    def executions(self) -> list[Any]:
        """Every recorded call in execution order, across methods: ``Execution(index, method, run)``."""
        from edgetorch.devtools.inspector.generation import execution_records

        return [r.execution for r in execution_records(self._etdump, self.inflate)]

    def generation_gaps(self, distance: str = "MSE") -> pd.DataFrame:
        """One row per execution: the gap of its final output against the reference replay, and its worst op."""
        from edgetorch.devtools.inspector.generation import generation_gaps

        return generation_gaps(self.replay(), distance)

    def first_divergence_across_executions(self, threshold: float, distance: str = "MSE") -> Any:
        """The first execution and op whose gap crosses ``threshold`` (``generation.Divergence``), or None."""
        from edgetorch.devtools.inspector.generation import first_divergence_across_executions

        return first_divergence_across_executions(self.replay(), threshold, distance)

    def quantized_generation_table(self, float_model: torch.nn.Module | None = None,
                                   impact: bool = False) -> pd.DataFrame:
        """A low-bit generation against ``float_model`` (None: the float programs the ETRecord of a torchao-recipe
        export holds): per execution (token) and quantized layer, the
        accumulated and local SQNR; the first token whose greedy choice differs and the layer most responsible
        in ``attrs``; ``impact=True`` adds each layer's share of the logit error
        (``inspector.quantized_generation``)."""
        from edgetorch.devtools.inspector.quantized_generation import quantized_generation_table

        return quantized_generation_table(self, float_model, impact)

    def first_divergence(self, df: pd.DataFrame, threshold: float) -> pd.Series | None:
        """The first row (execution order) whose gap crosses ``threshold`` (below it for SNR/COSINE). An exact
        row (integer/bool, ``metric`` ``MISMATCH_FRACTION``) diverges as soon as one element differs."""
        from edgetorch.devtools.inspector.comparators import larger_is_worse

        worse = larger_is_worse(df.attrs.get("distance", "MSE"), df.attrs)  # the comparator's own direction
        metrics = df["metric"] if "metric" in df.columns else [None] * len(df)
        for i, gap, metric in zip(df.index, df["gap"], metrics):  # no per-row Series (iterrows is slow)
            g = gap[0] if gap else None
            if g is not None and _diverges(metric, g, threshold, worse):
                return df.loc[i]
        return None

    def find_culprits(self, df: pd.DataFrame, top: int = 5) -> pd.DataFrame:
        """The ops that add error beyond rounding noise, most specific row first, worst first (at most ``top``),
        with evidence columns; empty on a program whose every op is within noise (``inspector.culprits``)."""
        from edgetorch.devtools.inspector.culprits import find_culprits

        return find_culprits(df, top)

    def __repr__(self) -> str:
        return (f"Inspector(methods={self.methods}, blocks={len(self.event_blocks)}, "
                f"etrecord={'yes' if self._etrecord is not None else 'no'})")


def _check_callables(**functions: Any) -> None:
    for what, f in functions.items():
        if f is not None and not callable(f):
            raise InspectorError(f"{what} must be callable, got {type(f).__name__}")


def _warn_observer_effects(effects: list[ObserverEffect]) -> None:
    for oe in effects:
        if oe.exceeds_tolerance:
            warnings.warn(
                f"observer effect: in method '{oe.method}', exposing the intermediates of the delegate call at "
                f"instruction {oe.instruction_id} ({oe.delegate_backend_name or 'backend unknown'}) changed "
                f"its final outputs by up to {oe.max:.3g} relative (tolerance "
                f"{ed.OBSERVER_EFFECT_TOLERANCE:g}): the backend fused differently when observed, so the "
                "inside-delegate values are not exactly what a plain run computes; gaps of ops it would "
                "have fused show the observed variant", ObserverEffectWarning, stacklevel=3)


def _exact_rows(df: pd.DataFrame) -> pd.Series:
    from edgetorch.devtools.inspector.comparators import EXACT_METRIC

    if "metric" not in df:
        return pd.Series(False, index=df.index)
    return df["metric"] == df.attrs.get("exact_metric", EXACT_METRIC)


def _diverges(metric: str | None, g: float, threshold: float, worse: bool) -> bool:
    from edgetorch.devtools.inspector.comparators import EXACT_METRIC

    if metric == EXACT_METRIC:
        return g > 0
    return (g > threshold) if worse else (g < threshold)


def _default_reference(name: str, etrecord: Any) -> str | None:
    """``reference_graph_name`` as ``calculate_numeric_gap``'s default ``reference_graph``: the reference's default
    (``"edge_dialect_graph_module"``) is edgetorch's own choice (None); any other name must be a graph the ETRecord
    holds (``InspectorError`` listing them)."""
    if name == "edge_dialect_graph_module":
        return None
    if not isinstance(name, str):
        raise InspectorError(f"reference_graph_name must be a graph name (str), got {type(name).__name__}")
    known = {"exported_program", "edge_dialect_exported_program"}
    graphs = set((etrecord.graph_map or {}) if etrecord is not None else {})
    stages = {g.split("/")[0] for g in graphs}
    if name in known or name in graphs or name in stages or (name == "float" and "float" in stages):
        return name
    raise InspectorError(f"reference_graph_name {name!r}: no such graph in the ETRecord; one of "
                         f"{sorted(known | graphs | stages | {'edge_dialect_graph_module'})}")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list) and len(v) > 6:
        return f"[{', '.join(map(str, v[:3]))}, ... ({len(v)} items)]"
    return str(v)


def numeric_gap_over_samples(etrecord: Any, program: Any, samples: Any, distance: Any = "MSE",
                             method: str = "forward", top: int = 5, reference_graph: str | None = None,
                             progress: Any = None) -> pd.DataFrame:
    """``Inspector.calculate_numeric_gap_over`` without an ETDump at hand: per-op gap statistics of ``program``
    over ``samples`` against ``etrecord`` (see ``inspector.multisample``)."""
    return _multisample.numeric_gap_over_samples(etrecord, program, samples, distance, method, top,
                                                 reference_graph, progress, inspector_type=Inspector)


__all__ = ["Event", "EventBlock", "Inspector", "TimeScale", "numeric_gap_over_samples"]
