"""Recipes that lower to the ONNX Runtime delegate: FP32, and PT2E INT8 whose Q/DQ pairs ORT runs as integer
kernels (QLinearConv, QGemm, ...). What ``XNNPackRecipeType`` is to the reference, with ORT in its place::

    from edgetorch.export import ExportRecipe, OrtRecipeType, export
    session = export(model, [inputs], ExportRecipe.get_recipe(OrtRecipeType.INT8_STATIC_PER_CHANNEL))

``create_recipe`` takes the ``OrtPartitioner`` options (``exclude_ops``, ``exclude_nodes``,
``exclude_module_paths``, ``fallback_unsupported``, ``graph_optimization_level``, ...: ``exclude_*`` keep ops out
of the delegate) and, for INT8 recipes, ``activation_observer``, ``bias_correction`` and the quantization exclusions
``quant_exclude_module_paths`` / ``quant_exclude_nodes`` / ``quant_exclude_ops`` (ops kept in float, still run by
ORT in FP32; see ``SymmetricQuantizationConfig``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from edgetorch.errors import RecipeError
from edgetorch.export.recipe import (
    BackendRecipeProvider,
    ExportRecipe,
    LoweringRecipe,
    RecipeType,
    register_backend_recipe_provider,
)
from edgetorch.export.recipes_portable import QUANT_EXCLUSION_OPTIONS, int8_quantization_recipe
from edgetorch.export.recipes_torchao import TORCHAO_RECIPES, pop_torchao_options, torchao_quantization_recipe

__all__ = ["OrtRecipeProvider", "OrtRecipeType"]

BACKEND_NAME = "onnxruntime"


class OrtRecipeType(RecipeType):
    """Recipes lowered to ONNX Runtime: float, or PT2E static INT8 (per channel / per tensor weights).

    No dynamic INT8 recipe: the PT2E dynamic pattern computes its activation parameters with
    ``choose_qparams``, which has no ONNX translation here, so such a graph would split into several ORT
    partitions with portable ops between them (use ``PortableRecipeType.INT8_DYNAMIC_PER_CHANNEL``)."""

    FP32 = "onnxruntime_fp32"
    INT8_STATIC_PER_CHANNEL = "onnxruntime_int8_static_per_channel"
    INT8_STATIC_PER_TENSOR = "onnxruntime_int8_static_per_tensor"
    # torchao weight quantization of LLMs; the low-bit linears become MatMulNBits (see ``recipes_torchao``)
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL = "onnxruntime_torchao_8da4w_per_channel"
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR = "onnxruntime_torchao_8da4w"
    TORCHAO_INT8_WEIGHT_ONLY = "onnxruntime_torchao_int8_weight_only"
    TORCHAO_INT4_WEIGHT_ONLY = "onnxruntime_torchao_int4_weight_only"

    @classmethod
    def get_backend_name(cls) -> str:
        return BACKEND_NAME


_INT8 = {
    OrtRecipeType.INT8_STATIC_PER_CHANNEL: (True, False),
    OrtRecipeType.INT8_STATIC_PER_TENSOR: (False, False),
}


def _partitioner(recipe_type: RecipeType, options: dict[str, Any]) -> Any:
    from edgetorch.backends.onnxruntime import OrtPartitioner

    accepted = set(inspect.signature(OrtPartitioner).parameters) - {"self"}
    unknown = set(options) - accepted
    if unknown:
        raise RecipeError(f"{recipe_type.name}: unknown option(s) {sorted(unknown)}; OrtPartitioner accepts "
                          f"{sorted(accepted)}" + ("" if recipe_type == OrtRecipeType.FP32 else
                                                    " and INT8 recipes activation_observer=, bias_correction=, "
                                                    + "=, ".join(QUANT_EXCLUSION_OPTIONS) + "="))
    try:
        return OrtPartitioner(**options)
    except (TypeError, ValueError) as e:
        raise RecipeError(f"{recipe_type.name}: {e}") from None


class OrtRecipeProvider(BackendRecipeProvider):
    """Builds the ``OrtRecipeType`` recipes (see the module docstring for the arguments)."""

    @property
    def backend_name(self) -> str:
        return BACKEND_NAME

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        return list(OrtRecipeType)

    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe | None:
        if recipe_type not in OrtRecipeType.__members__.values():
            return None
        quant = None
        if recipe_type.name in TORCHAO_RECIPES:
            quant = torchao_quantization_recipe(recipe_type.name, **pop_torchao_options(kwargs))
        elif recipe_type != OrtRecipeType.FP32:
            per_channel, dynamic = _INT8[recipe_type]
            quant_options = {k: kwargs.pop(k) for k in ("activation_observer", "bias_correction",
                                                                  *QUANT_EXCLUSION_OPTIONS)
                             if k in kwargs}
            quant = int8_quantization_recipe(per_channel, dynamic, **quant_options)
        lowering = LoweringRecipe(partitioners=[_partitioner(recipe_type, kwargs)])
        return ExportRecipe(name=recipe_type.value, backend=BACKEND_NAME, quantization_recipe=quant,
                            lowering_recipe=lowering)


register_backend_recipe_provider(OrtRecipeProvider())
