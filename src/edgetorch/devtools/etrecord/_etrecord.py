"""``ETRecord``: the ahead-of-time debug record (programs, debug-handle maps, representative data)."""

from __future__ import annotations

import io
import os
from typing import IO, Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from edgetorch._fileio import atomic_write
from edgetorch.devtools.etrecord import _archive as ar
from edgetorch.errors import ETRecordError

PathOrFile = str | os.PathLike | IO[bytes]


def _detach(tree: Any) -> Any:
    return pytree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, tree)


def _edge_dict(program: Any, what: str) -> dict[str, ExportedProgram]:
    """EdgeProgramManager / ExportedProgram / {method: ExportedProgram} -> {method: ExportedProgram}."""
    if isinstance(program, ExportedProgram):
        return {"forward": program}
    if isinstance(program, dict):
        if not all(isinstance(k, str) and k and isinstance(v, ExportedProgram) for k, v in program.items()):
            raise ETRecordError(f"{what}: expected a {{method name: ExportedProgram}} dict")
        return dict(program)
    if hasattr(program, "exported_program") and hasattr(program, "methods"):
        return {m: program.exported_program(m) for m in sorted(program.methods)}
    raise ETRecordError(f"{what}: expected an EdgeProgramManager, an ExportedProgram or a dict of them, got "
                        f"{type(program).__name__}")


def _samples(value: Any) -> list[tuple]:
    """One method's inputs: a list of tuples = several samples; any other tuple/list = one sample."""
    if isinstance(value, torch.Tensor):
        return [(value.detach(),)]
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return [tuple(_detach(v)) for v in value]
    if isinstance(value, (tuple, list)):
        return [tuple(_detach(tuple(value)))]
    raise ETRecordError(f"representative inputs must be tensors, tuples or lists, got {type(value).__name__}")


def _suites(bundled: Any) -> list[Any]:
    suites = getattr(bundled, "method_test_suites", None)
    if suites is None:
        raise ETRecordError(f"{type(bundled).__name__} has no method_test_suites")
    return list(suites)


