"""Program managers: ``to_edge``, ``EdgeProgramManager``, ``ExecutorchProgramManager`` and
``to_edge_transform_and_lower``, the calls a user types to go from ``torch.export`` to a .pte file.

With ``generate_etrecord=True`` the managers keep their stage history (``StageHistory``: plain programs, by
reference, as no stage mutates its input); the developer tools build the ETRecord from it
(``get_etrecord()`` calls the builder ``edgetorch/__init__.py`` registers in ``edgetorch._hooks``): the compiler
never imports them."""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.export import ExportedProgram

from edgetorch import _hooks
from edgetorch import _progress as progress
from edgetorch._fileio import atomic_write
from edgetorch.errors import EdgeTorchError, ETRecordError, ExportError, MemoryPlanError
from edgetorch.exir.clone import sync_signature_names
from edgetorch.exir.config import EdgeCompileConfig, ExecutorchBackendConfig
from edgetorch.exir.control_flow import unique_branch_names
from edgetorch.exir.debug_handles import assign_debug_handles, fill_missing_debug_handles
from edgetorch.exir.emit import ConstantPool, DelegatePool, EmittedMethod, emit_method
from edgetorch.exir.memory_planning import unplan_inputs, unshare_mutable_buffers
from edgetorch.exir.quant_annotations import float_handle
from edgetorch.exir.verifier import _IGNORED_TARGETS, verify_edge_program
from edgetorch.formats import program as pf
from edgetorch.formats.handles import HandleGroup, debug_handle_map_of, delegate_map_of

__all__ = ["ProgramsArg", "StageHistory", "EdgeProgramManager", "to_edge", "own_buffers",
           "to_edge_transform_and_lower", "ExecutorchProgramManager", "format_program"]

log = logging.getLogger(__name__)

ProgramsArg = ExportedProgram | dict[str, ExportedProgram]


def _as_dict(programs: ProgramsArg) -> dict[str, ExportedProgram]:
    if isinstance(programs, ExportedProgram):
        return {"forward": programs}
    if isinstance(programs, dict) and programs and all(isinstance(v, ExportedProgram) for v in programs.values()):
        for k in programs:
            if not isinstance(k, str) or not k:
                raise ExportError(f"method names must be non-empty strings, got {k!r}")
        return dict(programs)
    raise ExportError("expected an ExportedProgram or a non-empty {method_name: ExportedProgram} dict, got "
                      f"{type(programs).__name__}")


def _decomposition_table(config: EdgeCompileConfig) -> dict:
    table = torch.export.default_decompositions()
    for op in config.preserve_ops:
        table.pop(op, None)
    return table


def _remove_asserts(ep: ExportedProgram) -> None:
    g = ep.graph
    for node in list(g.nodes):
        if node.op == "call_function" and node.target in _IGNORED_TARGETS and not node.users:
            g.erase_node(node)
    ep.graph_module.recompile()


def _to_edge_one(aten: ExportedProgram, name: str, config: EdgeCompileConfig) -> ExportedProgram:
    t0 = time.perf_counter()
    sync_signature_names(aten.graph_signature, aten.graph)  # a deepcopied program: `input` became `input_1`
    assign_debug_handles(aten)
    progress.note(f"'{name}': decomposing to core ATen ({len(aten.graph.nodes)} nodes)")
    edge = aten.run_decompositions(_decomposition_table(config))
    _remove_asserts(edge)
    fill_missing_debug_handles(edge.graph_module)
    unique_branch_names(edge.graph_module)  # torch.cond: one node name, one node across the branches
    if config._check_ir_validity:
        verify_edge_program(edge, name)
    log.info("to_edge(%s): %d edge nodes in %.2fs", name, len(edge.graph.nodes), time.perf_counter() - t0)
    return edge


