"""ResNet-18 written from scratch (same structure and parameter names as torchvision's)."""

from __future__ import annotations

import torch
from torch import nn

from ._common import init_conv_fan_in, make_generator, randomize_batchnorm, seeded

__all__ = ["RESNET18_SEED", "RESNET18_BN_SEED", "RESNET18_INPUT_SEED", "conv3x3", "conv1x1", "BasicBlock", "ResNet",
           "build_resnet18", "resnet18_example_inputs"]

RESNET18_SEED = 1201
RESNET18_BN_SEED = 1202
RESNET18_INPUT_SEED = 2201


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding and no bias."""
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution with no bias."""
    return nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (optionally downsampled)."""

    expansion = 1

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out = out + identity
        return self.relu(out)


class ResNet(nn.Module):
    """ResNet built from :class:`BasicBlock` stages."""

    def __init__(
        self, layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 1000
    ) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * BasicBlock.expansion, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * BasicBlock.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * BasicBlock.expansion, stride),
                nn.BatchNorm2d(planes * BasicBlock.expansion),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * BasicBlock.expansion
        for _ in range(1, blocks):
            layers.append(BasicBlock(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        return self.fc(torch.flatten(x, 1))


def build_resnet18() -> ResNet:
    """Build the seeded ResNet-18 (randomised BN stats) in eval mode."""
    with seeded(RESNET18_SEED):
        model = ResNet((2, 2, 2, 2), num_classes=1000)
        init_conv_fan_in(model)
    randomize_batchnorm(model, RESNET18_BN_SEED)
    return model.eval()


def resnet18_example_inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded example input of shape (1, 3, 224, 224)."""
    x = torch.randn(1, 3, 224, 224, generator=make_generator(RESNET18_INPUT_SEED))
    return {"forward": (x,)}
