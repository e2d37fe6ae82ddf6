"""One-call export: ``export(model, inputs, ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL))``.

An :class:`ExportSession` runs a validated pipeline of stages (source transform, PT2E quantization,
``torch.export``, edge lowering, emission) chosen from the input model type or the recipe, keeps each stage's
artifact, runs the program on the edgetorch runtime and writes the .pte / ETRecord / summary to
``artifact_dir``. Recipes come from per-backend providers in a registry (portable: FP32 and three INT8 modes).

Example::

    from edgetorch.export import ExportRecipe, PortableRecipeType, export
    session = export(model, [(x,), (x2,)], ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL),
                     artifact_dir="out")
    y = session.run_method("forward", (x,))
"""

from edgetorch.errors import (
    ExportInputError,
    ExportSessionError,
    PipelineError,
    RecipeError,
    UnsafeModelFileError,
    UnsupportedModelError,
)
from edgetorch.export._load import load_exported_program
from edgetorch.export.recipe import (
    AOQuantizationConfig,
    ExportRecipe,
    LoweringRecipe,
    Mode,
    QuantizationRecipe,
    RecipeType,
)
from edgetorch.export.recipes_onnxruntime import OrtRecipeProvider, OrtRecipeType
from edgetorch.export.recipes_portable import PortableRecipeProvider, PortableRecipeType
from edgetorch.export.registry import (
    BackendRecipeProvider,
    RecipeRegistry,
    recipe_registry,
    register_backend_recipe_provider,
)
from edgetorch.export.session import ExportSession, export
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

__all__ = [
    "AOQuantizationConfig",
    "BackendRecipeProvider",
    "EdgeProgramManagerTransformStage",
    "EdgeTransformAndLowerStage",
    "ExecutorchStage",
    "ExportInputError",
    "ExportRecipe",
    "ExportSession",
    "ExportSessionError",
    "LoweringRecipe",
    "Mode",
    "PipelineArtifact",
    "PipelineError",
    "OrtRecipeProvider",
    "OrtRecipeType",
    "PortableRecipeProvider",
    "PortableRecipeType",
    "QuantizationRecipe",
    "QuantizeStage",
    "RecipeError",
    "RecipeRegistry",
    "RecipeType",
    "SourceTransformStage",
    "Stage",
    "StageType",
    "ToBackendStage",
    "ToEdgeStage",
    "TorchExportStage",
    "UnsafeModelFileError",
    "UnsupportedModelError",
    "export",
    "load_exported_program",
    "recipe_registry",
    "register_backend_recipe_provider",
]