@dataclass(frozen=True)
class StageHistory:
    """What the compiler saw, kept for the ETRecord: the ATen programs, the edge programs right after
    ``to_edge``, extra graphs by ``"<stage>/<method>"`` (``edge_after_transform/forward``) and the float
    programs of a quantized model (``to_edge(float_program=...)``)."""

    aten: dict[str, ExportedProgram]
    edge: dict[str, ExportedProgram]
    graphs: dict[str, ExportedProgram] = field(default_factory=dict)
    float_programs: dict[str, ExportedProgram] = field(default_factory=dict)


class EdgeProgramManager:
    """The edge programs of every method, ready for transforms, delegation and emission. ``stage_history`` is
    kept when an ETRecord was asked for (``generate_etrecord=True``), else None."""

    def __init__(self, edge_programs: dict[str, ExportedProgram], aten_programs: dict[str, ExportedProgram] | None,
                 compile_config: EdgeCompileConfig | None = None, stage_history: StageHistory | None = None) -> None:
        self._edge_programs = edge_programs
        self._aten_programs = aten_programs or {}
        self.compile_config = compile_config or EdgeCompileConfig()
        self.stage_history = stage_history

    @property
    def methods(self) -> set[str]:
        return set(self._edge_programs)

    def __deepcopy__(self, memo: dict[int, Any]) -> EdgeProgramManager:
        """A deep copy whose programs' signatures name their nodes (torch's deepcopy of an ExportedProgram renames
        a placeholder called ``input`` to ``input_1`` but not the signature)."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, copy.deepcopy(v, memo))
        h = new.stage_history
        extra = [] if h is None else [*h.aten.values(), *h.edge.values(), *h.graphs.values(),
                                      *h.float_programs.values()]
        for ep in [*new._edge_programs.values(), *new._aten_programs.values(), *extra]:
            sync_signature_names(ep.graph_signature, ep.graph)
        return new

    def exported_program(self, method_name: str = "forward") -> ExportedProgram:
        try:
            return self._edge_programs[method_name]
        except KeyError:
            raise KeyError(f"no method '{method_name}'; methods: {sorted(self._edge_programs)}") from None

    def transform(self, passes: Sequence[Callable] | dict[str, Sequence[Callable]]) -> EdgeProgramManager:
        """Applies graph passes (callables taking and returning a GraphModule, or PassBase-style objects
        returning a result with ``.graph_module``) to every method (or per method with a dict)."""
        new = {}
        for name, ep in self._edge_programs.items():
            plist = passes.get(name, []) if isinstance(passes, dict) else passes
            if not plist:
                new[name] = ep
                continue
            from edgetorch.exir.passes import apply_passes
            new[name] = apply_passes(ep, plist, name, self.compile_config)
        return EdgeProgramManager(new, self._aten_programs, self.compile_config, self.stage_history)

    def _recorded(self, stage: str) -> EdgeProgramManager:
        """This manager, its programs recorded in the stage history as ``"<stage>/<method>"``."""
        if self.stage_history is not None:
            graphs = {**self.stage_history.graphs, **{f"{stage}/{m}": ep for m, ep in self._edge_programs.items()}}
            self.stage_history = replace(self.stage_history, graphs=graphs)
        return self

    def to_backend(self, partitioner: Any) -> EdgeProgramManager:
        """Replaces the partitions chosen by ``partitioner`` (or a {method: partitioner} dict) with delegate calls."""
        from edgetorch.exir.backend.lowering import to_backend_program
        new = {}
        for name, ep in self._edge_programs.items():
            p = partitioner.get(name) if isinstance(partitioner, dict) else partitioner
            new[name] = to_backend_program(ep, p, name) if p is not None else ep
        return EdgeProgramManager(new, self._aten_programs, self.compile_config, self.stage_history)

    def to_executorch(self, config: ExecutorchBackendConfig | None = None) -> ExecutorchProgramManager:
        return ExecutorchProgramManager(self, config or ExecutorchBackendConfig())


def to_edge(programs: ProgramsArg, constant_methods: dict | None = None,
            compile_config: EdgeCompileConfig | None = None, generate_etrecord: bool = False,
            float_program: ProgramsArg | None = None) -> EdgeProgramManager:
    """Turns ATen ``ExportedProgram``(s) into the edge dialect: core ATen ops with debug handles.

    ``float_program``: for a PT2E-quantized program, the float program it was quantized from (captured with
    ``edgetorch.export.quantizer.capture_float_program``), recorded in the ETRecord as ``graph_map["float/..."]``
    (needs ``generate_etrecord=True``)."""
    if float_program is not None and not generate_etrecord:
        raise ExportError("float_program is recorded in the ETRecord: pass generate_etrecord=True with it")
    aten = _as_dict(programs)
    if constant_methods:
        raise ExportError("constant_methods are not supported yet")
    config = compile_config or EdgeCompileConfig()
    edge = {name: _to_edge_one(ep, name, config) for name, ep in aten.items()}
    floats = {} if float_program is None else _float_programs(float_program)
    history = None
    if generate_etrecord:  # the record and the .pte start from the buffers as they are now, whatever runs later
        memo: dict[int, torch.Tensor] = {}
        mutated = {t for ep in edge.values() for t in ep.graph_signature.buffers_to_mutate.values()}
        edge = {name: own_buffers(ep, memo, mutated) for name, ep in edge.items()}
        history = StageHistory({n: own_buffers(ep, memo, mutated) for n, ep in aten.items()}, dict(edge), {}, floats)
    return EdgeProgramManager(edge, aten, config, history)


def own_buffers(ep: ExportedProgram, memo: dict[int, torch.Tensor], mutated: set[str]) -> ExportedProgram:
    """``ep`` with its buffers named in ``mutated`` (KV caches and other state a run updates in place) copied: a
    program whose buffers are the eager module's own tensors would otherwise see every later eager call. ``memo``
    (id of the original -> its copy) keeps tensors shared between programs shared. Returns ``ep`` when it has
    none of them."""
    from torch.export.graph_signature import InputKind

    targets = [s.target for s in ep.graph_signature.input_specs
               if s.kind == InputKind.BUFFER and s.target and s.target in mutated]
    if not targets:
        return ep

    def own(d: dict) -> dict:
        out = dict(d)
        for t in targets:
            v = d.get(t)
            if isinstance(v, torch.Tensor):
                out[t] = memo.setdefault(id(v), v.detach().clone())
        return out

    from edgetorch.exir.clone import clone_program

    return clone_program(ep, state_dict=own(ep.state_dict), constants=own(ep.constants))


def _float_programs(float_program: ProgramsArg) -> dict[str, ExportedProgram]:
    """The float programs by method; refuses one whose ops carry no PT2E numeric debug handle (the ETRecord
    could not link it to the quantized program)."""
    floats = _as_dict(float_program)
    for m, ep in floats.items():
        if not any(float_handle(n) is not None for n in ep.graph.nodes if n.op == "call_function"):
            raise ETRecordError(f"float_program {m!r}: no node carries a numeric debug handle; capture it with "
                                "edgetorch.export.quantizer.capture_float_program before prepare_pt2e")
    return floats


def to_edge_transform_and_lower(programs: ProgramsArg, transform_passes: Sequence[Callable] | None = None,
                                partitioner: Sequence[Any] | None = None, constant_methods: dict | None = None,
                                compile_config: EdgeCompileConfig | None = None,
                                generate_etrecord: bool = False, float_program: ProgramsArg | None = None,
                                ) -> EdgeProgramManager:
    """``to_edge`` (keeping ops the partitioners ask to keep whole), then passes, then one ``to_backend``
    round per partitioner. ``float_program``: see ``to_edge``."""
    config = compile_config or EdgeCompileConfig()
    extra: list = []
    for p in partitioner or []:
        keep = getattr(p, "ops_to_not_decompose", None)
        if callable(keep):
            got = keep(next(iter(_as_dict(programs).values())))
            extra.extend(got[0] if isinstance(got, tuple) else got)
    if extra:
        config = EdgeCompileConfig(tuple(dict.fromkeys([*config.preserve_ops, *extra])), config._check_ir_validity,
                                   config._skip_dim_order, config._core_aten_ops_exception_list)
    epm = to_edge(programs, constant_methods, config, generate_etrecord, float_program)
    if transform_passes:
        epm = epm.transform(transform_passes)._recorded("edge_after_transform")
    for p in partitioner or []:
        epm = epm.to_backend(p)
    return epm


class ExecutorchProgramManager:
    """An emitted program: the .pte bytes plus what each instruction covers (``handle_groups``)."""

    def __init__(self, edge: EdgeProgramManager, config: ExecutorchBackendConfig) -> None:
        t0 = time.perf_counter()
        if config.passes:  # ExecutorchBackendConfig.passes: as a transform right before planning
            edge = edge.transform(list(config.passes))._recorded("edge_before_planning")
        self._edge = edge
        self.config = config
        layout = pf.SegmentLayout()
        consts = ConstantPool(layout)
        delegates = DelegatePool(layout)
        self._emitted: dict[str, EmittedMethod] = {}
        for name in sorted(edge.methods):
            ep = edge.exported_program(name)
            sync_signature_names(ep.graph_signature, ep.graph)
            progress.note(f"'{name}': planning memory and emitting")
            bounded = config.sym_shape_eval_for(name).bound_program(ep, name)  # sym_shape_eval_pass
            self._emitted[name] = emit_method(bounded, name, consts, delegates, config.planning_alignment,
                                              config.emit_stacktrace, config.planning_algorithm)
            if config.memory_planning_pass is not None and not config.memory_planning_pass.alloc_graph_input:
                self._unplan_inputs(ep, self._emitted[name], config)
        plans = [m.plan for m in self._emitted.values()]
        if not config.shares_mutable_buffers:
            unshare_mutable_buffers(plans)
        self._program = pf.ProgramDef(plans, consts.ranges(), delegates.ranges(), named_data=delegates.named_data())
        self._layout = layout
        self._parts = pf.build_file_parts(self._program, list(layout.chunks()))
        self._buffer: bytes | None = None
        self.content_hash: str = self._parts[0][pf.HEADER.size - 32:pf.HEADER.size].hex()
        self._etrecord: Any = None  # built on the first get_etrecord()
        log.info("to_executorch: %d methods, %d bytes in %.2fs", len(self._emitted), self.size,
                 time.perf_counter() - t0)

    @staticmethod
    def _unplan_inputs(ep: ExportedProgram, emitted: EmittedMethod, config: ExecutorchBackendConfig) -> None:
        """``MemoryPlanningPass(alloc_graph_input=False)``: the inputs leave the arena (the caller's tensors are
        run on); refused for a method that writes into a user input (it would write into the caller's tensor)."""
        mutated = ep.graph_signature.user_inputs_to_mutate
        if mutated:
            raise MemoryPlanError(f"method '{emitted.plan.name}': MemoryPlanningPass.alloc_graph_input=False: the "
                                  f"method writes into its input(s) {sorted(mutated.values())}")
        emitted.memory_plan = unplan_inputs(emitted.plan, config.planning_alignment, config.planning_algorithm)

    @property
    def size(self) -> int:
        return sum(memoryview(p).nbytes for p in self._parts)

    @property
    def buffer(self) -> bytes:
        """The whole .pte file as bytes (built on first access)."""
        if self._buffer is None:
            self._buffer = b"".join(bytes(p) if isinstance(p, memoryview) else p for p in self._parts)
        return self._buffer

    def save(self, path: str | os.PathLike) -> None:
        """Writes the .pte atomically (temp file + rename), streaming the segments from memory."""
        atomic_write(path, self._parts)

    def write_to_file(self, f) -> None:
        for p in self._parts:
            f.write(p)

    @property
    def methods(self) -> set[str]:
        return set(self._emitted)

    def exported_program(self, method_name: str = "forward") -> ExportedProgram:
        return self._edge.exported_program(method_name)

    @property
    def program(self) -> pf.ProgramDef:
        return self._program

    @property
    def executorch_program(self) -> pf.ProgramDef:
        """The program before serialization (the reference's name for ``program``)."""
        return self._program

    def dump_executorch_program(self, verbose: bool = False, out: Any = None) -> None:
        """Prints the program readably to ``out`` (stdout when None): per method its inputs, outputs and
        instructions (operator or delegate, argument and output value ids, node name, debug handle);
        ``verbose`` adds every value of the values table."""
        import sys

        out = sys.stdout if out is None else out
        out.write(format_program(self._program, verbose))

    @property
    def stage_history(self) -> StageHistory | None:
        """The edge manager's stage history (None without ``generate_etrecord=True``)."""
        return self._edge.stage_history

    @property
    def handle_groups(self) -> dict[str, list[HandleGroup]]:
        """Per method, what each instruction (and each op inside a delegate call) covers, instruction order."""
        return {m: list(e.handle_groups) for m, e in self._emitted.items()}

    @property
    def debug_handle_map(self) -> dict[str, dict[int, int | list[int]]]:
        """Per method: instruction -> its kernel's handle, or the handles a delegate call covers."""
        return {m: debug_handle_map_of(e.handle_groups) for m, e in self._emitted.items()}

    @property
    def delegate_map(self) -> dict[str, dict[int, dict]]:
        """Per method: delegate call -> {name: backend, delegate_map: {backend debug id: [handles]}}."""
        return {m: delegate_map_of(e.handle_groups) for m, e in self._emitted.items()}

    def memory_plan_report(self) -> dict[str, dict[str, int | str]]:
        """Per method: planned arena bytes, the live-bytes lower bound, the algorithm, debug-buffer bytes."""
        return {m: {"arena_bytes": e.memory_plan.arena_size, "peak_live_bytes": e.memory_plan.peak_live_bytes,
                    "algorithm": e.memory_plan.algorithm, "debug_buffer_bytes": e.plan.debug_buffer_bytes,
                    "instructions": len(e.plan.instructions)}
                for m, e in self._emitted.items()}

    def get_etrecord(self) -> Any:
        """The ETRecord of this program (``generate_etrecord=True``); built once, from the stage history."""
        if self._edge.stage_history is None:
            raise ETRecordError("ETRecord was not generated: pass generate_etrecord=True to to_edge / "
                                 "to_edge_transform_and_lower (or use devtools.etrecord.generate_etrecord)")
        if self._etrecord is None:
            if _hooks.etrecord_builder is None:  # set by edgetorch/__init__.py, which every import runs
                raise EdgeTorchError("no ETRecord builder is registered (edgetorch._hooks.etrecord_builder)")
            self._etrecord = _hooks.etrecord_builder(self)
        return self._etrecord


def format_program(program: pf.ProgramDef, verbose: bool = False) -> str:
    """The text ``ExecutorchProgramManager.dump_executorch_program`` prints."""
    lines = [f"Program (schema version {program.version}): {len(program.plans)} method(s), "
             f"{len(program.constants)} constant(s), {len(program.delegate_data)} delegate blob(s)"]
    for plan in program.plans:
        lines.append(f"method {plan.name}: inputs {plan.inputs} ({', '.join(plan.input_names)}), outputs "
                     f"{plan.outputs}, {len(plan.values)} values, arena {plan.arena_size} bytes")
        if verbose:
            lines += [f"  value {i}: {v!r}" for i, v in enumerate(plan.values)]
        for k, ins in enumerate(plan.instructions):
            c = ins.call
            if isinstance(c, pf.KernelCallDef):
                op = plan.operators[c.op_index]
                what = f"{op.name}.{op.overload or 'default'} [{pf.CALL_KIND_NAMES.get(c.kind, c.kind)}]"
            else:
                what = f"DELEGATE_CALL {plan.delegates[c.delegate_index].backend_id}"
            handle = f", debug handle {ins.debug_handle}" if ins.debug_handle else ""
            lines.append(f"  [{k}] {what} args {c.args} -> {c.outputs}  # {ins.node_name}{handle}")
    return "\n".join(lines) + "\n"
