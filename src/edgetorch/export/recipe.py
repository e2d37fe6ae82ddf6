"""Export recipes: what an export session quantizes, how it lowers, and which stages it runs; and the per-backend
recipe providers in the process-wide registry that ``ExportRecipe.get_recipe`` asks.

Adding a backend's recipes is one module: define a ``RecipeType`` enum whose ``get_backend_name()`` returns
the backend name, a ``BackendRecipeProvider`` subclass, and at the bottom of the module call
``register_backend_recipe_provider(MyProvider())``. Importing the enum's module registers the provider, so
``ExportRecipe.get_recipe(MyRecipeType.X)`` works wherever the enum can be named.
"""

from __future__ import annotations

import copy
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from edgetorch.errors import RecipeError
from edgetorch.export.types import StageType

__all__ = [
    "AOQuantizationConfig",
    "BackendRecipeProvider",
    "ExportRecipe",
    "LoweringRecipe",
    "Mode",
    "QuantizationRecipe",
    "RecipeRegistry",
    "RecipeType",
    "recipe_registry",
    "register_backend_recipe_provider",
]


class RecipeType(Enum):
    """Base of every backend's recipe-type enum. Subclasses add members and implement ``get_backend_name``."""

    @classmethod
    def get_backend_name(cls) -> str:
        raise NotImplementedError(f"{cls.__name__} must implement get_backend_name()")


class Mode(StrEnum):
    """Recorded in the recipe for the user's benefit; no stage behaves differently yet."""

    DEBUG = "debug"
    RELEASE = "release"


@dataclass
class AOQuantizationConfig:
    """A torchao ``quantize_`` config (``AOBaseConfig``) applied in the SOURCE_TRANSFORM stage.

    ``filter_fn(module, fqn) -> bool`` picks the modules it applies to (torchao's default: every Linear).
    """

    ao_base_config: Any
    filter_fn: Callable[[Any, str], bool] | None = None


@dataclass
class QuantizationRecipe:
    """PT2E quantizers (run in the QUANTIZE stage) and/or torchao configs (run in SOURCE_TRANSFORM)."""

    quantizers: list[Any] | None = None
    ao_quantization_configs: list[AOQuantizationConfig] | None = None

    def __post_init__(self) -> None:
        for what, value in (("quantizers", self.quantizers), ("ao_quantization_configs",
                                                              self.ao_quantization_configs)):
            if value is not None and not isinstance(value, (list, tuple)):
                raise RecipeError(f"QuantizationRecipe.{what} must be a list, got {type(value).__name__}")
        if self.ao_quantization_configs:
            for c in self.ao_quantization_configs:
                if not isinstance(c, AOQuantizationConfig):
                    raise RecipeError("ao_quantization_configs entries must be AOQuantizationConfig(config, "
                                      f"filter_fn), got {type(c).__name__}")

    def get_quantizers(self) -> list[Any] | None:
        return list(self.quantizers) if self.quantizers else None


class LoweringRecipe:
    """How edge programs are transformed and lowered.

    ``partitioners`` (alias ``partitioner``): partitioners handed to ``to_edge_transform_and_lower`` /
    ``to_backend``. ``edge_transform_passes``: factories ``(method_name, edge_program) -> list of passes`` run
    on each method's edge program. ``edge_manager_transform_passes``: callables
    ``(EdgeProgramManager) -> EdgeProgramManager`` run after them (EDGE_PROGRAM_MANAGER_TRANSFORM stage only).
    ``edge_compile_config``: an ``edgetorch.exir.EdgeCompileConfig``.
    """

    def __init__(self, partitioners: Sequence[Any] | None = None,
                 edge_transform_passes: Sequence[Callable] | None = None,
                 edge_compile_config: Any = None,
                 edge_manager_transform_passes: Sequence[Callable] | None = None,
                 *, partitioner: Sequence[Any] | None = None) -> None:
        if partitioners is not None and partitioner is not None:
            raise RecipeError("give either partitioners= or partitioner= to LoweringRecipe, not both")
        parts = partitioners if partitioners is not None else partitioner
        if parts is not None and not isinstance(parts, (list, tuple)):
            parts = [parts]
        self.partitioners: list[Any] | None = list(parts) if parts is not None else None
        self.edge_transform_passes = list(edge_transform_passes) if edge_transform_passes is not None else None
        self.edge_manager_transform_passes = (list(edge_manager_transform_passes)
                                              if edge_manager_transform_passes is not None else None)
        self.edge_compile_config = edge_compile_config

    @property
    def partitioner(self) -> list[Any] | None:
        return self.partitioners

    def __repr__(self) -> str:
        return (f"LoweringRecipe(partitioners={self.partitioners!r}, edge_transform_passes="
                f"{self.edge_transform_passes!r}, edge_compile_config={self.edge_compile_config!r})")


