"""Recipes for the portable backend (every op runs on edgetorch's own kernels): FP32, PT2E INT8 and torchao's
low-bit LLM weight quantization (``TORCHAO_*``, see ``recipes_torchao``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from edgetorch.errors import RecipeError
from edgetorch.export.recipe import (
    BackendRecipeProvider,
    ExportRecipe,
    QuantizationRecipe,
    RecipeType,
    register_backend_recipe_provider,
)
from edgetorch.export.recipes_torchao import TORCHAO_OPTIONS, TORCHAO_RECIPES, torchao_quantization_recipe

__all__ = ["PortableRecipeProvider", "PortableRecipeType", "int8_quantization_recipe"]

log = logging.getLogger(__name__)

BACKEND_NAME = "portable"


class PortableRecipeType(RecipeType):
    """Recipes run on the portable backend: float, or PT2E INT8 with Q/DQ ops around float kernels."""

    FP32 = "portable_fp32"
    INT8_STATIC_PER_CHANNEL = "portable_int8_static_per_channel"
    INT8_STATIC_PER_TENSOR = "portable_int8_static_per_tensor"
    INT8_DYNAMIC_PER_CHANNEL = "portable_int8_dynamic_per_channel"
    # torchao weight quantization of LLMs, run on edgetorch's low-bit kernels (see ``recipes_torchao``)
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL = "portable_torchao_8da4w_per_channel"
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR = "portable_torchao_8da4w"
    TORCHAO_INT8_WEIGHT_ONLY = "portable_torchao_int8_weight_only"
    TORCHAO_INT4_WEIGHT_ONLY = "portable_torchao_int4_weight_only"

    @classmethod
    def get_backend_name(cls) -> str:
        return BACKEND_NAME


_INT8 = {
    PortableRecipeType.INT8_STATIC_PER_CHANNEL: (True, False),
    PortableRecipeType.INT8_STATIC_PER_TENSOR: (False, False),
    PortableRecipeType.INT8_DYNAMIC_PER_CHANNEL: (True, True),
}


#: the recipe options of the INT8 recipes that keep ops in float; ``quant_exclude_*`` is the spelling every
#: backend's INT8 recipe accepts (ORT's own ``exclude_*`` exclude ops from delegation), the portable recipes also
#: take the bare ``exclude_*`` (it can mean nothing else there)
QUANT_EXCLUSION_OPTIONS = ("quant_exclude_module_paths", "quant_exclude_nodes", "quant_exclude_ops",
                           "quant_exclude_activations")
_PORTABLE_ALIASES = {"exclude_module_paths": "quant_exclude_module_paths", "exclude_nodes": "quant_exclude_nodes",
                     "exclude_ops": "quant_exclude_ops", "exclude_activations": "quant_exclude_activations"}


class PortableRecipeProvider(BackendRecipeProvider):
    """``create_recipe(INT8_*, activation_observer="minmax"|"histogram", bias_correction=True|False,
    quant_exclude_module_paths=(...),
    quant_exclude_nodes=(...), quant_exclude_ops=(...), quant_exclude_activations=(...))`` (or
    ``exclude_module_paths=`` etc.: the ops and values kept in float, see ``SymmetricQuantizationConfig``); FP32
    takes no arguments."""

    @property
    def backend_name(self) -> str:
        return BACKEND_NAME

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        return list(PortableRecipeType)

    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe | None:
        if recipe_type not in PortableRecipeType.__members__.values():
            return None
        if recipe_type == PortableRecipeType.FP32:
            if kwargs:
                raise RecipeError(f"PortableRecipeType.FP32 takes no arguments, got {sorted(kwargs)}")
            return ExportRecipe(name=recipe_type.value, backend=BACKEND_NAME)
        if recipe_type.name in TORCHAO_RECIPES:
            unknown = set(kwargs) - set(TORCHAO_OPTIONS)
            if unknown:
                raise RecipeError(f"{recipe_type.name} accepts only {'=, '.join(TORCHAO_OPTIONS)}=, got "
                                  f"{sorted(unknown)}")
            return ExportRecipe(name=recipe_type.value, backend=BACKEND_NAME,
                                quantization_recipe=torchao_quantization_recipe(recipe_type.name, **kwargs))
        options = dict(kwargs)
        for alias, name in _PORTABLE_ALIASES.items():
            if alias in options:
                if name in options:
                    raise RecipeError(f"{recipe_type.name}: give {alias}= or {name}=, not both")
                options[name] = options.pop(alias)
        unknown = set(options) - {"activation_observer", "bias_correction", *QUANT_EXCLUSION_OPTIONS}
        if unknown:
            raise RecipeError(f"{recipe_type.name} accepts only activation_observer=, bias_correction= and "
                              f"{'=, '.join(QUANT_EXCLUSION_OPTIONS)}= (or exclude_*=), got {sorted(unknown)}")
        per_channel, dynamic = _INT8[recipe_type]
        return ExportRecipe(name=recipe_type.value, backend=BACKEND_NAME, quantization_recipe=int8_quantization_recipe(
            per_channel, dynamic, **options))


def int8_quantization_recipe(per_channel: bool, dynamic: bool, activation_observer: str = "minmax",
                             quant_exclude_module_paths: Any = (), quant_exclude_nodes: Any = (),
                             quant_exclude_ops: Any = (), quant_exclude_activations: Any = (),
                             bias_correction: bool = True) -> QuantizationRecipe:
    """The PT2E INT8 quantization of the INT8 recipes (``SymmetricInt8Quantizer``), with the ops kept in float;
    bad settings raise ``RecipeError`` naming the option."""
    from edgetorch.export.quantizer import SymmetricInt8Quantizer, SymmetricQuantizationConfig, _items

    excluded = {name: _items(value, name) for name, value in zip(
        QUANT_EXCLUSION_OPTIONS, (quant_exclude_module_paths, quant_exclude_nodes, quant_exclude_ops,
                                  quant_exclude_activations))}
    try:
        config = SymmetricQuantizationConfig(per_channel, dynamic, activation_observer,  # type: ignore[arg-type]
                                             *excluded.values(), bias_correction=bias_correction)
    except RecipeError as e:
        raise RecipeError(f"quant_{e}" if str(e).startswith("exclude_") else str(e)) from None
    except ValueError as e:
        raise RecipeError(str(e)) from None
    return QuantizationRecipe(quantizers=[SymmetricInt8Quantizer(config)])


register_backend_recipe_provider(PortableRecipeProvider())
