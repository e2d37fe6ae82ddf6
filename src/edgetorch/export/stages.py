"""The stages of an export pipeline. Each consumes the previous stage's artifact and produces its own.

Data handed between stages: ``{method: nn.Module | GraphModule}`` up to QUANTIZE, ``{method: ExportedProgram}``
after TORCH_EXPORT, an ``EdgeProgramManager`` after the edge stages, an ``ExecutorchProgramManager`` after
TO_EXECUTORCH. A custom stage subclasses :class:`Stage`, stores its result in ``self._artifact`` (or returns a
:class:`PipelineArtifact` from ``run``) and is installed with ``ExportSession.register_stage``.
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from edgetorch.errors import ExportInputError, ExportSessionError, RecipeError
from edgetorch.export._capture import export_method
from edgetorch.export.recipe import LoweringRecipe, QuantizationRecipe
from edgetorch.export.types import StageType

__all__ = [
    "EdgeProgramManagerTransformStage",
    "EdgeTransformAndLowerStage",
    "ExecutorchStage",
    "PipelineArtifact",
    "QuantizeStage",
    "SourceTransformStage",
    "Stage",
    "ToBackendStage",
    "ToEdgeStage",
    "TorchExportStage",
]

log = logging.getLogger(__name__)


class PipelineArtifact:
    """The data a stage produced plus the run context (example inputs, dynamic shapes, timings, ...)."""

    def __init__(self, data: Any, context: dict[str, Any] | None = None) -> None:
        self.data = data
        self.context: dict[str, Any] = dict(context or {})

    def add_context(self, key: str, value: Any) -> None:
        self.context[key] = value

    def get_context(self, key: str, default: Any = None) -> Any:
        return self.context.get(key, default)

    def copy_with_new_data(self, data: Any) -> PipelineArtifact:
        """A new artifact holding ``data`` and a shallow copy of this context."""
        return PipelineArtifact(data, dict(self.context))

    def __repr__(self) -> str:
        return f"PipelineArtifact(data={type(self.data).__name__}, context_keys={sorted(self.context)})"


class Stage(ABC):
    """One step of the pipeline.

    ``valid_predecessor_stages``: the stage types allowed right before this one (empty: any).
    ``can_start_pipeline``: whether this stage may be first.
    """

    def __init__(self) -> None:
        self._artifact: PipelineArtifact | None = None

    @property
    @abstractmethod
    def stage_type(self) -> StageType:
        """The stage type this stage implements."""

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return []

    @property
    def can_start_pipeline(self) -> bool:
        return True

    @abstractmethod
    def run(self, artifact: PipelineArtifact) -> PipelineArtifact | None:
        """Consumes ``artifact`` and stores (or returns) the result."""

    def get_artifacts(self) -> PipelineArtifact:
        if self._artifact is None:
            raise ExportSessionError(f"stage {self.stage_type} has not produced an artifact yet: run the pipeline "
                                     "with ExportSession.export() first")
        return self._artifact

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.stage_type})"


# ---------------------------------------------------------------------------------------------------------------
def _expect_modules(data: Any, stage: StageType) -> dict[str, torch.nn.Module]:
    if isinstance(data, dict) and data and all(isinstance(v, torch.nn.Module) for v in data.values()):
        return data
    raise ExportSessionError(f"stage {stage} expects {{method: nn.Module or GraphModule}}, got "
                             f"{_describe(data)}; put it before TORCH_EXPORT or pass an nn.Module")


def _expect_programs(data: Any, stage: StageType) -> dict[str, ExportedProgram]:
    if isinstance(data, dict) and data and all(isinstance(v, ExportedProgram) for v in data.values()):
        return data
    raise ExportSessionError(f"stage {stage} expects {{method: ExportedProgram}}, got {_describe(data)}; "
                             "run TORCH_EXPORT before it or pass an ExportedProgram")


def _expect_edge(data: Any, stage: StageType) -> Any:
    from edgetorch.exir import EdgeProgramManager

    if isinstance(data, EdgeProgramManager):
        return data
    raise ExportSessionError(f"stage {stage} expects an EdgeProgramManager, got {_describe(data)}; run TO_EDGE "
                             "or TO_EDGE_TRANSFORM_AND_LOWER before it")


def _describe(data: Any) -> str:
    if isinstance(data, dict):
        return "{" + ", ".join(f"{k!r}: {type(v).__name__}" for k, v in data.items()) + "}"
    return type(data).__name__


def _method_inputs(artifact: PipelineArtifact, method: str, stage: StageType) -> list[tuple]:
    samples = (artifact.get_context("example_inputs") or {}).get(method)
    if not samples:
        raise ExportInputError(f"stage {stage}: no example inputs for method '{method}': pass example_inputs "
                               "to export() as a list of input tuples or {method: [tuples]}")
    return samples


def _resolve_edge_passes(factories: Sequence[Callable] | None,
                         programs: dict[str, ExportedProgram]) -> dict[str, list] | None:
    """Calls each factory ``(method, edge_program) -> pass or list of passes`` for every method."""
    if not factories:
        return None
    out: dict[str, list] = {}
    for method, ep in programs.items():
        plist: list = []
        for factory in factories:
            got = factory(method, ep)
            if got is None:
                continue
            plist.extend(got if isinstance(got, (list, tuple)) else [got])
        out[method] = plist
    return out if any(out.values()) else None


def _drop_unused_attributes(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Deletes the parameters and buffers no ``get_attr`` node reads. ``convert_pt2e`` leaves the float weights
    it replaced with folded int8 constants on the module, and ``torch.export`` would lift (and the .pte store) them:
    ResNet-18 would carry 44.5 MiB of dead float weights next to 11 MiB of int8 ones."""
    gm.graph.eliminate_dead_code()
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    names = [n for n, _ in gm.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in gm.named_buffers(remove_duplicate=False)]
    for name in names:
        if name in used:
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        if hasattr(owner, attr):
            delattr(owner, attr)
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