@dataclass
class ExportRecipe:
    """Everything an export session needs besides the model and its inputs.

    ``aten_transform_passes``: callables ``(method_name, exported_program) -> exported_program`` run after
    ``torch.export``. ``pipeline_stages``: the stages to run (default: chosen from the input model type).
    ``strict``: passed to ``torch.export.export`` (``False``, torch's default, unless set; a non-strict export
    that would freeze module buffers reached through Python objects, e.g. a Hugging Face ``StaticCache``, is
    redone with ``strict=True``: ``export/_capture.py``).
    ``executorch_backend_config``: an ``edgetorch.exir.ExecutorchBackendConfig``.
    """

    name: str | None = None
    quantization_recipe: QuantizationRecipe | None = None
    aten_transform_passes: list[Callable] | None = None
    source_transform_in_place: bool = False
    lowering_recipe: LoweringRecipe | None = None
    executorch_backend_config: Any = None
    pipeline_stages: list[StageType] | None = None
    mode: Mode = Mode.RELEASE
    strict: bool = False
    backend: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.quantization_recipe is not None and not isinstance(self.quantization_recipe, QuantizationRecipe):
            raise RecipeError("quantization_recipe must be a QuantizationRecipe, got "
                              f"{type(self.quantization_recipe).__name__}")
        if self.lowering_recipe is not None and not isinstance(self.lowering_recipe, LoweringRecipe):
            raise RecipeError(f"lowering_recipe must be a LoweringRecipe, got {type(self.lowering_recipe).__name__}")
        if self.pipeline_stages is not None:
            stages = list(self.pipeline_stages)
            bad = [s for s in stages if not isinstance(s, StageType)]
            if bad:
                raise RecipeError(f"pipeline_stages must be StageType members, got {bad!r}")
            self.pipeline_stages = stages

    @classmethod
    def get_recipe(cls, recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe:
        """The recipe a backend provider builds for ``recipe_type`` (e.g. ``PortableRecipeType.FP32``)."""
        if not isinstance(recipe_type, RecipeType):
            raise RecipeError(f"recipe_type must be a RecipeType enum member (e.g. PortableRecipeType.FP32), "
                              f"got {recipe_type!r}")
        backend = recipe_type.get_backend_name()
        recipe = recipe_registry.create_recipe(recipe_type, backend, **kwargs)
        if recipe is None:
            supported = [r.name for r in recipe_registry.get_supported_recipes(backend)]
            raise RecipeError(f"backend '{backend}' cannot build recipe {recipe_type.name}; "
                              f"it supports: {supported}")
        return recipe

    @classmethod
    def combine(cls, recipes: Sequence[ExportRecipe], recipe_name: str | None = None) -> ExportRecipe:
        """Merges recipes in order (e.g. a delegate's recipe then a portable fallback).

        Lists (ATen passes, quantizers, torchao configs, partitioners, edge passes) are concatenated; the first
        recipe that sets the edge compile config, the backend config or the pipeline stages wins; ``strict`` is
        true if any recipe asks for it; the name is ``recipe_name`` or the names joined with ``_``.
        """
        recipes = list(recipes or [])
        if not recipes or not all(isinstance(r, ExportRecipe) for r in recipes):
            raise RecipeError("ExportRecipe.combine needs a non-empty list of ExportRecipe")
        if len(recipes) == 1:
            return copy.copy(recipes[0]) if recipe_name is None else _renamed(recipes[0], recipe_name)

        def cat(values: list[list | None]) -> list | None:
            out = [x for v in values if v for x in v]
            return out or None

        def first(values: list[Any]) -> Any:
            return next((v for v in values if v is not None), None)

        quant = [r.quantization_recipe for r in recipes if r.quantization_recipe is not None]
        low = [r.lowering_recipe for r in recipes if r.lowering_recipe is not None]
        quantization = None
        if quant:
            quantization = QuantizationRecipe(cat([q.quantizers for q in quant]),
                                              cat([q.ao_quantization_configs for q in quant]))
        lowering = None
        if low:
            lowering = LoweringRecipe(cat([lr.partitioners for lr in low]),
                                      cat([lr.edge_transform_passes for lr in low]),
                                      first([lr.edge_compile_config for lr in low]),
                                      cat([lr.edge_manager_transform_passes for lr in low]))
        backend_config = first([r.executorch_backend_config for r in recipes])
        name = recipe_name or "_".join(r.name for r in recipes if r.name) or None
        return cls(name=name, quantization_recipe=quantization,
                   aten_transform_passes=cat([r.aten_transform_passes for r in recipes]),
                   source_transform_in_place=any(r.source_transform_in_place for r in recipes),
                   lowering_recipe=lowering,
                   executorch_backend_config=copy.deepcopy(backend_config),
                   pipeline_stages=first([r.pipeline_stages for r in recipes]),
                   mode=recipes[0].mode, strict=any(r.strict for r in recipes),
                   backend="+".join(dict.fromkeys(r.backend for r in recipes if r.backend)) or None)


def _renamed(recipe: ExportRecipe, name: str) -> ExportRecipe:
    r = copy.copy(recipe)
    r.name = name
    return r


class BackendRecipeProvider(ABC):
    """Builds the export recipes of one backend."""

    @property
    @abstractmethod
    def backend_name(self) -> str:
        """The name ``RecipeType.get_backend_name()`` returns for this backend's recipe types."""

    @abstractmethod
    def get_supported_recipes(self) -> Sequence[RecipeType]:
        """Every recipe type ``create_recipe`` can build."""

    @abstractmethod
    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe | None:
        """The recipe for ``recipe_type``, or None when this provider does not support it."""

    def supports_recipe(self, recipe_type: RecipeType) -> bool:
        return recipe_type in self.get_supported_recipes()


class RecipeRegistry:
    """Backend name -> provider; registering the same backend again replaces its provider."""

    def __init__(self) -> None:
        self._providers: dict[str, BackendRecipeProvider] = {}
        self._lock = threading.Lock()

    def register_backend_recipe_provider(self, provider: BackendRecipeProvider) -> None:
        if not isinstance(provider, BackendRecipeProvider):
            raise RecipeError(f"expected a BackendRecipeProvider, got {type(provider).__name__}")
        with self._lock:
            self._providers[provider.backend_name] = provider

    def get_provider(self, backend: str) -> BackendRecipeProvider:
        with self._lock:
            provider = self._providers.get(backend)
            known = sorted(self._providers)
        if provider is None:
            raise RecipeError(f"no recipe provider is registered for backend '{backend}'; registered backends: "
                              f"{known}. Import the module that defines the backend's recipe types (it registers "
                              "the provider), or call register_backend_recipe_provider().")
        return provider

    def create_recipe(self, recipe_type: RecipeType, backend: str, **kwargs: Any) -> ExportRecipe | None:
        provider = self.get_provider(backend)
        if not provider.supports_recipe(recipe_type):
            return None
        recipe = provider.create_recipe(recipe_type, **kwargs)
        if recipe is not None and recipe.backend is None:
            recipe.backend = backend
        return recipe

    def get_supported_recipes(self, backend: str) -> list[RecipeType]:
        return list(self.get_provider(backend).get_supported_recipes())

    def list_backends(self) -> list[str]:
        with self._lock:
            return sorted(self._providers)


#: The process-wide registry.
recipe_registry = RecipeRegistry()


def register_backend_recipe_provider(provider: BackendRecipeProvider) -> None:
    """Registers ``provider`` in the process-wide registry (call it once, at import of the backend's module)."""
    recipe_registry.register_backend_recipe_provider(provider)
