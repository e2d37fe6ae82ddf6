"""Tiny Hugging Face decoder LMs (Llama, Qwen2) wrapped with a static KV cache in buffers.

The models are built from small configs with seeded random weights (no
downloads). :func:`wrap_static_cache` wraps them with
``transformers.integrations.executorch.TorchExportableModuleWithStaticCache``,
which registers every layer's ``StaticCache`` tensors as (non-persistent)
buffers ``key_cache_<i>``, ``value_cache_<i>`` (``(1, n_kv_heads, max_cache_len,
head_dim)``) and ``cumulative_length_<i>`` (int64 scalar: the write offset), so
``torch.export`` records in-place cache updates as buffer mutations.

Calling convention (same as :mod:`edgetorch.models.llama`):
``forward(input_ids (1, T) int64, cache_position (T,) int64) -> logits (1, T, vocab)``.
HF's wrapper only reads ``cache_position[0]``: the ``T`` tokens are written at
``cache_position[0] + arange(T)``, so the positions must be contiguous.

A raw ``torch.export`` needs ``strict=True`` (TorchDynamo): with ``strict=False`` the
cache tensors, reached through the Python ``StaticCache`` object rather than the
module attributes, are lifted as *constants* and ``run_decompositions()`` fails.
``edgetorch.export`` sessions detect this and export again strictly (logged).
``transformers`` is imported lazily; it is an optional (test) dependency.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._common import seeded

__all__ = ["HF_SEED", "HF_MAX_CACHE_LEN", "HF_EXAMPLE_PROMPT_LEN", "HF_PREFILL_MIN_LEN", "TINY_DECODER_KWARGS",
           "build_hf_llama", "build_hf_qwen2", "wrap_static_cache", "build_hf_llama_static", "build_hf_qwen2_static",
           "hf_method_inputs", "hf_dynamic_shapes", "export_hf_lm", "hf_reference_greedy"]

HF_SEED = 1901
HF_MAX_CACHE_LEN = 64
HF_EXAMPLE_PROMPT_LEN = 8
# Same bounds as llama.py: min=1 is accepted when the example prompt has >= 2 tokens.
HF_PREFILL_MIN_LEN = 1

TINY_DECODER_KWARGS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}


def _require_transformers() -> Any:
    """Import and return ``transformers`` or raise a helpful ``ImportError``."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "edgetorch.models.hf needs the optional 'transformers' package "
            "(pip install 'transformers==5.23.0', as pinned in pyproject's dev extras)"
        ) from exc
    return transformers


def _build_causal_lm(config_name: str, model_name: str, seed: int, **overrides: Any) -> nn.Module:
    transformers = _require_transformers()
    config = getattr(transformers, config_name)(**{**TINY_DECODER_KWARGS, **overrides})
    config._attn_implementation = "sdpa"
    with seeded(seed):
        model = getattr(transformers, model_name)(config)
    model.generation_config.eos_token_id = None  # fixed-length greedy runs in tests
    model.generation_config.pad_token_id = 0
    return model.eval()


def build_hf_llama(seed: int = HF_SEED, **overrides: Any) -> nn.Module:
    """Tiny ``LlamaForCausalLM`` (hidden 64, 2 layers, 4 heads / 2 kv heads, vocab 256), seeded."""
    return _build_causal_lm("LlamaConfig", "LlamaForCausalLM", seed, **overrides)


def build_hf_qwen2(seed: int = HF_SEED, **overrides: Any) -> nn.Module:
    """Tiny ``Qwen2ForCausalLM`` (same sizes as :func:`build_hf_llama`, q/k/v biases), seeded."""
    return _build_causal_lm("Qwen2Config", "Qwen2ForCausalLM", seed, **overrides)


def _static_cache_base() -> type:
    _require_transformers()
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    return TorchExportableModuleWithStaticCache


def wrap_static_cache(model: nn.Module, max_cache_len: int = HF_MAX_CACHE_LEN) -> nn.Module:
    """Wrap a HF causal LM with a static cache held in buffers; see the module docstring.

    Returns an instance of a subclass of HF's ``TorchExportableModuleWithStaticCache``
    whose ``forward(input_ids, cache_position)`` takes positional tensors and which
    adds ``reset_cache()``, ``prefill``/``decode`` aliases and ``max_cache_len``.
    Sets ``model.generation_config.cache_implementation = "static"`` (required by HF).
    """
    model.generation_config.cache_implementation = "static"
    cls = _wrapper_class()
    wrapper = cls(model, batch_size=1, max_cache_len=max_cache_len, device=torch.device("cpu"))
    wrapper.max_cache_len = max_cache_len
    return wrapper.eval()


