"""Llama-style decoder-only LM with a static KV cache held in registered buffers.

The architecture follows Llama 2/3: token embedding, pre-norm blocks with RMSNorm,
rotary position embeddings (RoPE, half-split "rotate_half" layout), grouped-query
attention (``n_kv_heads < n_heads``) through ``F.scaled_dot_product_attention``,
a SwiGLU MLP, a final RMSNorm and an untied output projection.

Every attention layer owns a static KV cache: non-persistent buffers ``k_cache``
and ``v_cache`` of shape ``(1, n_kv_heads, max_seq_len, head_dim)``, written in
place with ``index_copy_`` at ``input_pos``. The queries always attend over the
whole cache (``max_seq_len`` slots) with a boolean mask that hides the slots
after each query's own position, so no shape depends on the position: one
``forward(tokens, input_pos)`` serves both the prefill (``T`` prompt tokens at
positions ``0..T-1``) and the decode step (one token at position ``p``).

``torch.export`` turns the in-place cache writes into buffer mutations
(``ep.graph_signature.buffers_to_mutate``). :func:`export_llama` exports the same
module twice: ``prefill`` with a dynamic prompt length and ``decode`` with static
shapes, so both programs share buffer names.

Example::

    model = build_llama(LLAMA_TINY)
    programs = export_llama(model)       # {"prefill": ep, "decode": ep}
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._common import make_generator

__all__ = ["LLAMA_SEED", "LLAMA_INPUT_SEED", "EXAMPLE_PROMPT_LEN", "PREFILL_MIN_LEN", "LlamaConfig", "LLAMA_TINY",
           "LLAMA_100M", "LLAMA_1B", "LLAMA_CONFIGS", "RMSNorm", "rope_tables", "rotate_half", "apply_rope",
           "Attention", "FeedForward", "TransformerBlock", "Llama", "init_llama_weights", "build_llama",
           "build_llama_tiny", "build_llama_100m", "build_llama_1b", "example_prompt", "llama_example_inputs",
           "llama_method_inputs", "llama_dynamic_shapes", "export_llama", "param_count"]

LLAMA_SEED = 1801
LLAMA_INPUT_SEED = 2801
EXAMPLE_PROMPT_LEN = 8
# Smallest prompt length the exported prefill accepts. torch 2.13 accepts
# Dim(min=0|1|2, max=...) as long as the *example* prompt has >= 2 tokens (an
# example of length 1 specialises the dim to the constant 1 and export fails with
# "Constraints violated"). min=1 lets a one-token prompt use prefill too; the
# guard ``seq_len >= 1`` is checked by ``ep.module()``. (min=2, the tracer's own
# implicit assumption, emits no lower-bound guard at all.)
PREFILL_MIN_LEN = 1


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of :class:`Llama` (defaults: the ``llama_tiny`` test model)."""

    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden_dim: int = 128
    vocab_size: int = 256
    max_seq_len: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} not divisible by n_kv_heads={self.n_kv_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("head_dim must be even for RoPE")

    @property
    def head_dim(self) -> int:
        """Per-head width ``dim // n_heads``."""
        return self.dim // self.n_heads


LLAMA_TINY = LlamaConfig()
LLAMA_100M = LlamaConfig(
    dim=768, n_layers=12, n_heads=12, n_kv_heads=4, hidden_dim=2048, vocab_size=32000, max_seq_len=256
)
LLAMA_1B = LlamaConfig(
    dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, hidden_dim=8192, vocab_size=32000, max_seq_len=256
)
LLAMA_CONFIGS: dict[str, LlamaConfig] = {"llama_tiny": LLAMA_TINY, "llama_100m": LLAMA_100M, "llama_1b": LLAMA_1B}


class RMSNorm(nn.Module):
    """Root-mean-square layer norm: ``x / sqrt(mean(x^2) + eps) * weight`` (computed in float32)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(cos, sin)`` of shape ``(max_seq_len, head_dim)`` in the half-split layout.

    Frequency ``i`` (``0 <= i < head_dim/2``) is ``theta ** (-2i / head_dim)``; columns
    ``i`` and ``i + head_dim/2`` share it.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (b, heads, T, head_dim) by per-position ``cos``/``sin`` (T, head_dim)."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query attention over a static KV cache held in buffers."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        cache_shape = (1, cfg.n_kv_heads, cfg.max_seq_len, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache_shape), persistent=False)

    def _heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n_heads, self.head_dim).transpose(1, 2)

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(1, n_kv_heads, S, D) -> (1, n_heads, S, D); query head h reads kv head h // group."""
        group = self.n_heads // self.n_kv_heads
        if group == 1:
            return x
        b, h, s, d = x.shape
        return x[:, :, None].expand(b, h, group, s, d).reshape(b, h * group, s, d)

    def forward(
        self,
        x: torch.Tensor,
        input_pos: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self._heads(self.wq(x), self.n_heads), cos, sin)
        k = apply_rope(self._heads(self.wk(x), self.n_kv_heads), cos, sin)
        v = self._heads(self.wv(x), self.n_kv_heads)
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        keys = self._repeat_kv(self.k_cache)
        values = self._repeat_kv(self.v_cache)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); h + ffn(norm(h))``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.hidden_dim)

    def forward(
        self,
        x: torch.Tensor,
        input_pos: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), input_pos, cos, sin, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Llama-style decoder with a static per-layer KV cache.

    ``forward(tokens (1, T) int64, input_pos (T,) int64) -> logits (1, T, vocab)``.
    ``prefill`` and ``decode`` are aliases of ``forward`` (for per-method export).
    """

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        cos = self.rope_cos[input_pos]
        sin = self.rope_sin[input_pos]
        slots = torch.arange(self.config.max_seq_len, device=input_pos.device)
        mask = slots[None, :] <= input_pos[:, None]  # (T, max_seq_len): True = attend
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, input_pos, cos, sin, mask)
        return self.output(self.norm(h))

    def prefill(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Process a prompt ``tokens (1, T)`` at positions ``input_pos (T,)``; same as ``forward``."""
        return self(tokens, input_pos)

    def decode(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Process one token ``(1, 1)`` at position ``input_pos (1,)``; same as ``forward``."""
        return self(tokens, input_pos)

    @torch.no_grad()
    def reset_cache(self) -> None:
        """Zero every layer's ``k_cache`` and ``v_cache``."""
        for layer in self.layers:
            layer.attention.k_cache.zero_()
            layer.attention.v_cache.zero_()

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Recompute the RoPE tables and zero the caches (e.g. after ``to_empty``)."""
        cos, sin = rope_tables(self.config.head_dim, self.config.max_seq_len, self.config.rope_theta)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        self.reset_cache()


@torch.no_grad()
def init_llama_weights(model: Llama, seed: int) -> None:
    """Deterministic init in place: norms to 1, every other weight ``N(0, init_std)``.

    Parameters are filled in ``named_parameters`` order from one seeded generator,
    so the result depends only on ``seed`` and the config (not on the global RNG).
    """
    gen = make_generator(seed)
    std = model.config.init_std
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=gen)


def build_llama(cfg: LlamaConfig = LLAMA_TINY, seed: int = LLAMA_SEED) -> Llama:
    """Build an eval-mode :class:`Llama` with seeded random weights (fast: no default init).

    The module is constructed on the meta device, materialised with ``to_empty``
    and then filled by :func:`init_llama_weights`; buffers are recomputed.
    """
    with torch.device("meta"):
        model = Llama(cfg)
    model.to_empty(device="cpu")
    init_llama_weights(model, seed)
    model.reset_buffers()
    return model.eval()


def build_llama_tiny() -> Llama:
    """The ``llama_tiny`` zoo model (dim 64, 2 layers, 4 heads / 2 kv heads, vocab 256)."""
    return build_llama(LLAMA_TINY)


def build_llama_100m() -> Llama:
    """The ``llama_100m`` zoo model (~124.7M parameters)."""
    return build_llama(LLAMA_100M)


def build_llama_1b() -> Llama:
    """The ``llama_1b`` zoo model (~1.10B parameters)."""
    return build_llama(LLAMA_1B)


def example_prompt(cfg: LlamaConfig, length: int = EXAMPLE_PROMPT_LEN, seed: int = LLAMA_INPUT_SEED) -> torch.Tensor:
    """Seeded prompt token ids ``(1, length)`` int64 within ``cfg.vocab_size``."""
    return torch.randint(cfg.vocab_size, (1, length), generator=make_generator(seed))


def llama_example_inputs(cfg: LlamaConfig = LLAMA_TINY) -> dict[str, tuple[torch.Tensor, ...]]:
    """Zoo example inputs: ``{"forward": (tokens (1, 8), arange(8))}``."""
    return {"forward": (example_prompt(cfg), torch.arange(EXAMPLE_PROMPT_LEN))}


def llama_method_inputs(
    cfg: LlamaConfig = LLAMA_TINY, prompt_len: int = EXAMPLE_PROMPT_LEN, one_graph: bool = False
) -> dict[str, tuple[torch.Tensor, ...]]:
    """Example inputs of the two LLM methods.

    ``prefill``: (tokens (1, T), arange(T)); ``decode``: (tokens (1, 1), tensor([T])),
    i.e. the first decode step after a ``T``-token prompt. ``one_graph``: ``decode`` gets the prefill's inputs
    (with ``llama_dynamic_shapes(one_graph=True)`` both methods export the same dynamic-length graph, which a
    backend lowers once: the ORT delegate then serves both methods from one session, one copy of its packed
    weights; docs/performance.md, *ORT resident memory*).
    """
    if not 1 <= prompt_len < cfg.max_seq_len:
        raise ValueError(f"prompt_len must be in [1, {cfg.max_seq_len}), got {prompt_len}")
    prompt = example_prompt(cfg, prompt_len)
    next_token = example_prompt(cfg, 1, seed=LLAMA_INPUT_SEED + 1)
    return {
        "prefill": (prompt, torch.arange(prompt_len)),
        "decode": (prompt, torch.arange(prompt_len)) if one_graph else (next_token, torch.tensor([prompt_len])),
    }


def llama_dynamic_shapes(cfg: LlamaConfig = LLAMA_TINY, one_graph: bool = False) -> dict[str, dict | None]:
    """``dynamic_shapes`` for ``torch.export.export`` per method.

    ``prefill``: the prompt length is ``Dim("seq_len", min=PREFILL_MIN_LEN, max=max_seq_len)``
    shared by ``tokens`` dim 1 and ``input_pos`` dim 0; ``decode``: static (``None``), or with ``one_graph``
    the prefill's (see :func:`llama_method_inputs`).
    """
    seq_len = torch.export.Dim("seq_len", min=PREFILL_MIN_LEN, max=cfg.max_seq_len)
    prefill = {"tokens": {1: seq_len}, "input_pos": {0: seq_len}}
    return {"prefill": prefill, "decode": prefill if one_graph else None}


def export_llama(
    model: Llama,
    prompt_len: int = EXAMPLE_PROMPT_LEN,
    strict: bool = False,
) -> dict[str, torch.export.ExportedProgram]:
    """Export ``model`` as ``{"prefill": ep, "decode": ep}``.

    Both programs are exported from the same module (its ``forward``), so their
    parameter and buffer names (``layers.<i>.attention.k_cache`` ...) match and
    a runtime can share one KV cache between them. ``prefill`` has a dynamic
    prompt length (see :func:`llama_dynamic_shapes`; ``prompt_len`` is only the
    example length, >= 2); ``decode`` is static. The programs come straight from
    ``torch.export.export`` (training IR: the cache writes are still in-place
    ``index_copy_`` nodes); ``ep.run_decompositions()`` functionalises them into
    ``index_put`` + ``graph_signature.buffers_to_mutate``. Exporting does not touch the eager caches.
    """
    if prompt_len < 2:
        raise ValueError("the example prompt must have >= 2 tokens (length 1 specialises the dynamic dim)")
    inputs = llama_method_inputs(model.config, prompt_len)
    shapes = llama_dynamic_shapes(model.config)
    return {
        method: torch.export.export(model, inputs[method], dynamic_shapes=shapes[method], strict=strict)
        for method in ("prefill", "decode")
    }


def param_count(model: nn.Module) -> int:
    """Number of parameters (buffers excluded)."""
    return sum(p.numel() for p in model.parameters())
