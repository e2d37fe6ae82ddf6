"""Shared by the quantization tests: a tiny conv net with its samples, and every node's value in an fx run."""

from __future__ import annotations

import torch
from torch import nn
from torch.fx.interpreter import Interpreter


class TinyConvNet(nn.Module):
    """conv -> relu -> conv -> relu -> linear on 3x8x8 inputs (fixed-seed weights)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        y = torch.relu(self.conv2(y))
        return self.head(y.flatten(1))


def conv_samples(n: int = 4) -> list[tuple]:
    """``n`` fixed-seed inputs of :class:`TinyConvNet`."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(n)]


def node_values(gm: torch.fx.GraphModule, *args: torch.Tensor) -> dict[str, object]:
    """Every node's output when ``gm`` runs on ``args`` (an fx Interpreter, no hooks in the graph), by name."""
    values: dict[str, object] = {}

    class _Record(Interpreter):
        def run_node(self, n):  # noqa: ANN001, ANN202
            values[n.name] = out = super().run_node(n)
            return out

    with torch.no_grad():
        _Record(gm).run(*args)
    return values
