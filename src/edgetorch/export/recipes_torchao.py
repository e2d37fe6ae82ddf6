"""torchao weight quantization of LLMs as export recipes (applied in the SOURCE_TRANSFORM stage).

Spelled as the reference spells its XNNPACK recipes, on ``PortableRecipeType`` and ``OrtRecipeType``:

- ``TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL``: 8da4w, int4 weights with one scale per output channel
  (``PerAxis(0)``), int8 activations quantized per token at run time;
- ``TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR``: 8da4w with int4 weights in groups of ``group_size``
  (``PerGroup``, default 32; the reference's name for its grouped recipe);
- ``TORCHAO_INT8_WEIGHT_ONLY``: int8 weights per output channel, float activations;
- ``TORCHAO_INT4_WEIGHT_ONLY``: int4 weights in groups of ``group_size`` (default 32), float activations.

Options (every recipe): ``quantize_output=True`` (the LM head, a Linear named ``output`` or ``lm_head``, is
quantized with the rest; ``False`` keeps it float), ``embedding_bits=None|4|8`` (the token embedding's weights,
weight-only, per row or in groups of ``group_size`` for 4 bits), ``exclude_module_paths=(...)`` (substrings of
module paths kept float), ``int8_module_paths=(...)`` (substrings of module paths of Linears kept at 8 bits:
int8 weights per output channel, float activations, whatever the recipe; the mixed-precision fix of a generation,
``edgetorch.workflows.generation_fix``) and ``group_size=`` where the recipe groups weights. A module path both
excluded and kept at 8 bits stays float.

After ``quantize_`` the SOURCE_TRANSFORM stage swaps every quantized Linear for a module calling edgetorch's
low-bit op (``edgetorch.export.lowbit``): the weights travel packed in the program and run on low-bit kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from edgetorch.errors import RecipeError
from edgetorch.export.recipe import AOQuantizationConfig, QuantizationRecipe

__all__ = ["OUTPUT_MODULE_NAMES", "TORCHAO_OPTIONS", "TORCHAO_RECIPES", "pop_torchao_options",
           "torchao_quantization_recipe"]

#: recipe-name suffix -> (weight bits, dynamic int8 activations, grouped weights)
TORCHAO_RECIPES: dict[str, tuple[int, bool, bool]] = {
    "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL": (4, True, False),
    "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR": (4, True, True),
    "TORCHAO_INT8_WEIGHT_ONLY": (8, False, False),
    "TORCHAO_INT4_WEIGHT_ONLY": (4, False, True),
}
TORCHAO_OPTIONS = ("group_size", "quantize_output", "embedding_bits", "exclude_module_paths", "int8_module_paths")
#: the names of an LM's output projection (the zoo's llama: ``output``; Hugging Face: ``lm_head``)
OUTPUT_MODULE_NAMES = ("output", "lm_head")
_KERNEL_GROUPS = (32, 64, 128, 256)


def _is_output(fqn: str) -> bool:
    return fqn.rsplit(".", 1)[-1] in OUTPUT_MODULE_NAMES


def _linear_filter(quantize_output: bool, excluded: tuple[str, ...], group_size: int | None
                   ) -> Callable[[torch.nn.Module, str], bool]:
    def keep(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear) or any(p in fqn for p in excluded):
            return False
        if not quantize_output and _is_output(fqn):
            return False
        return group_size is None or module.in_features % group_size == 0
    return keep


def _embedding_filter(excluded: tuple[str, ...], group_size: int | None) -> Callable[[torch.nn.Module, str], bool]:
    def keep(module: torch.nn.Module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Embedding) and not any(p in fqn for p in excluded)
                and (group_size is None or module.embedding_dim % group_size == 0))
    return keep


def _paths(name: str, option: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    paths = tuple(value or ())
    if not all(isinstance(p, str) and p for p in paths):
        raise RecipeError(f"{name}: {option} must be non-empty strings, got {paths!r}")
    return paths


def _int8_filter(int8: tuple[str, ...], excluded: tuple[str, ...]) -> Callable[[torch.nn.Module, str], bool]:
    def keep(module: torch.nn.Module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and any(p in fqn for p in int8)
                and not any(p in fqn for p in excluded))
    return keep


def _check_options(name: str, grouped: bool, group_size: Any, embedding_bits: Any,
                   exclude_module_paths: Any) -> tuple[str, ...]:
    if grouped:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in _KERNEL_GROUPS:
            raise RecipeError(f"{name}: group_size must be one of {_KERNEL_GROUPS}, got {group_size!r}")
    elif group_size is not None:
        raise RecipeError(f"{name} quantizes per output channel and takes no group_size= (use the grouped "
                          "recipe TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR or TORCHAO_INT4_WEIGHT_ONLY)")
    if embedding_bits not in (None, 4, 8):
        raise RecipeError(f"{name}: embedding_bits must be None, 4 or 8, got {embedding_bits!r}")
    return _paths(name, "exclude_module_paths", exclude_module_paths)


def torchao_quantization_recipe(name: str, group_size: int | None = None, quantize_output: bool = True,
                                embedding_bits: int | None = None,
                                exclude_module_paths: Any = (), int8_module_paths: Any = ()) -> QuantizationRecipe:
    """The torchao configs of recipe ``name`` (a key of ``TORCHAO_RECIPES``); bad options raise RecipeError."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis, PerGroup

    if name not in TORCHAO_RECIPES:
        raise RecipeError(f"unknown torchao recipe {name!r}; known: {sorted(TORCHAO_RECIPES)}")
    bits, dynamic, grouped = TORCHAO_RECIPES[name]
    if grouped and group_size is None:
        group_size = 32
    excluded = _check_options(name, grouped, group_size, embedding_bits, exclude_module_paths)
    if not isinstance(quantize_output, bool):
        raise RecipeError(f"{name}: quantize_output must be a bool, got {quantize_output!r}")
    dtype = torch.int4 if bits == 4 else torch.int8
    granularity = PerGroup(group_size) if grouped else PerAxis(0)
    if dynamic:
        config: Any = Int8DynamicActivationIntxWeightConfig(weight_dtype=dtype, weight_granularity=granularity)
    else:
        config = IntxWeightOnlyConfig(weight_dtype=dtype, granularity=granularity)
    int8 = _paths(name, "int8_module_paths", int8_module_paths)
    configs = [AOQuantizationConfig(config, _linear_filter(quantize_output, excluded + int8,
                                                           group_size if grouped else None))]
    if int8:  # kept at 8 bits: int8 weights per output channel, float activations
        configs.append(AOQuantizationConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
                                            _int8_filter(int8, excluded)))
    if embedding_bits is not None:
        emb_group = (group_size or 32) if embedding_bits == 4 else None
        emb_config = IntxWeightOnlyConfig(weight_dtype=torch.int4 if embedding_bits == 4 else torch.int8,
                                          granularity=PerGroup(emb_group) if emb_group else PerAxis(0))
        configs.insert(0, AOQuantizationConfig(emb_config, _embedding_filter(excluded, emb_group)))
    return QuantizationRecipe(ao_quantization_configs=configs)


def pop_torchao_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Removes and returns the torchao recipe options found in ``kwargs``."""
    return {k: kwargs.pop(k) for k in TORCHAO_OPTIONS if k in kwargs}
