"""Model zoo: small repo-defined models with fixed-seed random weights (no downloads).

Every model is built in eval mode with deterministic weights, has static-shape
batch-1 example inputs, and is exportable with ``torch.export.export`` followed
by ``run_decompositions()``.

Example::

    from edgetorch.models import get_model, list_models
    model, inputs = get_model("mlp")
    ep = torch.export.export(model, inputs)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cnn import SmallCNN, build_small_cnn, small_cnn_example_inputs
from .llama import (
    LLAMA_1B,
    LLAMA_100M,
    LLAMA_TINY,
    Llama,
    LlamaConfig,
    build_llama,
    build_llama_1b,
    build_llama_100m,
    build_llama_tiny,
    export_llama,
    llama_dynamic_shapes,
    llama_example_inputs,
    llama_method_inputs,
)
from .mlp import MLP, build_mlp, mlp_example_inputs
from .mobilenet import MobileNetV2, build_mobilenet_v2, mobilenet_v2_example_inputs
from .multi_output import MultiOutput, build_multi_output, multi_output_example_inputs
from .resnet import ResNet, build_resnet18, resnet18_example_inputs
from .transformer import (
    TransformerEncoder,
    build_transformer_encoder,
    transformer_encoder_example_inputs,
)
from .two_method import TwoMethod, build_two_method, two_method_example_inputs
from .vit import (
    VisionTransformer,
    build_vit_b_16,
    build_vit_tiny,
    vit_b_16_example_inputs,
    vit_tiny_example_inputs,
)

__all__ = [
    "LLAMA_100M",
    "LLAMA_1B",
    "LLAMA_TINY",
    "Llama",
    "LlamaConfig",
    "MLP",
    "MobileNetV2",
    "ModelSpec",
    "MultiOutput",
    "ResNet",
    "SmallCNN",
    "TransformerEncoder",
    "TwoMethod",
    "VisionTransformer",
    "build_llama",
    "export_llama",
    "get_model",
    "get_spec",
    "list_models",
    "llama_dynamic_shapes",
    "llama_method_inputs",
    "method_module",
]


@dataclass(frozen=True)
class ModelSpec:
    """Description of one zoo model.

    ``build`` returns a fresh eval-mode model with fixed-seed weights;
    ``example_inputs`` maps method name -> positional example inputs (seeded).
    ``slow`` marks big models (tests skip their export unless slow tests run).
    """

    name: str
    build: Callable[[], torch.nn.Module]
    example_inputs: Callable[[], dict[str, tuple]]
    description: str
    slow: bool = False


_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec(
        "mlp",
        build_mlp,
        mlp_example_inputs,
        "3-layer MLP 64->256->256->10 with ReLU; input (1, 64) float32",
    ),
    ModelSpec(
        "mlp_fp16",
        functools.partial(build_mlp, torch.float16),
        functools.partial(mlp_example_inputs, torch.float16),
        "the mlp model converted to float16; input (1, 64) float16",
    ),
    ModelSpec(
        "mlp_bf16",
        functools.partial(build_mlp, torch.bfloat16),
        functools.partial(mlp_example_inputs, torch.bfloat16),
        "the mlp model converted to bfloat16; input (1, 64) bfloat16",
    ),
    ModelSpec(
        "small_cnn",
        build_small_cnn,
        small_cnn_example_inputs,
        "small CNN (Conv2d, BatchNorm2d with random stats, ReLU, MaxPool2d, "
        "AdaptiveAvgPool2d, Linear); input (1, 3, 32, 32)",
    ),
    ModelSpec(
        "resnet18",
        build_resnet18,
        resnet18_example_inputs,
        "ResNet-18 (torchvision structure, 1000 classes, random BN stats); "
        "input (1, 3, 224, 224)",
        slow=True,
    ),
    ModelSpec(
        "mobilenet_v2",
        build_mobilenet_v2,
        mobilenet_v2_example_inputs,
        "MobileNetV2 width 1.0 (inverted residuals, depthwise conv, ReLU6, random BN "
        "stats); input (1, 3, 224, 224)",
        slow=True,
    ),
    ModelSpec(
        "transformer_encoder",
        build_transformer_encoder,
        transformer_encoder_example_inputs,
        "2-layer pre-LN transformer encoder, d_model 128, 4 heads, q/k/v Linear + SDPA, "
        "vocab 1000 logits; input (1, 32) int64 token ids",
    ),
    ModelSpec(
        "vit_b_16",
        build_vit_b_16,
        vit_b_16_example_inputs,
        "ViT-B/16 (torchvision architecture, ~86.57M params, qkv Linear + SDPA); "
        "input (1, 3, 224, 224)",
        slow=True,
    ),
    ModelSpec(
        "vit_tiny",
        build_vit_tiny,
        vit_tiny_example_inputs,
        "tiny ViT (32x32 images, patch 8, 2 layers, hidden 64, 4 heads, 10 classes); "
        "input (1, 3, 32, 32)",
    ),
    ModelSpec(
        "multi_output",
        build_multi_output,
        multi_output_example_inputs,
        "returns (float32 scores, int64 argmax, bool mask, int64 cumsum) using "
        "gt/eq/logical_or/masked_fill/where/casts; inputs (1, 8, 32) float32, "
        "(1, 8) int64",
    ),
    ModelSpec(
        "two_method",
        build_two_method,
        two_method_example_inputs,
        "autoencoder with methods forward(x) = decode(encode(x)) and encode(x); "
        "input (1, 32)",
    ),
    ModelSpec(
        "llama_tiny",
        build_llama_tiny,
        functools.partial(llama_example_inputs, LLAMA_TINY),
        "Llama-style decoder (RMSNorm, RoPE, GQA 4/2 heads, SwiGLU) dim 64, 2 layers, vocab 256, "
        "static KV cache buffers (max_seq_len 64); inputs (1, 8) int64 tokens, (8,) int64 positions",
    ),
    ModelSpec(
        "llama_100m",
        build_llama_100m,
        functools.partial(llama_example_inputs, LLAMA_100M),
        "Llama-style decoder ~124.7M params: dim 768, 12 layers, 12/4 heads, hidden 2048, vocab 32000, "
        "KV cache 256; inputs (1, 8) int64 tokens, (8,) int64 positions",
        slow=True,
    ),
    ModelSpec(
        "llama_1b",
        build_llama_1b,
        functools.partial(llama_example_inputs, LLAMA_1B),
        "Llama-style decoder ~1.10B params: dim 2048, 16 layers, 32/8 heads, hidden 8192, vocab 32000, "
        "KV cache 256; inputs (1, 8) int64 tokens, (8,) int64 positions",
        slow=True,
    ),
)

_REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def list_models() -> list[str]:
    """Names of all registered models, in registration order."""
    return list(_REGISTRY)


def get_spec(name: str) -> ModelSpec:
    """Return the :class:`ModelSpec` for ``name``; ``KeyError`` if unknown."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown model {name!r}; available: {', '.join(list_models())}"
        ) from None


def get_model(name: str) -> tuple[torch.nn.Module, tuple]:
    """Build model ``name`` and return it with its ``forward`` example inputs."""
    spec = get_spec(name)
    return spec.build(), spec.example_inputs()["forward"]


class _MethodModule(torch.nn.Module):
    """Wrapper whose ``forward`` dispatches to ``model.<method>``."""

    def __init__(self, model: torch.nn.Module, method: str) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, *args: object) -> object:
        return getattr(self.model, self.method)(*args)


def method_module(model: torch.nn.Module, method: str) -> torch.nn.Module:
    """Return a module whose ``forward`` calls ``model.<method>``.

    For ``method == "forward"`` the model itself is returned. The wrapper holds
    ``model`` as a submodule (state-dict keys gain a ``model.`` prefix) and
    shares its training/eval mode.
    """
    if method == "forward":
        return model
    if not hasattr(model, method):
        raise AttributeError(f"{type(model).__name__} has no method {method!r}")
    wrapper = _MethodModule(model, method)
    wrapper.train(model.training)
    return wrapper