# ---------------------------------------------------------------------------------------------------------------
def _has_tensor_subclass_weights(data: Any) -> bool:
    """Whether some module holds a tensor-subclass parameter (a model quantized by hand with torchao's
    ``quantize_``); cheap: torchao is not imported for plain modules."""
    if not isinstance(data, dict):
        return False
    return any(type(p) not in (torch.nn.Parameter, torch.Tensor)
               for m in data.values() if isinstance(m, torch.nn.Module) for p in m.parameters())


class SourceTransformStage(Stage):
    """Applies the recipe's torchao ``quantize_`` configs to (copies of) the eager modules, then swaps the
    quantized Linear/Embedding modules for packed low-bit ones (``edgetorch.export.lowbit``). A model quantized
    by hand with torchao is lowered the same way; a plain model without configs passes through."""

    def __init__(self, quantization_recipe: QuantizationRecipe | None = None, in_place: bool = False) -> None:
        super().__init__()
        self._recipe = quantization_recipe
        self._in_place = in_place

    @property
    def stage_type(self) -> StageType:
        return StageType.SOURCE_TRANSFORM

    def run(self, artifact: PipelineArtifact) -> None:
        configs = self._recipe.ao_quantization_configs if self._recipe else None
        if not configs and not _has_tensor_subclass_weights(artifact.data):
            self._artifact = artifact
            return
        from torchao.quantization import quantize_
        from torchao.utils import unwrap_tensor_subclass

        from edgetorch.export.lowbit import lower_lowbit_modules

        models = _expect_modules(artifact.data, self.stage_type)
        out: dict[str, torch.nn.Module] = {}
        done: dict[int, torch.nn.Module] = {}  # methods of one module (prefill + decode) share one quantized copy
        for method, model in models.items():
            if id(model) in done:
                out[method] = done[id(model)]
                continue
            m = model if self._in_place else copy.deepcopy(model)
            for cfg in configs or ():
                if cfg.filter_fn is None:
                    quantize_(m, cfg.ao_base_config)
                else:
                    quantize_(m, cfg.ao_base_config, cfg.filter_fn)
            report = lower_lowbit_modules(m)  # packed weights + low-bit ops where torchao's weights allow
            log.info("SOURCE_TRANSFORM(%s): %d low-bit module(s), %d kept decomposed", method,
                     len(report.lowered), len(report.skipped))
            out[method] = done[id(model)] = unwrap_tensor_subclass(m)
        self._artifact = artifact.copy_with_new_data(out)


