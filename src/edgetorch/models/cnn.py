"""Small CNN: Conv2d, BatchNorm2d (random stats), ReLU, MaxPool2d, AdaptiveAvgPool2d, Linear."""

from __future__ import annotations

import torch
from torch import nn

from ._common import make_generator, randomize_batchnorm, seeded

__all__ = ["SMALL_CNN_SEED", "SMALL_CNN_BN_SEED", "SMALL_CNN_INPUT_SEED", "SmallCNN", "build_small_cnn",
           "small_cnn_example_inputs"]

SMALL_CNN_SEED = 1101
SMALL_CNN_BN_SEED = 1102
SMALL_CNN_INPUT_SEED = 2101


class SmallCNN(nn.Module):
    """Two conv blocks + global pooling + linear head for 3x32x32 inputs."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.conv3 = nn.Conv2d(32, 64, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn1(self.conv1(x))))  # 16x16x16
        x = self.pool(self.relu(self.bn2(self.conv2(x))))  # 32x8x8
        x = self.relu(self.bn3(self.conv3(x)))  # 64x4x4
        x = self.avgpool(x)
        return self.fc(torch.flatten(x, 1))


def build_small_cnn() -> SmallCNN:
    """Build the seeded SmallCNN (with randomised BN stats) in eval mode."""
    with seeded(SMALL_CNN_SEED):
        model = SmallCNN()
    randomize_batchnorm(model, SMALL_CNN_BN_SEED)
    return model.eval()


def small_cnn_example_inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded example input of shape (1, 3, 32, 32)."""
    x = torch.randn(1, 3, 32, 32, generator=make_generator(SMALL_CNN_INPUT_SEED))
    return {"forward": (x,)}
