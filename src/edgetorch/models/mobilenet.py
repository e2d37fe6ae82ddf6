"""MobileNetV2 written from scratch (torchvision's width-1.0 structure, ReLU6, depthwise convs)."""

from __future__ import annotations

import torch
from torch import nn

from ._common import init_conv_fan_in, make_generator, randomize_batchnorm, seeded

__all__ = ["MOBILENET_V2_SEED", "MOBILENET_V2_BN_SEED", "MOBILENET_V2_INPUT_SEED", "INVERTED_RESIDUAL_SETTING",
           "ConvBNReLU6", "InvertedResidual", "MobileNetV2", "build_mobilenet_v2", "mobilenet_v2_example_inputs"]

MOBILENET_V2_SEED = 1301
MOBILENET_V2_BN_SEED = 1302
MOBILENET_V2_INPUT_SEED = 2301

# (expand_ratio t, output channels c, repeats n, first stride s), as in the paper.
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """Round ``v`` to the nearest multiple of ``divisor`` without dropping >10%."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU6(nn.Sequential):
    """Conv2d (no bias) -> BatchNorm2d -> ReLU6."""

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel_size: int = 3,
        stride: int = 1,
        groups: int = 1,
    ) -> None:
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(
                in_ch, out_ch, kernel_size, stride, padding, groups=groups, bias=False
            ),
            nn.BatchNorm2d(out_ch),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise (3x3) -> linear project (1x1), residual if shapes match."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden_dim = inp * expand_ratio
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(inp, hidden_dim, kernel_size=1))
        layers.extend(
            [
                ConvBNReLU6(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
                nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
                nn.BatchNorm2d(oup),
            ]
        )
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 classifier (``features`` + ``classifier`` like torchvision)."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0) -> None:
        super().__init__()
        input_channel = _make_divisible(32 * width_mult)
        last_channel = _make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            output_channel = _make_divisible(c * width_mult)
            for i in range(n):
                stride = s if i == 0 else 1
                features.append(
                    InvertedResidual(input_channel, output_channel, stride, t)
                )
                input_channel = output_channel
        features.append(ConvBNReLU6(input_channel, last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.2), nn.Linear(last_channel, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


def build_mobilenet_v2() -> MobileNetV2:
    """Build the seeded MobileNetV2 (randomised BN stats) in eval mode."""
    with seeded(MOBILENET_V2_SEED):
        model = MobileNetV2()
        init_conv_fan_in(model)
    randomize_batchnorm(model, MOBILENET_V2_BN_SEED)
    return model.eval()


def mobilenet_v2_example_inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded example input of shape (1, 3, 224, 224)."""
    x = torch.randn(1, 3, 224, 224, generator=make_generator(MOBILENET_V2_INPUT_SEED))
    return {"forward": (x,)}
