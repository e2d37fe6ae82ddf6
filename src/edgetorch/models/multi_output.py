"""Model with several outputs of different dtypes exercising integer / bool ops.

Uses argmax, comparisons (gt / eq), logical ops, ``masked_fill``, ``torch.where``,
dtype casts and an int64 ``cumsum``. Returns a tuple of
``(scores: float32, pred: int64, keep: bool, running_count: int64)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import make_generator, seeded

__all__ = ["MULTI_OUTPUT_SEED", "MULTI_OUTPUT_INPUT_SEED", "MultiOutput", "build_multi_output",
           "multi_output_example_inputs"]

MULTI_OUTPUT_SEED = 1601
MULTI_OUTPUT_INPUT_SEED = 2601


class MultiOutput(nn.Module):
    """Classify each of ``seq`` feature vectors and emit masks / counts alongside scores."""

    def __init__(
        self, in_features: int = 32, num_classes: int = 10, threshold: float = 1.0
    ) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, num_classes)
        self.threshold = threshold

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.proj(x)  # (b, seq, classes) float
        pred = logits.argmax(dim=-1)  # (b, seq) int64
        confident = logits.amax(dim=-1) > self.threshold  # bool (gt)
        correct = pred == labels  # bool (eq)
        keep = torch.logical_or(confident, correct)  # bool
        probs = torch.softmax(logits, dim=-1)
        masked = probs.masked_fill(~keep.unsqueeze(-1), 0.0)
        running_count = keep.to(torch.int64).cumsum(dim=-1)  # int64 cumsum
        bonus = torch.where(
            correct.unsqueeze(-1),
            running_count.to(logits.dtype).unsqueeze(-1),  # int -> float cast
            torch.zeros_like(masked),
        )
        scores = masked + 0.1 * bonus
        return scores, pred, keep, running_count


def build_multi_output() -> MultiOutput:
    """Build the seeded multi-output model in eval mode."""
    with seeded(MULTI_OUTPUT_SEED):
        model = MultiOutput()
    return model.eval()


def multi_output_example_inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded float features (1, 8, 32) and int64 labels (1, 8) in [0, 10)."""
    gen = make_generator(MULTI_OUTPUT_INPUT_SEED)
    x = torch.randn(1, 8, 32, generator=gen)
    labels = torch.randint(0, 10, (1, 8), dtype=torch.int64, generator=gen)
    return {"forward": (x, labels)}