class ETRecord:
    """The debug record of one compiled program, produced ahead of time and read by the Inspector.

    Get one with ``to_edge(..., generate_etrecord=True)`` then ``ExecutorchProgramManager.get_etrecord()``,
    or write one with ``generate_etrecord``; read one with ``parse_etrecord``. Instruction ids are ints in
    memory, both for a freshly captured record and for a parsed one.
    """

    def __init__(self, exported_program: ExportedProgram | None = None,
                 edge_dialect_program: ExportedProgram | dict[str, ExportedProgram] | None = None,
                 graph_map: dict[str, ExportedProgram] | None = None,
                 _debug_handle_map: dict[str, dict[int, int | list[int]]] | None = None,
                 _delegate_map: dict[str, dict[int, dict]] | None = None,
                 _instruction_id_to_num_outs_map: dict[str, dict[int, int]] | None = None,
                 _reference_outputs: dict[str, list[Any]] | None = None,
                 _representative_inputs: dict[str, list[tuple]] | None = None,
                 *, exported_programs: dict[str, ExportedProgram] | None = None, program_hash: str | None = None,
                 memory_plan: dict[str, dict[str, Any]] | None = None) -> None:
        self.exported_programs: dict[str, ExportedProgram] = dict(exported_programs or {})
        if exported_program is not None:
            self.exported_programs["forward"] = exported_program
        self._edge_programs: dict[str, ExportedProgram] = {}
        if edge_dialect_program is not None:
            self._edge_programs = _edge_dict(edge_dialect_program, "edge_dialect_program")
        self.graph_map: dict[str, ExportedProgram] = dict(graph_map or {})
        self._debug_handle_map = None if _debug_handle_map is None else ar.norm_debug_handle_map(_debug_handle_map)
        self._delegate_map = None if _delegate_map is None else ar.norm_delegate_map(_delegate_map)
        self._instruction_id_to_num_outs_map = (None if _instruction_id_to_num_outs_map is None
                                                else ar.norm_num_outs_map(_instruction_id_to_num_outs_map))
        self._reference_outputs: dict[str, list[Any]] | None = _reference_outputs
        self._representative_inputs: dict[str, list[tuple]] | None = _representative_inputs
        self.program_hash: str | None = program_hash
        self.memory_plan: dict[str, dict[str, Any]] | None = memory_plan

    # -- programs ---------------------------------------------------------------------------------------------
    @property
    def exported_program(self) -> ExportedProgram | None:
        """The ATen program of ``forward`` (``exported_programs`` holds every method)."""
        return self.exported_programs.get("forward")

    @exported_program.setter
    def exported_program(self, ep: ExportedProgram | None) -> None:
        if ep is None:
            self.exported_programs.pop("forward", None)
        else:
            self.exported_programs["forward"] = ep

    @property
    def edge_dialect_program(self) -> ExportedProgram | dict[str, ExportedProgram] | None:
        """The edge program(s) before lowering: an ExportedProgram for one method, else {method: program}."""
        if not self._edge_programs:
            return None
        if len(self._edge_programs) == 1:
            return next(iter(self._edge_programs.values()))
        return self._edge_programs

    @edge_dialect_program.setter
    def edge_dialect_program(self, program: Any) -> None:
        self._edge_programs = {} if program is None else _edge_dict(program, "edge_dialect_program")

    @property
    def edge_programs(self) -> dict[str, ExportedProgram]:
        """{method: edge program}, also for a single method (whose name ``edge_dialect_program`` hides)."""
        return self._edge_programs

    @property
    def methods(self) -> list[str]:
        return sorted(self._edge_programs)

    def edge_program(self, method: str = "forward") -> ExportedProgram:
        try:
            return self._edge_programs[method]
        except KeyError:
            raise KeyError(f"ETRecord has no edge program for method {method!r}; methods: {self.methods}") from None

    # -- read-only views of the executorch-stage tables -----------------------------------------------------------
    @property
    def debug_handle_map(self) -> dict[str, dict[int, int | list[int]]] | None:
        return self._debug_handle_map

    @property
    def delegate_map(self) -> dict[str, dict[int, dict]] | None:
        return self._delegate_map

    @property
    def instruction_id_to_num_outs_map(self) -> dict[str, dict[int, int]] | None:
        return self._instruction_id_to_num_outs_map

    @property
    def representative_inputs(self) -> dict[str, list[tuple]] | None:
        return self._representative_inputs

    @property
    def reference_outputs(self) -> dict[str, list[Any]] | None:
        return self._reference_outputs

    # -- hooks called by edgetorch.exir.program ------------------------------------------------------------------
    @classmethod
    def _capture_edge(cls, aten_programs: dict[str, ExportedProgram], edge_manager: Any) -> ETRecord:
        """Called by ``to_edge(generate_etrecord=True)``; keeps references, the compiler does not mutate them."""
        return cls(exported_programs=dict(aten_programs), edge_dialect_program=_edge_dict(edge_manager, "to_edge"))

    def _add_graph(self, name: str, edge_manager: Any) -> None:
        """Records every method of ``edge_manager`` under ``graph_map["<name>/<method>"]``."""
        for m, ep in _edge_dict(edge_manager, name).items():
            self.graph_map[f"{name}/{m}"] = ep

    def _capture_executorch(self, et_manager: Any) -> ETRecord:
        """Called by ``ExecutorchProgramManager``: a new record with the emitter's side tables filled in."""
        new = self.copy()
        new._set_executorch_tables(et_manager)
        return new

    def _set_executorch_tables(self, et_manager: Any) -> None:
        try:
            self._debug_handle_map = ar.norm_debug_handle_map(et_manager.debug_handle_map)
            self._delegate_map = ar.norm_delegate_map(et_manager.delegate_map)
            self._instruction_id_to_num_outs_map = ar.norm_num_outs_map(et_manager.instruction_id_to_num_outs_map)
        except ValueError as e:
            raise ETRecordError(f"bad side table from the emitter: {e}") from e
        self.program_hash = getattr(et_manager, "content_hash", None)
        report = getattr(et_manager, "memory_plan_report", None)
        self.memory_plan = report() if callable(report) else None

    # -- legacy builder API ----------------------------------------------------------------------------------------
    def add_exported_program(self, exported_program: ExportedProgram | dict[str, ExportedProgram] | None) -> None:
        if exported_program is None:
            return
        if self.exported_programs:
            raise ETRecordError("the ATen exported program is already set")
        self.exported_programs = _edge_dict(exported_program, "exported_program")

    def add_edge_dialect_program(self, edge_dialect_program: Any) -> None:
        if self._edge_programs:
            raise ETRecordError("the edge dialect program is already set")
        self._edge_programs = _edge_dict(edge_dialect_program, "edge_dialect_program")

    def add_executorch_program(self, executorch_program: Any) -> None:
        """Fills the side tables from an ExecutorchProgramManager, or from a BundledProgram-like object (which
        also gives reference outputs and representative inputs)."""
        if self._debug_handle_map is not None or self.program_hash is not None:
            raise ETRecordError("the executorch program is already set")
        bundled = None
        if hasattr(executorch_program, "method_test_suites") and hasattr(executorch_program, "executorch_program"):
            bundled, executorch_program = executorch_program, executorch_program.executorch_program
        self._set_executorch_tables(executorch_program)
        if bundled is not None:
            self.update_reference_outputs(bundled)
            self.update_representative_inputs(bundled)

    def add_extra_export_modules(self, extra_recorded_export_modules: dict[str, Any]) -> None:
        """Adds ``{name: ExportedProgram | EdgeProgramManager | {method: ExportedProgram}}`` to ``graph_map``
        under ``"<name>/<method>"`` (an ExportedProgram counts as ``forward``)."""
        for name, prog in extra_recorded_export_modules.items():
            if not isinstance(name, str) or not name or "/" in name:
                raise ETRecordError(f"export module name {name!r} must be a non-empty string without '/'")
            for m, ep in _edge_dict(prog, f"export module {name!r}").items():
                key = f"{name}/{m}"
                if key in self.graph_map:
                    raise ETRecordError(f"graph_map already holds {key!r}")
                self.graph_map[key] = ep

    def update_representative_inputs(self, representative_inputs: Any) -> None:
        """Accepts a tuple/list of inputs (one ``forward`` sample), a list of tuples (several ``forward``
        samples), ``{method: inputs}``, or a BundledProgram-like object (inputs of every test case)."""
        if hasattr(representative_inputs, "method_test_suites"):
            new = {s.method_name: [tuple(_detach(tuple(tc.inputs))) for tc in s.test_cases]
                   for s in _suites(representative_inputs)}
        elif isinstance(representative_inputs, dict):
            new = {str(m): _samples(v) for m, v in representative_inputs.items()}
        else:
            new = {"forward": _samples(representative_inputs)}
        self._representative_inputs = {**(self._representative_inputs or {}), **new}

    def update_reference_outputs(self, reference_outputs: Any) -> None:
        """Accepts a list (one output per ``forward`` test case), ``{method: list}``, or a BundledProgram-like
        object (expected outputs of every test case)."""
        if hasattr(reference_outputs, "method_test_suites"):
            new = {}
            for s in _suites(reference_outputs):
                outs = []
                for i, tc in enumerate(s.test_cases):
                    if getattr(tc, "expected_outputs", None) is None:
                        raise ETRecordError(f"test case {i} of method {s.method_name!r} has no expected outputs")
                    outs.append(_detach(tc.expected_outputs))
                new[s.method_name] = outs
        elif isinstance(reference_outputs, dict):
            new = {str(m): [_detach(x) for x in v] if isinstance(v, list) else [_detach(v)]
                   for m, v in reference_outputs.items()}
        elif isinstance(reference_outputs, list):
            new = {"forward": [_detach(x) for x in reference_outputs]}
        else:
            new = {"forward": [_detach(reference_outputs)]}
        self._reference_outputs = {**(self._reference_outputs or {}), **new}

    def copy(self) -> ETRecord:
        """A shallow copy (programs and tensors shared, containers new) of every field."""
        new = ETRecord.__new__(ETRecord)
        new.__dict__.update(self.__dict__)
        for k in ("exported_programs", "_edge_programs", "graph_map"):
            setattr(new, k, dict(getattr(self, k)))
        for k in ("_debug_handle_map", "_delegate_map", "_instruction_id_to_num_outs_map", "_reference_outputs",
                  "_representative_inputs", "memory_plan"):
            v = getattr(self, k)
            setattr(new, k, None if v is None else {m: (dict(d) if isinstance(d, dict) else list(d))
                                                    for m, d in v.items()})
        return new

    # -- files -------------------------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The ETRecord file as bytes."""
        self._check_complete()
        return ar.to_bytes(ar.build_entries(self))

    def save(self, path: PathOrFile) -> None:
        """Writes the ETRecord zip (atomically for a path). Needs the edge program and the debug-handle map."""
        self._check_complete()
        entries = ar.build_entries(self)  # everything serialized before the file is touched
        if hasattr(path, "write"):
            ar.write_entries(path, entries)  # type: ignore[arg-type]
        else:
            atomic_write(path, writer=lambda f: ar.write_entries(f, entries))

    def _check_complete(self) -> None:
        missing = [what for what, ok in (("the edge dialect program", bool(self._edge_programs)),
                                         ("the debug-handle map", self._debug_handle_map is not None)) if not ok]
        if missing:
            raise ETRecordError(f"cannot save an ETRecord without {' and '.join(missing)}: take it from "
                                "ExecutorchProgramManager.get_etrecord() (after to_executorch) or use "
                                "generate_etrecord(path, edge_program, executorch_program)")

    def __repr__(self) -> str:
        n_instr = sum(len(d) for d in (self._debug_handle_map or {}).values())
        return (f"ETRecord(methods={self.methods}, aten={sorted(self.exported_programs)}, "
                f"graph_map={sorted(self.graph_map)}, instructions={n_instr}, program_hash={self.program_hash!r})")