class QuantizeStage(Stage):
    """PT2E post-training quantization: export -> ``prepare_pt2e`` -> calibrate on every example input ->
    ``convert_pt2e`` (with the bias correction the quantizer asks for: ``convert_calibrated``); no-op when the
    recipe has no quantizers."""

    def __init__(self, quantization_recipe: QuantizationRecipe | None = None, strict: bool = False) -> None:
        super().__init__()
        self._recipe = quantization_recipe
        self._strict = strict

    @property
    def stage_type(self) -> StageType:
        return StageType.QUANTIZE

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.SOURCE_TRANSFORM]

    def _quantizer(self) -> Any:
        quantizers = self._recipe.get_quantizers() if self._recipe else None
        if not quantizers:
            return None
        from torchao.quantization.pt2e.quantizer import ComposableQuantizer, Quantizer

        bad = [type(q).__name__ for q in quantizers if not isinstance(q, Quantizer)]
        if bad:
            raise RecipeError(f"QUANTIZE: quantizers must be torchao.quantization.pt2e.quantizer.Quantizer "
                              f"instances, got {bad}")
        return quantizers[0] if len(quantizers) == 1 else ComposableQuantizer(quantizers)

    def run(self, artifact: PipelineArtifact) -> None:
        quantizer = self._quantizer()
        if quantizer is None:
            self._artifact = artifact
            return
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

        from edgetorch.export.quantizer import capture_float_program, convert_calibrated

        models = _expect_modules(artifact.data, self.stage_type)
        shapes = artifact.get_context("dynamic_shapes") or {}
        out, floats = {}, {}
        for method, model in models.items():
            samples = _method_inputs(artifact, method, self.stage_type)
            # the float program, numeric debug handles on its ops: they survive prepare/convert, and the program
            # travels in the ETRecord as graph_map["float/<method>"] (quantization debugging against float)
            floats[method] = capture_float_program(model, samples[0], dynamic_shapes=shapes.get(method),
                                                   strict=self._strict)
            prepared = prepare_pt2e(floats[method].module(), quantizer)
            with torch.no_grad():
                for sample in samples:
                    prepared(*sample)
            out[method] = _drop_unused_attributes(convert_calibrated(prepared, quantizer, samples))
            log.info("QUANTIZE(%s): calibrated on %d samples", method, len(samples))
        self._artifact = artifact.copy_with_new_data(out)
        self._artifact.add_context("float_programs", floats)


class TorchExportStage(Stage):
    """``torch.export.export`` each method on its first example input, then the recipe's ATen passes
    ``(method, ExportedProgram) -> ExportedProgram``."""

    def __init__(self, aten_transform_passes: Sequence[Callable] | None = None, strict: bool = False) -> None:
        super().__init__()
        self._passes = list(aten_transform_passes or [])
        self._strict = strict

    @property
    def stage_type(self) -> StageType:
        return StageType.TORCH_EXPORT

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.SOURCE_TRANSFORM, StageType.QUANTIZE]

    def run(self, artifact: PipelineArtifact) -> None:
        models = _expect_modules(artifact.data, self.stage_type)
        shapes = artifact.get_context("dynamic_shapes") or {}
        out = {}
        for method, model in models.items():
            sample = _method_inputs(artifact, method, self.stage_type)[0]
            with torch.no_grad():
                ep = export_method(model, tuple(sample), dynamic_shapes=shapes.get(method), strict=self._strict,
                                   method=method)
            for p in self._passes:
                ep = p(method, ep)
                if not isinstance(ep, ExportedProgram):
                    raise ExportSessionError(f"TORCH_EXPORT: ATen pass {getattr(p, '__name__', p)!r} returned "
                                             f"{type(ep).__name__} for method '{method}'; an ATen pass must be "
                                             "(method_name, ExportedProgram) -> ExportedProgram")
            out[method] = ep
        self._artifact = artifact.copy_with_new_data(out)


class EdgeTransformAndLowerStage(Stage):
    """``to_edge_transform_and_lower`` with the lowering recipe's partitioners, passes and compile config."""

    def __init__(self, partitioners: Sequence[Any] | None = None, transform_passes: Sequence[Callable] | None = None,
                 compile_config: Any = None) -> None:
        super().__init__()
        self._partitioners = list(partitioners or [])
        self._passes = list(transform_passes or [])
        self._config = compile_config

    @classmethod
    def from_recipe(cls, recipe: LoweringRecipe | None) -> EdgeTransformAndLowerStage:
        if recipe is None:
            return cls()
        return cls(recipe.partitioners, recipe.edge_transform_passes, recipe.edge_compile_config)

    @property
    def stage_type(self) -> StageType:
        return StageType.TO_EDGE_TRANSFORM_AND_LOWER

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.TORCH_EXPORT]

    def run(self, artifact: PipelineArtifact) -> None:
        from edgetorch.exir import to_edge_transform_and_lower

        programs = _expect_programs(artifact.data, self.stage_type)
        epm = to_edge_transform_and_lower(
            programs, transform_passes=_resolve_edge_passes(self._passes, programs),
            partitioner=self._partitioners or None, constant_methods=artifact.get_context("constant_methods"),
            compile_config=self._config, generate_etrecord=bool(artifact.get_context("generate_etrecord")))
        self._artifact = artifact.copy_with_new_data(epm)


