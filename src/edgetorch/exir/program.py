"""Program managers: ``to_edge``, ``EdgeProgramManager``, ``ExecutorchProgramManager`` and
``to_edge_transform_and_lower``, the calls a user types to go from ``torch.export`` to a .pte file."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from edgetorch._fileio import atomic_write
from edgetorch.errors import EdgeTorchError, ExportError
from edgetorch.exir.config import EdgeCompileConfig, ExecutorchBackendConfig
from edgetorch.exir.debug_handles import assign_debug_handles, fill_missing_debug_handles
from edgetorch.exir.emit import ConstantPool, DelegatePool, EmittedMethod, emit_method
from edgetorch.exir.verifier import _IGNORED_TARGETS, verify_edge_program
from edgetorch.formats import program as pf

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
    assign_debug_handles(aten)
    edge = aten.run_decompositions(_decomposition_table(config))
    _remove_asserts(edge)
    fill_missing_debug_handles(edge.graph_module)
    if config._check_ir_validity:
        verify_edge_program(edge, name)
    log.info("to_edge(%s): %d edge nodes in %.2fs", name, len(edge.graph.nodes), time.perf_counter() - t0)
    return edge


class EdgeProgramManager:
    """The edge programs of every method, ready for transforms, delegation and emission."""

    def __init__(self, edge_programs: dict[str, ExportedProgram], aten_programs: dict[str, ExportedProgram] | None,
                 compile_config: EdgeCompileConfig | None = None, etrecord: Any = None) -> None:
        self._edge_programs = edge_programs
        self._aten_programs = aten_programs or {}
        self.compile_config = compile_config or EdgeCompileConfig()
        self._etrecord = etrecord

    @property
    def methods(self) -> set[str]:
        return set(self._edge_programs)

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
        return EdgeProgramManager(new, self._aten_programs, self.compile_config, self._etrecord)

    def to_backend(self, partitioner: Any) -> EdgeProgramManager:
        """Replaces the partitions chosen by ``partitioner`` (or a {method: partitioner} dict) with delegate calls."""
        from edgetorch.exir.backend.lowering import to_backend_program
        new = {}
        for name, ep in self._edge_programs.items():
            p = partitioner.get(name) if isinstance(partitioner, dict) else partitioner
            new[name] = to_backend_program(ep, p, name) if p is not None else ep
        return EdgeProgramManager(new, self._aten_programs, self.compile_config, self._etrecord)

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
    epm = EdgeProgramManager(edge, aten, config)
    if generate_etrecord:
        epm._etrecord = _new_etrecord(aten, epm)
        if float_program is not None:
            epm._etrecord.add_float_reference(float_program)
    return epm


def _new_etrecord(aten: dict[str, ExportedProgram], epm: EdgeProgramManager) -> Any:
    from edgetorch.devtools.etrecord import ETRecord  # the one upstream hook: ETRecord capture
    return ETRecord._capture_edge(aten, epm)


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
        epm = epm.transform(transform_passes)
        if epm._etrecord is not None:
            epm._etrecord._add_graph("edge_after_transform", epm)
    for p in partitioner or []:
        epm = epm.to_backend(p)
    return epm


class ExecutorchProgramManager:
    """An emitted program: the .pte bytes plus the side tables that link instructions to debug handles."""

    def __init__(self, edge: EdgeProgramManager, config: ExecutorchBackendConfig) -> None:
        t0 = time.perf_counter()
        self._edge = edge
        self.config = config
        layout = pf.SegmentLayout()
        consts = ConstantPool(layout)
        delegates = DelegatePool(layout)
        self._emitted: dict[str, EmittedMethod] = {}
        for name in sorted(edge.methods):
            self._emitted[name] = emit_method(edge.exported_program(name), name, consts, delegates,
                                              config.alignment, config.emit_stacktrace)
        self._program = pf.ProgramDef([m.plan for m in self._emitted.values()], consts.ranges(), delegates.ranges())
        self._layout = layout
        self._parts = pf.build_file_parts(self._program, list(layout.chunks()))
        self._buffer: bytes | None = None
        self.content_hash: str = self._parts[0][pf.HEADER.size - 32:pf.HEADER.size].hex()
        self._etrecord = None
        if edge._etrecord is not None:
            self._etrecord = edge._etrecord._capture_executorch(self)
        log.info("to_executorch: %d methods, %d bytes in %.2fs", len(self._emitted), self.size,
                 time.perf_counter() - t0)

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
    def debug_handle_map(self) -> dict[str, dict[int, int | list[int]]]:
        return {m: dict(e.debug_handle_map) for m, e in self._emitted.items()}

    @property
    def delegate_map(self) -> dict[str, dict[int, dict]]:
        return {m: dict(e.delegate_map) for m, e in self._emitted.items()}

    @property
    def instruction_id_to_num_outs_map(self) -> dict[str, dict[int, int]]:
        return {m: dict(e.instruction_id_to_num_outs) for m, e in self._emitted.items()}

    def memory_plan_report(self) -> dict[str, dict[str, int | str]]:
        """Per method: planned arena bytes, the live-bytes lower bound, the algorithm, debug-buffer bytes."""
        return {m: {"arena_bytes": e.memory_plan.arena_size, "peak_live_bytes": e.memory_plan.peak_live_bytes,
                    "algorithm": e.memory_plan.algorithm, "debug_buffer_bytes": e.plan.debug_buffer_bytes,
                    "instructions": len(e.plan.instructions)}
                for m, e in self._emitted.items()}

    def get_etrecord(self) -> Any:
        if self._etrecord is None:
            raise EdgeTorchError("ETRecord was not generated: pass generate_etrecord=True to to_edge / "
                                 "to_edge_transform_and_lower (or use devtools.etrecord.generate_etrecord)")
        return self._etrecord