def parse_etrecord(etrecord_path: PathOrFile) -> ETRecord:
    """Reads an ETRecord file (path, binary file object or bytes); raises ``ETRecordFormatError`` naming the
    entry at fault for any malformed, unsafe or unsupported content. Nothing is unpickled."""
    path = None
    source: Any = etrecord_path
    if isinstance(etrecord_path, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(etrecord_path))
    elif not hasattr(etrecord_path, "read"):
        path = os.fspath(etrecord_path)
        source = path
    fields = ar.read_archive(source, path)
    edge = fields.pop("edge_dialect_program")
    rec = ETRecord(**fields)
    rec._edge_programs = edge or {}  # keeps the method name of a single-method program
    return rec


def generate_etrecord(et_record: str | os.PathLike | IO[bytes], edge_dialect_program: Any, executorch_program: Any,
                      export_modules: dict[str, Any] | None = None,
                      exported_program: ExportedProgram | dict[str, ExportedProgram] | None = None) -> None:
    """Legacy one-shot API: builds an ETRecord from the edge program(s), the ExecutorchProgramManager (or a
    BundledProgram-like object) and optional extra modules, and writes it to ``et_record``.

    No deepcopy is needed: ``to_executorch`` does not mutate the edge programs. When ``exported_program`` is
    not given, the ATen programs kept by the EdgeProgramManager are recorded.
    """
    rec = ETRecord()
    if exported_program is None:
        exported_program = getattr(edge_dialect_program, "_aten_programs", None) or None
    rec.add_exported_program(exported_program)
    rec.add_edge_dialect_program(edge_dialect_program)
    rec.add_executorch_program(executorch_program)
    if export_modules:
        rec.add_extra_export_modules(export_modules)
    rec.save(et_record)
