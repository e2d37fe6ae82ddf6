"""Shared helpers for the model zoo: deterministic seeding and BatchNorm randomisation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with the global (CPU) RNG seeded to ``seed``.

    The caller's RNG state is saved and restored afterwards, so building a model
    neither depends on nor perturbs the global random state.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def make_generator(seed: int) -> torch.Generator:
    """Return a CPU ``torch.Generator`` seeded with ``seed``."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


@torch.no_grad()
def randomize_batchnorm(model: nn.Module, seed: int) -> None:
    """Give every BatchNorm layer non-trivial running stats and affine params.

    Values stay close to the identity transform (so activations keep a sane
    scale through deep nets) but differ enough that folding / ignoring BN in a
    backend produces visibly wrong results.
    """
    gen = make_generator(seed)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            n = module.num_features
            if module.running_mean is not None:
                module.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
            if module.running_var is not None:
                module.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
            if module.weight is not None:
                module.weight.copy_(torch.rand(n, generator=gen) + 0.5)
            if module.bias is not None:
                module.bias.copy_(torch.randn(n, generator=gen) * 0.1)


@torch.no_grad()
def init_conv_fan_in(model: nn.Module) -> None:
    """Kaiming-normal (fan_in, ReLU gain) init for all convs, zero conv biases.

    Fan-in scaling (rather than torchvision's fan_out) keeps activation
    magnitudes roughly constant through depthwise convolutions, so randomly
    initialised deep nets produce O(1) outputs instead of vanishing ones.
    """
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
