"""Three-layer MLP (64 -> 256 -> 256 -> 10 with ReLU), plus fp16 / bf16 variants."""

from __future__ import annotations

import torch
from torch import nn

from ._common import make_generator, seeded

__all__ = ["MLP_SEED", "MLP_INPUT_SEED", "MLP", "build_mlp", "mlp_example_inputs"]

MLP_SEED = 1001
MLP_INPUT_SEED = 2001


class MLP(nn.Module):
    """Plain multi-layer perceptron: Linear-ReLU-Linear-ReLU-Linear."""

    def __init__(
        self, in_features: int = 64, hidden: int = 256, num_classes: int = 10
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def build_mlp(dtype: torch.dtype = torch.float32) -> MLP:
    """Build the seeded MLP in eval mode, converted to ``dtype``."""
    with seeded(MLP_SEED):
        model = MLP()
    return model.to(dtype).eval()


def mlp_example_inputs(
    dtype: torch.dtype = torch.float32,
) -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded example input of shape (1, 64) in ``dtype``."""
    x = torch.randn(1, 64, generator=make_generator(MLP_INPUT_SEED))
    return {"forward": (x.to(dtype),)}
