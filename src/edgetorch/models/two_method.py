"""Autoencoder-style module with two exported methods: ``forward`` and ``encode``.

``forward(x) == decode(encode(x))``; ``encode`` returns the hidden representation.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import make_generator, seeded

__all__ = ["TWO_METHOD_SEED", "TWO_METHOD_INPUT_SEED", "TwoMethod", "build_two_method", "two_method_example_inputs"]

TWO_METHOD_SEED = 1701
TWO_METHOD_INPUT_SEED = 2701


class TwoMethod(nn.Module):
    """Small MLP autoencoder: 32 -> 64 -> 16 (latent) -> 64 -> 32."""

    def __init__(
        self, in_features: int = 32, hidden: int = 64, latent: int = 16
    ) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(in_features, hidden), nn.GELU(), nn.Linear(hidden, latent)
        )
        self.decoder = nn.Sequential(
            nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, in_features)
        )

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Map inputs (b, 32) to latents (b, 16), passed through tanh."""
        return torch.tanh(self.encoder(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Map latents (b, 16) back to (b, 32)."""
        return self.decoder(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))


def build_two_method() -> TwoMethod:
    """Build the seeded two-method model in eval mode."""
    with seeded(TWO_METHOD_SEED):
        model = TwoMethod()
    return model.eval()


def two_method_example_inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded (1, 32) input for both ``forward`` and ``encode``."""
    x = torch.randn(1, 32, generator=make_generator(TWO_METHOD_INPUT_SEED))
    return {"forward": (x,), "encode": (x.clone(),)}
