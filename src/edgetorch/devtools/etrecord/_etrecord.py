"""``ETRecord``: the ahead-of-time debug record (programs, handle groups, representative data)."""

from __future__ import annotations

import copy as _copy
import logging
import os
from typing import IO, Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from edgetorch._fileio import atomic_write
from edgetorch.devtools.etrecord import _archive as ar
from edgetorch.devtools.etrecord import _executorch, _executorch_pte
from edgetorch.devtools.etrecord._archive_read import ArchiveSource, read_archive
from edgetorch.devtools.etrecord._handle_tables import groups_from_legacy
from edgetorch.devtools.etrecord._reference import NodeInfo, handles_from_program, reference_from_program
from edgetorch.devtools.etrecord._tensors import UnsupportedValueError
from edgetorch.errors import ETRecordError, MethodNotFoundError
from edgetorch.exir.clone import sync_signature_names
from edgetorch.exir.quant_annotations import float_handles_as_debug_handles
from edgetorch.formats.handles import (
    DELEGATE_CALL,
    IN_DELEGATE,
    HandleGroup,
    debug_handle_map_of,
    delegate_map_of,
)

log = logging.getLogger(__name__)
_FROM_FILE = object()  # cache key of a view loaded from the file's compact entry

PathOrFile = str | os.PathLike | IO[bytes]


def _detach(tree: Any) -> Any:
    return pytree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, tree)


def _edge_dict(program: Any, what: str) -> dict[str, ExportedProgram]:
    """EdgeProgramManager / ExportedProgram / {method: ExportedProgram} -> {method: ExportedProgram}, each
    signature naming its graph's nodes (see ``exir.clone.sync_signature_names``)."""
    out = _edge_dict_of(program, what)
    for ep in out.values():
        sync_signature_names(ep.graph_signature, ep.graph)
    return out