_WRAPPER_CLASS: type | None = None


def _wrapper_class() -> type:
    """Create (once) the subclass of HF's wrapper; deferred so transformers loads lazily."""
    global _WRAPPER_CLASS
    if _WRAPPER_CLASS is None:
        base = _static_cache_base()

        class _HFStaticCacheLM(base):  # type: ignore[misc, valid-type]
            """HF static-cache export wrapper with a positional ``(input_ids, cache_position)`` forward."""

            max_cache_len: int

            def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
                return super().forward(input_ids=input_ids, cache_position=cache_position)

            def prefill(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
                """Same as ``forward``; for a ``(1, T)`` prompt at ``arange(T)``."""
                return self(input_ids, cache_position)

            def decode(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
                """Same as ``forward``; for one token ``(1, 1)`` at ``tensor([pos])``."""
                return self(input_ids, cache_position)

            @torch.no_grad()
            def reset_cache(self) -> None:
                """Zero every key/value cache and write offset."""
                for name, buf in self.named_buffers():
                    if name.startswith(("key_cache_", "value_cache_", "cumulative_length_")):
                        buf.zero_()

        _WRAPPER_CLASS = _HFStaticCacheLM
    return _WRAPPER_CLASS


def build_hf_llama_static(max_cache_len: int = HF_MAX_CACHE_LEN) -> nn.Module:
    """:func:`build_hf_llama` wrapped by :func:`wrap_static_cache`."""
    return wrap_static_cache(build_hf_llama(), max_cache_len)


def build_hf_qwen2_static(max_cache_len: int = HF_MAX_CACHE_LEN) -> nn.Module:
    """:func:`build_hf_qwen2` wrapped by :func:`wrap_static_cache`."""
    return wrap_static_cache(build_hf_qwen2(), max_cache_len)


def hf_method_inputs(
    vocab_size: int = 256, prompt_len: int = HF_EXAMPLE_PROMPT_LEN, seed: int = HF_SEED + 1000,
    one_graph: bool = False,
) -> dict[str, tuple[torch.Tensor, ...]]:
    """``{"prefill": (ids (1, T), arange(T)), "decode": (ids (1, 1), tensor([T]))}``, seeded. ``one_graph``:
    decode gets the prefill's inputs (with ``hf_dynamic_shapes(one_graph=True)``: one dynamic graph for both
    methods, lowered once; as ``llama_method_inputs``)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab_size, (1, prompt_len + 1), generator=gen)
    prefill = (ids[:, :prompt_len], torch.arange(prompt_len))
    return {"prefill": prefill, "decode": prefill if one_graph else (ids[:, prompt_len:], torch.tensor([prompt_len]))}


def hf_dynamic_shapes(max_cache_len: int = HF_MAX_CACHE_LEN, one_graph: bool = False) -> dict[str, dict | None]:
    """Prefill: ``Dim("seq_len", min=1, max=max_cache_len)`` on the prompt length; decode: static, or with
    ``one_graph`` the prefill's."""
    seq_len = torch.export.Dim("seq_len", min=HF_PREFILL_MIN_LEN, max=max_cache_len)
    prefill = {"input_ids": {1: seq_len}, "cache_position": {0: seq_len}}
    return {"prefill": prefill, "decode": prefill if one_graph else None}


def export_hf_lm(
    wrapper: nn.Module, prompt_len: int = HF_EXAMPLE_PROMPT_LEN
) -> dict[str, torch.export.ExportedProgram]:
    """Export a :func:`wrap_static_cache` wrapper as ``{"prefill": ep, "decode": ep}``.

    Both come from the same module (buffer names ``key_cache_<i>`` ... match), with
    ``strict=True`` (required, see the module docstring). Prefill has a dynamic
    prompt length; ``prompt_len`` (>= 2) is only the example length.
    """
    if prompt_len < 2:
        raise ValueError("the example prompt must have >= 2 tokens (length 1 specialises the dynamic dim)")
    vocab = wrapper.model.config.get_text_config().vocab_size
    inputs = hf_method_inputs(vocab, prompt_len)
    shapes = hf_dynamic_shapes(wrapper.max_cache_len)
    return {
        method: torch.export.export(wrapper, inputs[method], dynamic_shapes=shapes[method], strict=True)
        for method in ("prefill", "decode")
    }


@torch.no_grad()
def hf_reference_greedy(model: nn.Module, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
    """Greedy tokens from plain HF forwards without a cache (full recompute every step)."""
    ids = prompt.clone()
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(model(input_ids=ids, use_cache=False).logits[0, -1].argmax())
        out.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out
