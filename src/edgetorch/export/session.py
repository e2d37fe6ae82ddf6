"""``export()`` and ``ExportSession``: one call from a model (and a recipe) to a runnable .pte program.

The session validates a pipeline of stages (see ``stages.py``), runs it, keeps every stage's artifact and, when
``artifact_dir`` is given, writes ``<name>.pte``, ``<name>.etrecord`` (with ``generate_etrecord=True``) and
``<name>.summary.json`` (stage durations, methods, planned arena bytes, delegation counts) there.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.fx import GraphModule

from edgetorch._fileio import atomic_write
from edgetorch.errors import (
    EdgeTorchError,
    ExportInputError,
    ExportSessionError,
    MethodNotFoundError,
    PipelineError,
    UnsupportedModelError,
)
from edgetorch.export.recipe import ExportRecipe
from edgetorch.export.stages import (
    EdgeProgramManagerTransformStage,
    EdgeTransformAndLowerStage,
    ExecutorchStage,
    PipelineArtifact,
    QuantizeStage,
    SourceTransformStage,
    Stage,
    ToBackendStage,
    ToEdgeStage,
    TorchExportStage,
)
from edgetorch.export.types import StageType

__all__ = ["ExportSession", "export"]

log = logging.getLogger(__name__)

ModelArg = nn.Module | ExportedProgram | dict[str, nn.Module] | dict[str, ExportedProgram] | str | os.PathLike
InputsArg = list[tuple] | dict[str, list[tuple]] | None

NN_MODULE, GRAPH_MODULE, EXPORTED_PROGRAM = "nn.Module", "GraphModule", "ExportedProgram"

#: Stages that consume eager modules (and may not follow an already-exported input).
_MODULE_STAGES = (StageType.SOURCE_TRANSFORM, StageType.QUANTIZE, StageType.TORCH_EXPORT)
_EDGE_PREFERENCE = (StageType.TO_EDGE_TRANSFORM_AND_LOWER, StageType.TO_BACKEND,
                    StageType.EDGE_PROGRAM_MANAGER_TRANSFORM, StageType.TO_EDGE)


def export(model: ModelArg, example_inputs: InputsArg = None, export_recipe: ExportRecipe | None = None,
           name: str | None = None, dynamic_shapes: Any = None, constant_methods: dict[str, Callable] | None = None,
           artifact_dir: str | os.PathLike | None = None, generate_etrecord: bool = False) -> ExportSession:
    """Builds an :class:`ExportSession` and runs its pipeline.

    ``model``: an ``nn.Module``, a ``GraphModule`` (already quantized: quantization stages are skipped), an
    ``ExportedProgram``, a ``{method: ...}`` dict of one of those, or the path of a ``torch.export.save`` archive
    (``torch.export.load`` can unpickle, i.e. run code from, the file: edgetorch checks the archive first and
    raises ``UnsafeModelFileError`` for any pickled payload, see ``edgetorch.export._load``).
    ``example_inputs``: a list of input tuples (the first exports, all calibrate) or ``{method: [tuples]}``;
    optional for ExportedPrograms. ``export_recipe``: defaults to ``ExportRecipe.get_recipe(PortableRecipeType.FP32)``.
    ``artifact_dir``: where the .pte, ETRecord and JSON summary are written (nothing is written without it).
    """
    session = ExportSession(model, example_inputs, export_recipe, name, dynamic_shapes, constant_methods,
                            artifact_dir, generate_etrecord)
    session.export()
    return session


def _model_kind(model: Any) -> str:
    if isinstance(model, ExportedProgram):
        return EXPORTED_PROGRAM
    if isinstance(model, GraphModule):
        return GRAPH_MODULE
    if isinstance(model, nn.Module):
        return NN_MODULE
    raise UnsupportedModelError(f"unsupported model type {type(model).__name__}: pass an nn.Module, a GraphModule, "
                                "an ExportedProgram, a {method_name: model} dict of these, or the path of a "
                                "program saved with torch.export.save")


def _normalize_samples(method: str, samples: Any) -> list[tuple]:
    if isinstance(samples, torch.Tensor) or not isinstance(samples, (list, tuple)):
        raise ExportInputError(f"example inputs of method '{method}' must be a list of input tuples, e.g. [(x,)] "
                               f"(one tuple per sample), got {type(samples).__name__}")
    if not samples:
        raise ExportInputError(f"example inputs of method '{method}' are empty: give at least one input tuple")
    out = []
    for i, s in enumerate(samples):
        if not isinstance(s, (tuple, list)):
            raise ExportInputError(f"example input {i} of method '{method}' is a {type(s).__name__}; each sample "
                                   "must be a tuple of the method's positional inputs, e.g. (x,)")
        out.append(tuple(s))
    return out


class ExportSession:
    """Runs a validated pipeline of stages over a model and keeps each stage's artifact.

    Construct it, optionally ``register_stage`` custom stages, then call ``export()`` (the module-level
    :func:`export` does both). Every failure raises an ``EdgeTorchError`` subclass saying what to do.
    """

    def __init__(self, model: ModelArg, example_inputs: InputsArg = None, export_recipe: ExportRecipe | None = None,
                 name: str | None = None, dynamic_shapes: Any = None,
                 constant_methods: dict[str, Callable] | None = None,
                 artifact_dir: str | os.PathLike | None = None, generate_etrecord: bool = False) -> None:
        if isinstance(model, (str, os.PathLike)):
            from edgetorch.export._load import load_exported_program

            model = load_exported_program(model)
        self._model = self._normalize_model(model)
        kinds = {_model_kind(m) for m in self._model.values()}
        if len(kinds) != 1:
            raise UnsupportedModelError(f"all methods must be of one kind, got {sorted(kinds)}: export the "
                                        "modules first or pass modules for every method")
        self._input_model_type = kinds.pop()
        self._example_inputs = self._normalize_inputs(example_inputs)
        self._dynamic_shapes = self._normalize_dynamic_shapes(dynamic_shapes)
        if export_recipe is None:
            from edgetorch.export.recipes_portable import PortableRecipeType

            export_recipe = ExportRecipe.get_recipe(PortableRecipeType.FP32)
        if not isinstance(export_recipe, ExportRecipe):
            raise ExportInputError(f"export_recipe must be an ExportRecipe (e.g. ExportRecipe.get_recipe("
                                   f"PortableRecipeType.FP32)), got {type(export_recipe).__name__}")
        self._export_recipe = export_recipe
        self._quant_recipe = export_recipe.quantization_recipe
        self._lowering_recipe = export_recipe.lowering_recipe
        if name is not None and (not isinstance(name, str) or not name or os.sep in name or "/" in name):
            raise ExportInputError(f"name must be a non-empty file stem without path separators, got {name!r}")
        self._name = name
        if artifact_dir is not None:
            artifact_dir = os.fspath(artifact_dir)
            if os.path.exists(artifact_dir) and not os.path.isdir(artifact_dir):
                raise ExportInputError(f"artifact_dir {artifact_dir!r} exists and is not a directory: give a "
                                       "directory path (it is created if missing)")
        self._artifact_dir = artifact_dir
        stages = export_recipe.pipeline_stages
        q = self._quant_recipe
        if stages is None and self._input_model_type != NN_MODULE and q is not None \
                and (q.quantizers or q.ao_quantization_configs):
            log.warning("export: the recipe's quantization is not applied to a %s input (it is treated as already "
                        "quantized); pass the eager nn.Module to quantize it", self._input_model_type)
        self._pipeline_stages: list[StageType] = list(stages if stages is not None else self._get_default_pipeline())
        self._stage_registry: dict[StageType, Stage] = self._build_stages(self._pipeline_stages)
        self._run_context: dict[str, Any] = {
            "example_inputs": self._example_inputs,
            "dynamic_shapes": self._dynamic_shapes,
            "constant_methods": constant_methods,
            "export_recipe": export_recipe,
            "session_name": name,
            "artifact_dir": artifact_dir,
            "generate_etrecord": bool(generate_etrecord),
        }
        self._stage_to_artifacts: dict[StageType, PipelineArtifact] = {}
        self._durations_ms: dict[StageType, float] = {}
        self._program = None  # runtime Program cache for run_method
        self.artifact_paths: dict[str, str] = {}

    # -- input normalization -----------------------------------------------------------------------------------
    @staticmethod
    def _normalize_model(model: Any) -> dict[str, Any]:
        if isinstance(model, dict):
            if not model:
                raise UnsupportedModelError("the model dict is empty: give {method_name: model}")
            for k in model:
                if not isinstance(k, str) or not k:
                    raise UnsupportedModelError(f"method names must be non-empty strings, got {k!r}")
            return dict(model)
        _model_kind(model)
        return {"forward": model}

    def _normalize_inputs(self, example_inputs: Any) -> dict[str, list[tuple]]:
        methods = list(self._model)
        if example_inputs is None:
            if self._input_model_type != EXPORTED_PROGRAM:
                raise ExportInputError(f"example_inputs are required when the model is a {self._input_model_type}"
                                       " (only ExportedProgram inputs may omit them): pass a list of input tuples")
            return {}
        if isinstance(example_inputs, dict):
            unknown = sorted(set(example_inputs) - set(methods))
            if unknown:
                raise ExportInputError(f"example_inputs name methods {unknown} that the model does not have; "
                                       f"methods: {methods}")
            inputs = {m: _normalize_samples(m, v) for m, v in example_inputs.items()}
        else:
            if len(methods) != 1:
                raise ExportInputError(f"the model has methods {methods}: give example_inputs as "
                                       "{method_name: [input tuples]}")
            inputs = {methods[0]: _normalize_samples(methods[0], example_inputs)}
        if self._input_model_type != EXPORTED_PROGRAM:
            missing = [m for m in methods if m not in inputs]
            if missing:
                raise ExportInputError(f"no example inputs for methods {missing}: every method of a "
                                       f"{self._input_model_type} needs at least one input tuple")
        return inputs

    def _normalize_dynamic_shapes(self, dynamic_shapes: Any) -> dict[str, Any]:
        if dynamic_shapes is None:
            return {}
        methods = set(self._model)
        if isinstance(dynamic_shapes, dict) and dynamic_shapes and set(dynamic_shapes) <= methods \
                and (len(methods) > 1 or "forward" in dynamic_shapes):
            return dict(dynamic_shapes)
        if len(methods) != 1:
            raise ExportInputError(f"the model has methods {sorted(methods)}: give dynamic_shapes as "
                                   "{method_name: shapes}")
        return {next(iter(methods)): dynamic_shapes}

    # -- stages ------------------------------------------------------------------------------------------------
    def _get_default_pipeline(self) -> list[StageType]:
        stages: list[StageType] = []
        if self._input_model_type == NN_MODULE:
            stages += [StageType.SOURCE_TRANSFORM, StageType.QUANTIZE]
        if self._input_model_type != EXPORTED_PROGRAM:
            stages.append(StageType.TORCH_EXPORT)
        return stages + [StageType.TO_EDGE_TRANSFORM_AND_LOWER, StageType.TO_EXECUTORCH]

    def _build_stages(self, stages: Sequence[StageType]) -> dict[StageType, Stage]:
        r = self._export_recipe
        factories: dict[StageType, Callable[[], Stage]] = {
            StageType.SOURCE_TRANSFORM: lambda: SourceTransformStage(self._quant_recipe, r.source_transform_in_place),
            StageType.QUANTIZE: lambda: QuantizeStage(self._quant_recipe, r.strict),
            StageType.TORCH_EXPORT: lambda: TorchExportStage(r.aten_transform_passes, r.strict),
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: lambda: EdgeTransformAndLowerStage.from_recipe(
                self._lowering_recipe),
            StageType.TO_EDGE: lambda: ToEdgeStage.from_recipe(self._lowering_recipe),
            StageType.EDGE_PROGRAM_MANAGER_TRANSFORM: lambda: EdgeProgramManagerTransformStage.from_recipe(
                self._lowering_recipe),
            StageType.TO_BACKEND: lambda: ToBackendStage.from_recipe(self._lowering_recipe),
            StageType.TO_EXECUTORCH: lambda: ExecutorchStage(r.executorch_backend_config),
        }
        return {s: factories[s]() for s in dict.fromkeys(stages)}

    def register_stage(self, stage_type: StageType, stage: Stage) -> None:
        """Adds or replaces the stage run for ``stage_type`` (the type must be in the pipeline to run)."""
        if not isinstance(stage_type, StageType):
            raise PipelineError(f"stage_type must be a StageType, got {stage_type!r}")
        if not isinstance(stage, Stage):
            raise PipelineError(f"register_stage needs a Stage instance, got {type(stage).__name__}")
        if stage.stage_type != stage_type:
            raise PipelineError(f"cannot register a {stage.stage_type} stage ({type(stage).__name__}) as "
                                f"{stage_type}: its stage_type property must return {stage_type}")
        self._stage_registry[stage_type] = stage

    def get_registered_stage(self, stage_type: StageType) -> Stage | None:
        """The stage registered for ``stage_type``, or None."""
        return self._stage_registry.get(stage_type)

    def get_all_registered_stages(self) -> dict[StageType, Stage]:
        return dict(self._stage_registry)

    @property
    def pipeline_stages(self) -> list[StageType]:
        return list(self._pipeline_stages)

    @property
    def input_model_type(self) -> str:
        return self._input_model_type

    def _validate_pipeline_sequence(self, stages: Sequence[StageType]) -> None:
        if not stages:
            raise PipelineError("pipeline_stages is empty: give at least one stage, e.g. [TORCH_EXPORT, "
                                "TO_EDGE_TRANSFORM_AND_LOWER, TO_EXECUTORCH]")
        seen: set[StageType] = set()
        for s in stages:
            if s in seen:
                raise PipelineError(f"stage {s} appears twice in the pipeline; each stage type runs at most once")
            seen.add(s)
        if self._input_model_type == GRAPH_MODULE:
            bad = [s for s in stages if s in (StageType.SOURCE_TRANSFORM, StageType.QUANTIZE)]
            if bad:
                names = ", ".join(str(s) for s in bad)
                raise PipelineError(f"cannot run {names} with a GraphModule input: a GraphModule is treated as "
                                    f"already quantized. Remove {names} from pipeline_stages or pass the eager "
                                    "nn.Module")
        elif self._input_model_type == EXPORTED_PROGRAM:
            bad = [s for s in stages if s in _MODULE_STAGES]
            if bad:
                names = ", ".join(str(s) for s in bad)
                raise PipelineError(f"cannot run {names} with an ExportedProgram input: it is already exported. "
                                    f"Remove {names} from pipeline_stages or pass the nn.Module/GraphModule")
        first = stages[0]
        if self._input_model_type != EXPORTED_PROGRAM and first not in _MODULE_STAGES:
            raise PipelineError(f"the pipeline starts at {first}, which needs exported programs, but the model is a "
                                f"{self._input_model_type}: start with TORCH_EXPORT (or pass an ExportedProgram)")
        first_stage = self._stage_registry.get(first)
        if first_stage is None:
            raise PipelineError(f"stage {first} is not registered: register it with session.register_stage()")
        if not first_stage.can_start_pipeline:
            raise PipelineError(f"stage {first} cannot start a pipeline; it needs one of "
                                f"{[str(s) for s in first_stage.valid_predecessor_stages]} before it")
        for prev, cur in zip(stages, stages[1:]):
            stage = self._stage_registry.get(cur)
            if stage is None:
                raise PipelineError(f"stage {cur} is not registered: register it with session.register_stage()")
            valid = list(stage.valid_predecessor_stages)
            if valid and prev not in valid:
                raise PipelineError(f"invalid transition from {prev} to {cur}: {cur} can only follow "
                                    f"{[str(s) for s in valid]}")

    def _run_pipeline(self) -> None:
        self._validate_pipeline_sequence(self._pipeline_stages)
        self._stage_to_artifacts = {}
        self._durations_ms = {}
        self._program = None
        self._lowbit_floats = self._capture_lowbit_floats()
        artifact = PipelineArtifact(self._model, self._run_context)
        for stage_type in self._pipeline_stages:
            stage = self._stage_registry[stage_type]
            log.info("export: running stage %s", stage_type)
            t0 = time.perf_counter()
            try:
                result = stage.run(artifact)
                result = result if isinstance(result, PipelineArtifact) else stage.get_artifacts()
            except EdgeTorchError:
                raise
            except Exception as e:
                raise ExportSessionError(f"stage {stage_type} ({type(stage).__name__}) failed: "
                                         f"{type(e).__name__}: {e}") from e
            elapsed = (time.perf_counter() - t0) * 1000.0
            result.add_context("duration_ms", elapsed)
            self._durations_ms[stage_type] = elapsed
            self._stage_to_artifacts[stage_type] = result
            artifact = result
            log.info("export: stage %s done in %.0f ms", stage_type, elapsed)

    def export(self) -> None:
        """Validates and runs the pipeline, then writes the artifacts when ``artifact_dir`` was given."""
        self._run_pipeline()
        self._record_inputs_in_etrecord()
        if self._artifact_dir is not None:
            self._write_artifacts(self._artifact_dir)

    # -- artifacts ---------------------------------------------------------------------------------------------
    def get_stage_artifacts(self) -> dict[StageType, PipelineArtifact]:
        return dict(self._stage_to_artifacts)

    @property
    def stage_durations_ms(self) -> dict[StageType, float]:
        """Wall time of each stage of the last ``export()`` in milliseconds."""
        return dict(self._durations_ms)

    def get_exported_program(self, method_name: str = "forward") -> ExportedProgram:
        """The ATen ExportedProgram of ``method_name`` (from TORCH_EXPORT, or the input when it was one)."""
        artifact = self._stage_to_artifacts.get(StageType.TORCH_EXPORT)
        if artifact is not None:
            programs = artifact.data
        elif self._input_model_type == EXPORTED_PROGRAM:
            programs = self._model
        else:
            raise ExportSessionError("no exported program: the TORCH_EXPORT stage has not run (call export(), and "
                                     "keep TORCH_EXPORT in pipeline_stages)")
        if method_name not in programs:
            raise MethodNotFoundError(f"no method '{method_name}' in the exported programs; methods: "
                                      f"{sorted(programs)}")
        return programs[method_name]

    def get_edge_program_manager(self) -> Any:
        """The EdgeProgramManager of the last edge stage that ran (lowered first, then transformed, then plain)."""
        for stage_type in _EDGE_PREFERENCE:
            artifact = self._stage_to_artifacts.get(stage_type)
            if artifact is not None and artifact.data is not None:
                return artifact.data
        raise ExportSessionError("no edge program manager: run one of the edge stages first "
                                 "(TO_EDGE_TRANSFORM_AND_LOWER, TO_EDGE, EDGE_PROGRAM_MANAGER_TRANSFORM, TO_BACKEND)")

    def get_executorch_program_manager(self) -> Any:
        artifact = self._stage_to_artifacts.get(StageType.TO_EXECUTORCH)
        if artifact is None or artifact.data is None:
            raise ExportSessionError("no executorch program: the TO_EXECUTORCH stage has not run (call export(), "
                                     "and end pipeline_stages with TO_EXECUTORCH)")
        return artifact.data

    def get_executorch_program(self) -> Any:
        """The emitted program description (``edgetorch.formats.program.ProgramDef``)."""
        return self.get_executorch_program_manager().program

    def get_pte_buffer(self) -> bytes:
        return self.get_executorch_program_manager().buffer

    def save_to_pte(self, output_name: str | os.PathLike) -> str:
        """Writes the .pte atomically to ``output_name`` (``.pte`` appended when missing); returns the path."""
        if not output_name:
            raise ExportInputError("save_to_pte needs a file name, e.g. session.save_to_pte('model.pte')")
        path = os.fspath(output_name)
        if not path.endswith(".pte"):
            path += ".pte"
        et = self.get_executorch_program_manager()
        try:
            et.save(path)
        except OSError as e:
            raise ExportSessionError(f"cannot write {path!r}: {e.strerror or e}") from e
        return path

    def get_example_input(self, method_name: str = "forward") -> tuple:
        """The first example input tuple of ``method_name``."""
        if method_name not in self._model:
            raise MethodNotFoundError(f"no method '{method_name}'; methods: {sorted(self._model)}")
        samples = self._example_inputs.get(method_name)
        if not samples:
            raise ExportSessionError(f"no example inputs for method '{method_name}': pass example_inputs to "
                                     "export(), or give the inputs to run_method()")
        return samples[0]

    def run_method(self, method_name: str = "forward", example_inputs: Sequence[Any] | None = None) -> Any:
        """Runs ``method_name`` of the exported program on the edgetorch runtime (default: its first example
        input); returns the flat list of outputs, as ``Method.execute``."""
        from edgetorch.runtime import Runtime, Verification

        if self._program is None:
            self._program = Runtime.get().load_program(self.get_pte_buffer(), verification=Verification.Minimal)
        method = self._program.load_method(method_name)
        if example_inputs is None:
            example_inputs = self.get_example_input(method_name)
        if isinstance(example_inputs, torch.Tensor):
            example_inputs = (example_inputs,)
        return method.execute(*tuple(example_inputs))

    def get_delegation_info(self, method_name: str = "forward") -> Any:
        """``edgetorch.exir.backend.DelegationInfo`` of a method's edge program (delegated vs portable ops)."""
        from edgetorch.exir.backend import get_delegation_info

        epm = self.get_edge_program_manager()
        if method_name not in epm.methods:
            raise MethodNotFoundError(f"no method '{method_name}'; methods: {sorted(epm.methods)}")
        return get_delegation_info(epm.exported_program(method_name).graph_module)

    def print_delegation_info(self) -> None:
        """Prints, for every method, the delegation summary and the per-operator table."""
        epm = self.get_edge_program_manager()
        for method in sorted(epm.methods):
            info = self.get_delegation_info(method)
            print(f"Method: {method}")
            print(info.get_summary())
            print(info.get_operator_delegation_dataframe().to_string(index=False))

    def get_etrecord(self) -> Any:
        """The ETRecord of the program (``export(..., generate_etrecord=True)``)."""
        et = self.get_executorch_program_manager()
        try:
            return et.get_etrecord()
        except EdgeTorchError as e:
            raise ExportSessionError("no ETRecord was generated: pass generate_etrecord=True to export() / "
                                     "ExportSession()") from e

    def _record_inputs_in_etrecord(self) -> None:
        """Stores each method's first example input in the ETRecord as its representative input, and the float
        programs the QUANTIZE stage captured as ``graph_map["float/<method>"]``."""
        if not self._run_context["generate_etrecord"] or StageType.TO_EXECUTORCH not in self._stage_to_artifacts:
            return
        et = self.get_executorch_program_manager()
        record = et.get_etrecord()
        inputs = {m: [s[0]] for m, s in self._example_inputs.items() if s and m in et.methods}
        if record is not None and inputs:
            record.update_representative_inputs(inputs)
        floats = self._stage_to_artifacts[StageType.TO_EXECUTORCH].get_context("float_programs") \
            or getattr(self, "_lowbit_floats", None)
        if record is not None and floats:  # the quantized program's float reference (quantization debugging)
            record.add_float_reference({m: ep for m, ep in floats.items() if m in et.methods})

    def _capture_lowbit_floats(self) -> dict[str, ExportedProgram] | None:
        """The float programs of a torchao (SOURCE_TRANSFORM) recipe with ``generate_etrecord``: each method of
        the eager model exported before ``quantize_`` (``capture_float_program``: debug handles on its ops),
        recorded as ``graph_map["float/<method>"]`` so a low-bit generation is debugged against float with no
        float model passed. Methods of one module share its weights (stored once in the ETRecord); the buffers
        the programs mutate (KV caches) are snapshotted once, so the record keeps the state the runtime starts
        from even if the eager model runs afterwards."""
        q = self._quant_recipe
        if not (self._run_context["generate_etrecord"] and q is not None and q.ao_quantization_configs
                and self._input_model_type == NN_MODULE and StageType.SOURCE_TRANSFORM in self._pipeline_stages):
            return None
        from edgetorch.export.quantizer import capture_float_program

        out: dict[str, ExportedProgram] = {}
        snap: dict[int, torch.Tensor] = {}
        for method, model in self._model.items():
            sample = self._example_inputs[method][0]
            with torch.no_grad():
                ep = capture_float_program(model, tuple(sample), dynamic_shapes=self._dynamic_shapes.get(method),
                                           strict=self._export_recipe.strict)
            for name in ep.graph_signature.buffers_to_mutate.values():
                table = ep.constants if name in ep.constants else ep.state_dict
                if isinstance(table.get(name), torch.Tensor):
                    buf = table[name]
                    table[name] = snap.setdefault(id(buf), buf.detach().clone())
            out[method] = ep
        return out

    # -- artifact_dir ------------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """What ``<name>.summary.json`` holds: stage durations, methods, memory plan, delegation counts."""
        out: dict[str, Any] = {
            "name": self._name or "model",
            "recipe": self._export_recipe.name,
            "backend": self._export_recipe.backend,
            "input_model_type": self._input_model_type,
            "pipeline": [str(s) for s in self._pipeline_stages],
            "stage_durations_ms": {str(s): round(v, 3) for s, v in self._durations_ms.items()},
            "total_ms": round(sum(self._durations_ms.values()), 3),
            "methods": sorted(self._model),
            "calibration_samples": {m: len(s) for m, s in self._example_inputs.items()},
        }
        if StageType.TO_EXECUTORCH in self._stage_to_artifacts:
            et = self.get_executorch_program_manager()
            out["pte_bytes"] = et.size
            out["content_hash"] = et.content_hash
            out["memory_plan"] = et.memory_plan_report()
        if any(s in self._stage_to_artifacts for s in _EDGE_PREFERENCE):
            delegation = {}
            for m in sorted(self.get_edge_program_manager().methods):
                info = self.get_delegation_info(m)
                delegation[m] = {"delegated_subgraphs": info.num_delegated_subgraphs,
                                 "delegated_nodes": info.num_delegated_nodes,
                                 "non_delegated_nodes": info.num_non_delegated_nodes,
                                 "by_operator": {op: {"delegated": d, "non_delegated": n}
                                                 for op, (d, n) in sorted(info.delegation_by_operator.items())}}
            out["delegation"] = delegation
        return out

    def _write_artifacts(self, directory: str) -> None:
        stem = self._name or "model"
        paths: dict[str, str] = {}
        try:
            os.makedirs(directory, exist_ok=True)
            if StageType.TO_EXECUTORCH in self._stage_to_artifacts:
                paths["pte"] = os.path.join(directory, f"{stem}.pte")
                self.get_executorch_program_manager().save(paths["pte"])
                if self._run_context["generate_etrecord"]:
                    paths["etrecord"] = os.path.join(directory, f"{stem}.etrecord")
                    self.get_etrecord().save(paths["etrecord"])
            paths["summary"] = os.path.join(directory, f"{stem}.summary.json")
            summary = self.summary()
            summary["files"] = {k: os.path.basename(v) for k, v in paths.items()}
            atomic_write(paths["summary"], [json.dumps(summary, indent=2, sort_keys=True).encode() + b"\n"])
        except OSError as e:
            raise ExportSessionError(f"cannot write the export artifacts to {directory!r}: {e.strerror or e} "
                                     "(give a writable artifact_dir)") from e
        self.artifact_paths = paths
