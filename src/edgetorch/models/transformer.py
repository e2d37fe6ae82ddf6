"""Small pre-LN transformer encoder over int64 token ids (explicit q/k/v + SDPA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import make_generator, seeded

__all__ = ["TRANSFORMER_SEED", "TRANSFORMER_INPUT_SEED", "SelfAttention", "EncoderLayer", "TransformerEncoder",
           "build_transformer_encoder", "transformer_encoder_example_inputs"]

TRANSFORMER_SEED = 1401
TRANSFORMER_INPUT_SEED = 2401


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate q/k/v projections and SDPA."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} not divisible by num_heads={num_heads}"
            )
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v)  # (b, heads, n, head_dim)
        out = out.transpose(1, 2).reshape(b, n, d)
        return self.out_proj(out)


class EncoderLayer(nn.Module):
    """Pre-LN block: x + attn(ln1(x)); x + mlp(ln2(x)) with a GELU MLP."""

    def __init__(self, d_model: int, num_heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, num_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp_dim, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TransformerEncoder(nn.Module):
    """Token + learned positional embedding, N encoder layers, final LN, vocab logits."""

    def __init__(
        self,
        vocab_size: int = 1000,
        max_seq_len: int = 32,
        d_model: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        mlp_dim: int = 512,
    ) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.pos_embedding = nn.Parameter(torch.randn(1, max_seq_len, d_model) * 0.02)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, mlp_dim) for _ in range(num_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq_len = tokens.shape[1]
        x = self.token_embedding(tokens) + self.pos_embedding[:, :seq_len]
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_f(x))


def build_transformer_encoder() -> TransformerEncoder:
    """Build the seeded transformer encoder in eval mode."""
    with seeded(TRANSFORMER_SEED):
        model = TransformerEncoder()
    return model.eval()


def transformer_encoder_example_inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    """Seeded int64 token ids of shape (1, 32) in [0, 1000)."""
    tokens = torch.randint(
        0,
        1000,
        (1, 32),
        dtype=torch.int64,
        generator=make_generator(TRANSFORMER_INPUT_SEED),
    )
    return {"forward": (tokens,)}