class ToEdgeStage(Stage):
    """``to_edge``: ATen programs to the edge dialect, no delegation."""

    def __init__(self, edge_compile_config: Any = None) -> None:
        super().__init__()
        self._config = edge_compile_config

    @classmethod
    def from_recipe(cls, recipe: LoweringRecipe | None) -> ToEdgeStage:
        return cls(recipe.edge_compile_config if recipe else None)

    @property
    def stage_type(self) -> StageType:
        return StageType.TO_EDGE

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.TORCH_EXPORT]

    def run(self, artifact: PipelineArtifact) -> None:
        from edgetorch.exir import to_edge

        programs = _expect_programs(artifact.data, self.stage_type)
        epm = to_edge(programs, constant_methods=artifact.get_context("constant_methods"),
                      compile_config=self._config, generate_etrecord=bool(artifact.get_context("generate_etrecord")))
        self._artifact = artifact.copy_with_new_data(epm)


class EdgeProgramManagerTransformStage(Stage):
    """Runs edge passes (factories ``(method, edge_program) -> passes``) through ``EdgeProgramManager.transform``,
    then each manager-level callable ``(EdgeProgramManager) -> EdgeProgramManager``."""

    def __init__(self, edge_transform_passes: Sequence[Callable] | None = None,
                 edge_manager_transform_passes: Sequence[Callable] | None = None) -> None:
        super().__init__()
        self._passes = list(edge_transform_passes or [])
        self._manager_passes = list(edge_manager_transform_passes or [])

    @classmethod
    def from_recipe(cls, recipe: LoweringRecipe | None) -> EdgeProgramManagerTransformStage:
        if recipe is None:
            return cls()
        return cls(recipe.edge_transform_passes, recipe.edge_manager_transform_passes)

    @property
    def stage_type(self) -> StageType:
        return StageType.EDGE_PROGRAM_MANAGER_TRANSFORM

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.TO_EDGE, StageType.TO_EDGE_TRANSFORM_AND_LOWER]

    @property
    def can_start_pipeline(self) -> bool:
        return False

    def run(self, artifact: PipelineArtifact) -> None:
        from edgetorch.exir import EdgeProgramManager

        epm = _expect_edge(artifact.data, self.stage_type)
        passes = _resolve_edge_passes(self._passes, {m: epm.exported_program(m) for m in sorted(epm.methods)})
        if passes:
            epm = epm.transform(passes)
        for p in self._manager_passes:
            epm = p(epm)
            if not isinstance(epm, EdgeProgramManager):
                raise ExportSessionError(f"EDGE_PROGRAM_MANAGER_TRANSFORM: manager pass {getattr(p, '__name__', p)!r}"
                                         f" returned {type(epm).__name__}, not an EdgeProgramManager")
        self._artifact = artifact.copy_with_new_data(epm)


class ToBackendStage(Stage):
    """``EdgeProgramManager.to_backend`` once per partitioner (pass-through without partitioners)."""

    def __init__(self, partitioners: Sequence[Any] | None = None) -> None:
        super().__init__()
        self._partitioners = list(partitioners or [])

    @classmethod
    def from_recipe(cls, recipe: LoweringRecipe | None) -> ToBackendStage:
        return cls(recipe.partitioners if recipe else None)

    @property
    def stage_type(self) -> StageType:
        return StageType.TO_BACKEND

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.TO_EDGE, StageType.EDGE_PROGRAM_MANAGER_TRANSFORM]

    @property
    def can_start_pipeline(self) -> bool:
        return False

    def run(self, artifact: PipelineArtifact) -> None:
        epm = _expect_edge(artifact.data, self.stage_type)
        for p in self._partitioners:
            epm = epm.to_backend(p)
        self._artifact = artifact.copy_with_new_data(epm)


class ExecutorchStage(Stage):
    """``EdgeProgramManager.to_executorch``: memory planning and emission of the .pte program."""

    def __init__(self, backend_config: Any = None) -> None:
        super().__init__()
        self._config = backend_config

    @property
    def stage_type(self) -> StageType:
        return StageType.TO_EXECUTORCH

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.TO_EDGE_TRANSFORM_AND_LOWER, StageType.TO_BACKEND, StageType.EDGE_PROGRAM_MANAGER_TRANSFORM]

    @property
    def can_start_pipeline(self) -> bool:
        return False

    def run(self, artifact: PipelineArtifact) -> None:
        epm = _expect_edge(artifact.data, self.stage_type)
        self._artifact = artifact.copy_with_new_data(epm.to_executorch(self._config))
