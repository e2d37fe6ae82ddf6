"""Vision Transformer (torchvision vit_b_16 architecture) with fused qkv Linear + SDPA."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._common import make_generator, seeded

__all__ = ["VIT_B_16_SEED", "VIT_TINY_SEED", "VIT_B_16_INPUT_SEED", "VIT_TINY_INPUT_SEED", "MLPBlock", "Attention",
           "EncoderBlock", "Encoder", "VisionTransformer", "build_vit_b_16", "vit_b_16_example_inputs",
           "build_vit_tiny", "vit_tiny_example_inputs"]

VIT_B_16_SEED = 1501
VIT_TINY_SEED = 1511
VIT_B_16_INPUT_SEED = 2501
VIT_TINY_INPUT_SEED = 2511


class MLPBlock(nn.Sequential):
    """Linear -> GELU -> Dropout -> Linear -> Dropout (torchvision layout)."""

    def __init__(self, in_dim: int, mlp_dim: int, dropout: float = 0.0) -> None:
        super().__init__(
            nn.Linear(in_dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, in_dim),
            nn.Dropout(dropout),
        )


class Attention(nn.Module):
    """Multi-head self-attention: one qkv Linear (D -> 3D), SDPA, output Linear."""

    def __init__(self, hidden_dim: int, num_heads: int) -> None:
        super().__init__()
        if hidden_dim % num_heads != 0:
            raise ValueError(
                f"hidden_dim={hidden_dim} not divisible by num_heads={num_heads}"
            )
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.qkv = nn.Linear(hidden_dim, 3 * hidden_dim)
        self.out_proj = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (b, heads, n, head_dim)
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.transpose(1, 2).reshape(b, n, d)
        return self.out_proj(out)


class EncoderBlock(nn.Module):
    """Pre-LN transformer block (torchvision's ``EncoderBlock``)."""

    def __init__(
        self, num_heads: int, hidden_dim: int, mlp_dim: int, eps: float
    ) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_dim, eps=eps)
        self.self_attention = Attention(hidden_dim, num_heads)
        self.ln_2 = nn.LayerNorm(hidden_dim, eps=eps)
        self.mlp = MLPBlock(hidden_dim, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """Positional embedding + stack of encoder blocks + final LayerNorm."""

    def __init__(
        self,
        seq_length: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        eps: float,
    ) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(
            torch.empty(1, seq_length, hidden_dim).normal_(std=0.02)
        )
        self.layers = nn.Sequential(
            *(
                EncoderBlock(num_heads, hidden_dim, mlp_dim, eps)
                for _ in range(num_layers)
            )
        )
        self.ln = nn.LayerNorm(hidden_dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.layers(x + self.pos_embedding))


class VisionTransformer(nn.Module):
    """Configurable ViT; defaults give torchvision's vit_b_16 (~86.57M params)."""

    def __init__(
        self,
        image_size: int = 224,
        patch_size: int = 16,
        num_layers: int = 12,
        num_heads: int = 12,
        hidden_dim: int = 768,
        mlp_dim: int = 3072,
        num_classes: int = 1000,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if image_size % patch_size != 0:
            raise ValueError("image_size must be divisible by patch_size")
        self.image_size = image_size
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.conv_proj = nn.Conv2d(
            3, hidden_dim, kernel_size=patch_size, stride=patch_size
        )
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        seq_length = (image_size // patch_size) ** 2 + 1
        self.encoder = Encoder(
            seq_length, num_layers, num_heads, hidden_dim, mlp_dim, eps
        )
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(hidden_dim, num_classes))
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        fan_in = self.conv_proj.in_channels * self.patch_size**2
        nn.init.trunc_normal_(self.conv_proj.weight, std=math.sqrt(1 / fan_in))
        nn.init.zeros_(self.conv_proj.bias)
        # torchvision zero-inits class token and head; use small random values
        # instead so that outputs are non-trivial for testing.
        nn.init.normal_(self.class_token, std=0.02)
        for module in self.encoder.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.normal_(module.bias, std=1e-6)
        nn.init.normal_(self.heads.head.weight, std=0.02)
        nn.init.normal_(self.heads.head.bias, std=0.02)

    def _process_input(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = self.conv_proj(x)  # (n, hidden, h/p, w/p)
        x = x.reshape(n, self.hidden_dim, -1)
        return x.permute(0, 2, 1)  # (n, seq, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._process_input(x)
        cls = self.class_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1)
        x = self.encoder(x)
        return self.heads(x[:, 0])


def build_vit_b_16() -> VisionTransformer:
    """Build the seeded ViT-B/16 (224x224, 12 layers, hidden 768) in eval mode."""
    with seeded(VIT_B_16_SEED):
        model = VisionTransformer()
    return model.eval()


def vit_b_16_example_inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded example input of shape (1, 3, 224, 224)."""
    x = torch.randn(1, 3, 224, 224, generator=make_generator(VIT_B_16_INPUT_SEED))
    return {"forward": (x,)}


def build_vit_tiny() -> VisionTransformer:
    """Build a tiny seeded ViT (32x32 images, patch 8, 2 layers, hidden 64) in eval mode."""
    with seeded(VIT_TINY_SEED):
        model = VisionTransformer(
            image_size=32,
            patch_size=8,
            num_layers=2,
            num_heads=4,
            hidden_dim=64,
            mlp_dim=128,
            num_classes=10,
        )
    return model.eval()


def vit_tiny_example_inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded example input of shape (1, 3, 32, 32)."""
    x = torch.randn(1, 3, 32, 32, generator=make_generator(VIT_TINY_INPUT_SEED))
    return {"forward": (x,)}