def _edge_dict_of(program: Any, what: str) -> dict[str, ExportedProgram]:
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

    A parsed record is lazy: each group of programs (``exported_programs``, ``edge_programs`` /
    ``edge_dialect_program``, ``graph_map``) is deserialized on first access. ``reference_graph(method)`` and
    ``handle_table(method)`` load from compact entries in milliseconds, without deserializing any program.

    ``handle_groups`` (``exir.debug_handles.HandleGroup`` per instruction and per op inside a delegate) is the
    one table linking runtime events to debug handles; ``debug_handle_map``, ``delegate_map`` and
    ``delegate_outputs`` are views of it in the reference's shapes.
    """

    _ROLES = ("aten", "edge", "graph_map")  #: the program dicts: ATen, edge, extra graphs
    #: "executorch" for a record the reference's exporter wrote (read by ``_executorch``), which also sets
    #: ``num_outputs`` ({method: {delegate call instruction: number of outputs}}) and ``export_graph_id``
    producer: str = "edgetorch"
    num_outputs: dict[str, dict[int, int]] | None = None
    export_graph_id: int | None = None

    def __init__(self, exported_program: ExportedProgram | None = None,
                 edge_dialect_program: ExportedProgram | dict[str, ExportedProgram] | None = None,
                 graph_map: dict[str, ExportedProgram] | None = None,
                 _debug_handle_map: dict[str, dict[int, int | list[int]]] | None = None,
                 _delegate_map: dict[str, dict[int, dict]] | None = None,
                 _reference_outputs: dict[str, list[Any]] | None = None,
                 _representative_inputs: dict[str, list[tuple]] | None = None,
                 *, exported_programs: dict[str, ExportedProgram] | None = None, program_hash: str | None = None,
                 memory_plan: dict[str, dict[str, Any]] | None = None,
                 delegate_outputs: dict[str, dict[int, list[list[int] | None]]] | None = None,
                 handle_groups: dict[str, list[HandleGroup]] | None = None) -> None:
        self._lazy: ArchiveSource | None = None
        aten = dict(exported_programs or {})
        if exported_program is not None:
            aten["forward"] = exported_program
        edge = {} if edge_dialect_program is None else _edge_dict(edge_dialect_program, "edge_dialect_program")
        #: per role (``_ROLES``): {method or graph name: program}; None while a parsed record has not loaded
        #: them yet (``_lazy`` loads them on first use)
        self._roles: dict[str, dict[str, ExportedProgram] | None] = {
            "aten": aten, "edge": edge, "graph_map": dict(graph_map or {})}
        self._reference_cache: dict[str, tuple[Any, torch.fx.GraphModule | None]] = {}
        self._edge_reference_cache: dict[str, tuple[Any, torch.fx.GraphModule | None]] = {}
        self._graph_map_reference_cache: dict[str, tuple[Any, torch.fx.GraphModule | None]] = {}
        self._handle_cache: dict[str, tuple[Any, dict[int, list[NodeInfo]]]] = {}
        #: {method: [HandleGroup]}; None until the executorch stage is recorded. The old tables (debug handle
        #: map, delegate map, delegate outputs) are read into it by the same parser as old files.
        self._handle_groups: dict[str, list[HandleGroup]] | None = (
            {m: list(gs) for m, gs in handle_groups.items()} if handle_groups is not None
            else groups_from_legacy(_debug_handle_map, _delegate_map, delegate_outputs))
        self._reference_outputs: dict[str, list[Any]] | None = _reference_outputs
        self._representative_inputs: dict[str, list[tuple]] | None = _representative_inputs
        self.program_hash: str | None = program_hash
        self.memory_plan: dict[str, dict[str, Any]] | None = memory_plan

    # -- programs ---------------------------------------------------------------------------------------------
    def _programs(self, role: str) -> dict[str, ExportedProgram]:
        d = self._roles[role]
        if d is None:
            assert self._lazy is not None
            d = self._roles[role] = self._lazy.programs(role)  # ETRecordFormatError naming a bad entry
        return d

    def _is_loaded(self, role: str) -> bool:
        """Whether the programs of ``role`` are in memory (a parsed record loads each role on first use)."""
        return self._roles[role] is not None

    def _program_names(self, role: str) -> list[str]:
        d = self._roles[role]
        if d is None:
            assert self._lazy is not None
            return self._lazy.keys(role)
        return list(d)

    @property
    def exported_programs(self) -> dict[str, ExportedProgram]:
        """{method: ATen program} of every method (deserialized on first access for a parsed record)."""
        return self._programs("aten")

    @exported_programs.setter
    def exported_programs(self, programs: dict[str, ExportedProgram]) -> None:
        self._roles["aten"] = dict(programs)

    @property
    def graph_map(self) -> dict[str, ExportedProgram]:
        """{"<name>/<method>": program}: extra graphs (deserialized on first access for a parsed record)."""
        return self._programs("graph_map")

    @graph_map.setter
    def graph_map(self, programs: dict[str, ExportedProgram]) -> None:
        self._roles["graph_map"] = dict(programs)

    def graph_map_names(self) -> list[str]:
        """The keys of :attr:`graph_map` (e.g. ``"float/forward"``), without deserializing any program."""
        return self._program_names("graph_map")

    @property
    def _edge_programs(self) -> dict[str, ExportedProgram]:
        return self._programs("edge")

    @_edge_programs.setter
    def _edge_programs(self, programs: dict[str, ExportedProgram]) -> None:
        self._roles["edge"] = programs

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
        return sorted(self._program_names("edge"))

    def edge_program(self, method: str = "forward") -> ExportedProgram:
        try:
            return self._edge_programs[method]
        except KeyError:
            # a KeyError too; typed, as the name may come from a corrupted ETDump
            raise MethodNotFoundError(f"ETRecord has no edge program for method {method!r}; methods: "
                                      f"{self.methods}") from None

    # -- compact views: reference graph and handle table -----------------------------------------------------------
    def _view_key(self, role: str, method: str) -> Any:
        """What a cached view of ``method`` must have been built from to still be valid: ``_FROM_FILE`` while
        the file's compact entry describes the record's program (that role's programs not loaded yet, or
        ``method`` still maps to the program loaded from the file), else the program object itself (None
        when there is none or it is not loaded)."""
        lazy = self._lazy
        base = {"edge_reference": "edge", "graph_map_reference": "graph_map"}.get(role, role)  # the program viewed
        d = self._roles[base]
        stored = {"aten": lazy.references, "edge": lazy.handles, "edge_reference": lazy.edge_references,
                  "graph_map_reference": lazy.graph_map_references}[role] if lazy is not None else {}
        if lazy is not None and method in stored:
            if d is None or lazy.is_stored(base, method, d.get(method)):
                return _FROM_FILE
        return None if d is None else d.get(method)

    def reference_graph(self, method: str = "forward") -> torch.fx.GraphModule | None:
        """The ATen program of ``method`` as a runnable, flat, unlifted ``GraphModule`` (equivalent to
        ``exported_programs[method].module()``): placeholders are the flattened user inputs, parameters,
        buffers and constants are attributes (zero-copy views of the mapped file for a parsed record), the
        output is the tuple of flattened user outputs. Op nodes keep their names and ``meta["custom"]`` (debug
        handle), ``"stack_trace"``, ``"nn_module_stack"`` and ``"val"`` (shape/dtype as meta tensors).

        Loads in milliseconds from a parsed record without deserializing any program; ``None`` when the
        record has no ATen program for ``method`` or the program cannot be expressed as such a graph (higher-
        order ops, custom objects). The GraphModule is cached: treat it as read-only."""
        return self._graph_view("aten", method)

    def aten_handle_bound(self, method: str = "forward") -> set[int] | None:
        """Before the ATen program of ``method`` is loaded: a superset of the debug handles its
        ``reference_graph`` will carry, read without deserializing it (a reference record's documents); None
        when unknown (already loaded, or a record that cannot tell)."""
        if self._lazy is None or self._roles["aten"] is not None:
            return None
        bound = getattr(self._lazy, "aten_handle_bound", None)
        return bound(method) if bound is not None else None

    def edge_reference_graph(self, method: str = "forward") -> torch.fx.GraphModule | None:
        """The edge program of ``method`` (before lowering) as a runnable flat ``GraphModule``, like
        ``reference_graph`` for the ATen program: loads in milliseconds from a parsed record, without
        deserializing the program (weights are views of the mapped file). ``None`` when there is no edge
        program or it cannot be expressed as such a graph. Cached: treat it as read-only."""
        return self._graph_view("edge_reference", method)

    def graph_map_reference(self, key: str) -> torch.fx.GraphModule | None:
        """The ``graph_map[key]`` program (e.g. ``"float/forward"``, the float program of quantization debugging)
        as a runnable flat ``GraphModule``, like ``reference_graph`` for the ATen program: loads in milliseconds
        from a parsed record without deserializing the program (weights are views of the mapped file; a record
        written before these views existed rebuilds it from the program). ``None`` when ``graph_map`` has no
        ``key`` or the program cannot be expressed as such a graph. Cached: treat it as read-only."""
        return self._graph_view("graph_map_reference", key)

    def _graph_view(self, role: str, method: str) -> torch.fx.GraphModule | None:
        """The cached compact graph of ``method``'s ATen (``role`` "aten"), edge ("edge_reference") or
        ``graph_map`` ("graph_map_reference", ``method`` a graph_map key) program: from the file while its entry
        describes the record's program, else rebuilt from the program."""
        cache, load, programs, what = {
            "aten": (self._reference_cache, "reference_graph", "exported_programs", "reference graph"),
            "edge_reference": (self._edge_reference_cache, "edge_reference_graph", "edge_programs",
                               "edge reference graph"),
            "graph_map_reference": (self._graph_map_reference_cache, "graph_map_reference_graph", "graph_map",
                                    "graph_map reference graph")}[role]
        key = self._view_key(role, method)
        hit = cache.get(method)
        if hit is not None and key is not None and hit[0] is key:
            return hit[1]
        if key is _FROM_FILE:
            assert self._lazy is not None
            gm = getattr(self._lazy, load)(method)
        else:
            key = getattr(self, programs).get(method)
            if key is None:
                return None
            try:
                gm = reference_from_program(key, method)
            except UnsupportedValueError as e:
                log.warning("ETRecord: no %s for method %r: %s", what, method, e)
                gm = None
        cache[method] = (key, gm)
        return gm

    def handle_table(self, method: str = "forward") -> dict[int, list[NodeInfo]]:
        """{debug handle: [NodeInfo, ...]} of the edge program of ``method`` (before lowering): every op node
        that carries a handle (``operator.getitem`` skipped), in graph order. Loads in milliseconds from a
        parsed record without deserializing any program; raises ``KeyError`` when the record has no edge
        program for ``method``."""
        key = self._view_key("edge", method)
        hit = self._handle_cache.get(method)
        if hit is None or key is None or hit[0] is not key:
            if key is _FROM_FILE:
                assert self._lazy is not None
                table = self._lazy.handle_table(method)
            else:
                key = self.edge_program(method)
                table = handles_from_program(key, method)
            hit = (key, table)
            self._handle_cache[method] = hit
        return {h: list(infos) for h, infos in hit[1].items()}

    # -- the handle groups and read-only views of them -------------------------------------------------------------
    @property
    def handle_groups(self) -> dict[str, list[HandleGroup]] | None:
        """{method: [HandleGroup]}: what each instruction (and op inside a delegate) covers; None before the
        executorch stage is recorded."""
        return self._handle_groups

    def _view(self, of: Any) -> dict[str, Any] | None:
        return None if self._handle_groups is None else {m: of(gs) for m, gs in self._handle_groups.items()}

    @property
    def debug_handle_map(self) -> dict[str, dict[int, int | list[int]]] | None:
        """{method: {instruction: kernel handle | delegate call's handle list}} (a view of ``handle_groups``)."""
        return self._view(debug_handle_map_of)

    @property
    def delegate_map(self) -> dict[str, dict[int, dict]] | None:
        """{method: {delegate call: {name, delegate_map: {backend debug id: [handles]}}}} (a view)."""
        return self._view(delegate_map_of)

    @property
    def delegate_outputs(self) -> dict[str, dict[int, list[list[int] | None]]] | None:
        """``{method: {delegate call: [[debug handle, output index] | None, ...]}}``: per output of the call, the
        edge op computing it (a view of the groups; calls of records written before it was kept are absent)."""
        return self._view(lambda gs: {g.instruction_id: [None if o is None else list(o) for o in g.outputs]
                                      for g in gs if g.kind == DELEGATE_CALL and g.outputs is not None})

    @property
    def representative_inputs(self) -> dict[str, list[tuple]] | None:
        return self._representative_inputs

    @property
    def reference_outputs(self) -> dict[str, list[Any]] | None:
        return self._reference_outputs

    # -- built from the compiler's managers ----------------------------------------------------------------------
    @classmethod
    def from_manager(cls, et_manager: Any) -> ETRecord:
        """The record of an ``ExecutorchProgramManager`` built with ``generate_etrecord=True``, from the stage
        history it kept (ATen and edge programs, extra graphs, float programs) and its handle groups. This is what
        ``ExecutorchProgramManager.get_etrecord()`` returns (through ``edgetorch._hooks``)."""
        h = getattr(et_manager, "stage_history", None)
        if h is None:
            raise ETRecordError("the program kept no stage history: pass generate_etrecord=True to to_edge / "
                                "to_edge_transform_and_lower")
        rec = cls(exported_programs=dict(h.aten), edge_dialect_program=dict(h.edge), graph_map=dict(h.graphs))
        if h.float_programs:
            rec.add_float_reference(h.float_programs)
        rec._set_executorch_tables(et_manager)
        return rec

    def _set_executorch_tables(self, et_manager: Any) -> None:
        groups = getattr(et_manager, "handle_groups", None)
        if not isinstance(groups, dict) or not all(isinstance(g, HandleGroup) for gs in groups.values() for g in gs):
            raise ETRecordError(f"{type(et_manager).__name__} gives no handle groups: pass the "
                                "ExecutorchProgramManager returned by to_executorch()")
        self._handle_groups = {m: list(gs) for m, gs in groups.items()}
        self.program_hash = getattr(et_manager, "content_hash", None)
        report = getattr(et_manager, "memory_plan_report", None)
        self.memory_plan = report() if callable(report) else None

    # -- legacy builder API ----------------------------------------------------------------------------------------
    def add_exported_program(self, exported_program: ExportedProgram | dict[str, ExportedProgram] | None) -> None:
        if exported_program is None:
            return
        if self._program_names("aten"):
            raise ETRecordError("the ATen exported program is already set")
        self.exported_programs = _edge_dict(exported_program, "exported_program")

    def add_edge_dialect_program(self, edge_dialect_program: Any) -> None:
        if self._program_names("edge"):
            raise ETRecordError("the edge dialect program is already set")
        self._edge_programs = _edge_dict(edge_dialect_program, "edge_dialect_program")

    def add_executorch_program(self, executorch_program: Any) -> None:
        """Fills the side tables from an ExecutorchProgramManager, or from a BundledProgram-like object (which
        also gives reference outputs and representative inputs)."""
        if self._handle_groups is not None or self.program_hash is not None:
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

    def add_float_reference(self, float_program: ExportedProgram | dict[str, ExportedProgram]) -> None:
        """Records the float (pre-quantization) ATen program of each method under ``graph_map["float/<method>"]``
        for quantization debugging (``Inspector.calculate_numeric_gap(reference_graph="float")``). Its op nodes
        must carry the PT2E numeric debug handles the quantized program kept through prepare/convert
        (``edgetorch.export.quantizer.capture_float_program``); they become the float graph's debug handles."""
        for m, ep in _edge_dict(float_program, "float_program").items():
            if not float_handles_as_debug_handles(ep):
                raise ETRecordError(f"float_program {m!r}: no node carries a numeric debug handle; capture it with "
                                    "edgetorch.export.quantizer.capture_float_program before prepare_pt2e")
            self.graph_map[f"float/{m}"] = ep

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
        new = _copy.copy(self)
        new._roles = {r: None if d is None else dict(d) for r, d in self._roles.items()}  # unloaded stays lazy
        for k in ("_reference_cache", "_edge_reference_cache", "_graph_map_reference_cache", "_handle_cache"):
            setattr(new, k, dict(getattr(self, k)))
        for k in ("_handle_groups", "_reference_outputs", "_representative_inputs", "memory_plan"):
            v = getattr(self, k)
            setattr(new, k, None if v is None else {m: (dict(d) if isinstance(d, dict) else list(d))
                                                    for m, d in v.items()})
        return new

    # -- files -------------------------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The ETRecord file as bytes."""
        self._check_complete()
        return ar.to_bytes(ar.build_entries(self._contents()))

    def save(self, path: PathOrFile) -> None:
        """Writes the ETRecord zip (atomically for a path). Needs the edge program and the debug-handle map."""
        self._check_complete()
        entries = ar.build_entries(self._contents())  # everything serialized before the file is touched
        if hasattr(path, "write"):
            ar.write_entries(path, entries)  # type: ignore[arg-type]
        else:
            atomic_write(path, writer=lambda f: ar.write_entries(f, entries))

    def _contents(self) -> ar.RecordContents:
        return ar.RecordContents(self.exported_programs, self.edge_programs, self.graph_map, self.handle_groups,
                                 self._representative_inputs, self._reference_outputs, self.program_hash,
                                 self.memory_plan)

    def _check_complete(self) -> None:
        missing = [what for what, ok in (("the edge dialect program", bool(self._program_names("edge"))),
                                         ("the handle groups", self._handle_groups is not None)) if not ok]
        if missing:
            raise ETRecordError(f"cannot save an ETRecord without {' and '.join(missing)}: take it from "
                                "ExecutorchProgramManager.get_etrecord() (after to_executorch) or use "
                                "generate_etrecord(path, edge_program, executorch_program)")

    def __repr__(self) -> str:
        n_instr = sum(g.kind != IN_DELEGATE for gs in (self._handle_groups or {}).values() for g in gs)
        return (f"ETRecord(methods={self.methods}, aten={sorted(self._program_names('aten'))}, "
                f"graph_map={sorted(self._program_names('graph_map'))}, instructions={n_instr}, "
                f"program_hash={self.program_hash!r})")


def parse_etrecord(etrecord_path: PathOrFile) -> ETRecord:
    """Reads an ETRecord file (path, binary file object or bytes); raises ``ETRecordFormatError`` naming the
    entry at fault for any malformed, unsafe or unsupported content. Nothing is unpickled.

    The archive structure, the side tables and the representative inputs / reference outputs are validated
    here; the programs, reference graphs and handle tables are read (and validated) on first use, and raise
    ``ETRecordFormatError`` then. From a path the file is memory-mapped (copy-on-write) and tensors are
    built in place; from a file object or bytes it is read into memory once."""
    path = None
    source: Any = etrecord_path
    if not isinstance(etrecord_path, (bytes, bytearray, memoryview)) and not hasattr(etrecord_path, "read"):
        path = os.fspath(etrecord_path)
        source = path
    if _executorch.is_executorch_etrecord(source) or _executorch_pte.is_reference_program(source):
        # the reference's ETRecord, detected by content, or its .pte alone (instructions joined to ops)
        read = _executorch.read_executorch_etrecord if _executorch.is_executorch_etrecord(source) else \
            _executorch_pte.read_reference_program
        fields, extra, source = read(source, path)
        rec = ETRecord(**fields)
        for k, v in extra.items():
            setattr(rec, k, v)
        rec._lazy = source  # programs deserialized on first use
        rec._roles = dict.fromkeys(ETRecord._ROLES)
        return rec
    fields, lazy = read_archive(source, path)
    rec = ETRecord(**fields)
    rec._lazy = lazy
    rec._roles = dict.fromkeys(ETRecord._ROLES)  # loaded on first use (the source keeps the method names)
    return rec


def generate_etrecord(et_record: str | os.PathLike | IO[bytes], edge_dialect_program: Any, executorch_program: Any,
                      *args: Any, export_modules: dict[str, Any] | None = None,
                      exported_program: ExportedProgram | dict[str, ExportedProgram] | None = None,
                      extra_recorded_export_modules: dict[str, Any] | None = None) -> None:
    """Legacy one-shot API: builds an ETRecord from the edge program(s), the ExecutorchProgramManager (or a
    BundledProgram-like object) and optional extra modules, and writes it to ``et_record``.

    Both signatures are accepted: the reference's current one, ``(path, edge, executorch, exported_program=None,
    extra_recorded_export_modules=None)``, and the earlier one, ``(path, edge, executorch, export_modules=None,
    exported_program=None)``. A 4th positional ``ExportedProgram`` is the ATen program (then a 5th is the extra
    modules); a 4th positional dict is the extra modules (then a 5th is the ATen program).
    No deepcopy is needed: ``to_executorch`` does not mutate the edge programs. When ``exported_program`` is
    not given, the ATen programs kept by the EdgeProgramManager are recorded.
    """
    extra = _extra_modules(args, export_modules, extra_recorded_export_modules)
    if len(args) >= 1 and isinstance(args[0], ExportedProgram):
        exported_program = _once(exported_program, args[0], "exported_program")
    elif len(args) == 2:
        exported_program = _once(exported_program, args[1], "exported_program")
    rec = ETRecord()
    if exported_program is None:
        exported_program = getattr(edge_dialect_program, "_aten_programs", None) or None
    rec.add_exported_program(exported_program)
    rec.add_edge_dialect_program(edge_dialect_program)
    rec.add_executorch_program(executorch_program)
    if extra:
        rec.add_extra_export_modules(extra)
    rec.save(et_record)


def _once(given: Any, positional: Any, what: str) -> Any:
    if given is not None:
        raise TypeError(f"generate_etrecord() got {what} both by position and by keyword")
    return positional


def _extra_modules(args: tuple, export_modules: Any, extra_recorded: Any) -> dict[str, Any] | None:
    """The extra modules of ``generate_etrecord`` from its positional tail and either keyword."""
    if len(args) > 2:
        raise TypeError(f"generate_etrecord() takes at most 5 positional arguments ({3 + len(args)} given)")
    if export_modules is not None and extra_recorded is not None:
        raise TypeError("give extra_recorded_export_modules or export_modules, not both")
    extra = extra_recorded if extra_recorded is not None else export_modules
    if args and isinstance(args[0], ExportedProgram):
        positional = args[1] if len(args) == 2 else None
    else:
        positional = args[0] if args else None
    if positional is not None:
        extra = _once(extra, positional, "extra_recorded_export_modules")
    if extra is not None and not isinstance(extra, dict):
        raise ETRecordError(f"extra_recorded_export_modules must be a {{name: program}} dict, got "
                            f"{type(extra).__name__}")
    return extra
