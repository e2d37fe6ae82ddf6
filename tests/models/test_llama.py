"""Tests for the Llama-style decoder with a static KV cache, its export helpers and greedy generation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from edgetorch.models import get_spec, list_models
from edgetorch.models.generation import (
    as_logits,
    decode_only_generate,
    greedy_generate,
    greedy_generate_with_logits,
    unlifted_methods,
)
from edgetorch.models.llama import (
    LLAMA_1B,
    LLAMA_100M,
    LLAMA_TINY,
    PREFILL_MIN_LEN,
    Llama,
    LlamaConfig,
    build_llama,
    example_prompt,
    export_llama,
    llama_dynamic_shapes,
    llama_method_inputs,
    param_count,
)

CACHE_NAMES = {f"layers.{i}.attention.{kind}" for i in range(LLAMA_TINY.n_layers) for kind in ("k_cache", "v_cache")}


@pytest.fixture(scope="module")
def model() -> Llama:
    return build_llama(LLAMA_TINY)


@pytest.fixture(scope="module")
def exported(model: Llama) -> dict[str, torch.export.ExportedProgram]:
    return export_llama(model)


@pytest.fixture(scope="module")
def decomposed(exported: dict[str, torch.export.ExportedProgram]) -> dict[str, torch.export.ExportedProgram]:
    return {name: ep.run_decompositions() for name, ep in exported.items()}


# --------------------------------------------------------------------------- reference implementation


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def _ref_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate pairs (i, i + D/2) of ``x`` (T, heads, D) by ``pos * theta^(-2i/D)``, one pair at a time."""
    dim = x.shape[-1]
    half = dim // 2
    out = torch.empty_like(x)
    for i in range(half):
        angle = positions.double() * theta ** (-2.0 * i / dim)
        cos, sin = angle.cos().float()[:, None], angle.sin().float()[:, None]
        a, b = x[..., i], x[..., i + half]
        out[..., i] = a * cos - b * sin
        out[..., i + half] = b * cos + a * sin
    return out


def _ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA over (T, heads, D) tensors, head by head: query head h reads kv head h // group."""
    t, n_heads, d = q.shape
    group = n_heads // k.shape[1]
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    out = torch.empty_like(q)
    for h in range(n_heads):
        scores = q[:, h] @ k[:, h // group].T / math.sqrt(d)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        out[:, h] = probs @ v[:, h // group]
    return out


def _reference_logits(model: Llama, tokens: torch.Tensor) -> torch.Tensor:
    """Cache-free forward over ``tokens`` (1, T) at positions 0..T-1, written from the weights."""
    cfg = model.config
    t = tokens.shape[1]
    pos = torch.arange(t)
    h = model.tok_embeddings.weight[tokens[0]]
    for layer in model.layers:
        att, ffn = layer.attention, layer.feed_forward
        x = _rms(h, layer.attention_norm.weight, cfg.norm_eps)
        q = _ref_rope((x @ att.wq.weight.T).view(t, cfg.n_heads, cfg.head_dim), pos, cfg.rope_theta)
        k = _ref_rope((x @ att.wk.weight.T).view(t, cfg.n_kv_heads, cfg.head_dim), pos, cfg.rope_theta)
        v = (x @ att.wv.weight.T).view(t, cfg.n_kv_heads, cfg.head_dim)
        h = h + _ref_attention(q, k, v).reshape(t, -1) @ att.wo.weight.T
        x = _rms(h, layer.ffn_norm.weight, cfg.norm_eps)
        h = h + (F.silu(x @ ffn.w1.weight.T) * (x @ ffn.w3.weight.T)) @ ffn.w2.weight.T
    return (_rms(h, model.norm.weight, cfg.norm_eps) @ model.output.weight.T)[None]


# --------------------------------------------------------------------------- build and configs


def test_configs_and_param_counts() -> None:
    with torch.device("meta"):
        assert param_count(Llama(LLAMA_100M)) == 124_668_672
        assert param_count(Llama(LLAMA_1B)) == 1_104_218_112
    assert LLAMA_TINY.head_dim == 16
    with pytest.raises(ValueError):
        LlamaConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError):
        LlamaConfig(dim=60, n_heads=4)  # head_dim 15 is odd


def test_zoo_registration() -> None:
    for name in ("llama_tiny", "llama_100m", "llama_1b"):
        assert name in list_models()
    assert not get_spec("llama_tiny").slow
    assert get_spec("llama_100m").slow and get_spec("llama_1b").slow
    tokens, input_pos = get_spec("llama_tiny").example_inputs()["forward"]
    assert tokens.shape == (1, 8) and tokens.dtype == torch.int64
    assert torch.equal(input_pos, torch.arange(8))


def test_build_is_deterministic_and_leaves_global_rng(model: Llama) -> None:
    state = torch.get_rng_state()
    other = build_llama(LLAMA_TINY)
    assert torch.equal(torch.get_rng_state(), state)
    for (name, a), (_, b) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(build_llama(LLAMA_TINY, seed=7).output.weight, model.output.weight)


def test_weight_init(model: Llama) -> None:
    assert not model.training
    assert torch.equal(model.norm.weight, torch.ones(LLAMA_TINY.dim))
    std = model.layers[0].feed_forward.w1.weight.std().item()
    assert 0.018 < std < 0.022
    cache = model.layers[0].attention.k_cache
    assert cache.shape == (1, 2, 64, 16)
    # caches and rope tables are runtime state, not checkpoint weights
    assert not any("cache" in key or "rope" in key for key in model.state_dict())


# --------------------------------------------------------------------------- eager correctness


@torch.no_grad()
def test_prefill_matches_reference(model: Llama) -> None:
    tokens = example_prompt(LLAMA_TINY, 11)
    model.reset_cache()
    logits = model(tokens, torch.arange(11))
    assert logits.shape == (1, 11, LLAMA_TINY.vocab_size)
    torch.testing.assert_close(logits, _reference_logits(model, tokens), atol=1e-5, rtol=1e-4)


def test_rope_tables_match_reference() -> None:
    from edgetorch.models.llama import apply_rope, rope_tables

    x = torch.randn(1, 3, 7, 16, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(16, 32, 10000.0)
    pos = torch.tensor([0, 3, 4, 9, 10, 20, 31])
    got = apply_rope(x, cos[pos], sin[pos])
    expected = _ref_rope(x[0].transpose(0, 1), pos, 10000.0).transpose(0, 1)[None]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_prefill_equals_stepwise_decode_and_chunks(model: Llama) -> None:
    tokens = example_prompt(LLAMA_TINY, 9)
    model.reset_cache()
    full = model(tokens, torch.arange(9))
    model.reset_cache()
    steps = torch.cat([model(tokens[:, i : i + 1], torch.tensor([i])) for i in range(9)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    model.reset_cache()
    chunks = torch.cat([model(tokens[:, :4], torch.arange(4)), model(tokens[:, 4:], torch.arange(4, 9))], dim=1)
    torch.testing.assert_close(chunks, full, atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_cache_holds_rotated_keys_and_values(model: Llama) -> None:
    cfg = model.config
    seen: list[torch.Tensor] = []
    hooks = [
        layer.attention.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
        for layer in model.layers
    ]
    try:
        model.reset_cache()
        t = 6
        model(example_prompt(cfg, t), torch.arange(t))
    finally:
        for hook in hooks:
            hook.remove()
    for layer, x in zip(model.layers, seen, strict=True):
        att = layer.attention
        k = _ref_rope((x[0] @ att.wk.weight.T).view(t, cfg.n_kv_heads, cfg.head_dim), torch.arange(t), cfg.rope_theta)
        v = (x[0] @ att.wv.weight.T).view(t, cfg.n_kv_heads, cfg.head_dim)
        torch.testing.assert_close(att.k_cache[0, :, :t], k.transpose(0, 1), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(att.v_cache[0, :, :t], v.transpose(0, 1), atol=1e-5, rtol=1e-4)
        assert not att.k_cache[:, :, t:].any() and not att.v_cache[:, :, t:].any()
    model.reset_cache()
    assert not any(layer.attention.k_cache.any() for layer in model.layers)


@torch.no_grad()
def test_mask_hides_slots_after_the_query(model: Llama) -> None:
    tokens = example_prompt(LLAMA_TINY, 5)
    model.reset_cache()
    model(tokens[:, :4], torch.arange(4))
    clean = model(tokens[:, 4:], torch.tensor([4]))
    for layer in model.layers:  # garbage in slots 5.. must not matter
        layer.attention.k_cache[:, :, 5:] = 100.0
        layer.attention.v_cache[:, :, 5:] = -100.0
    assert torch.equal(model(tokens[:, 4:], torch.tensor([4])), clean)
    model.reset_cache()


# --------------------------------------------------------------------------- generation


def test_greedy_prefill_decode_equals_decode_only(model: Llama) -> None:
    prompt = example_prompt(LLAMA_TINY, 5)
    model.reset_cache()
    result = greedy_generate_with_logits(model.prefill, model.decode, prompt, 12, max_seq_len=64)
    model.reset_cache()
    reference = decode_only_generate(model.decode, prompt, 12)
    assert len(result.tokens) == 12
    assert len(set(result.tokens)) > 3, "random weights should not generate a constant sequence"
    assert result.tokens == reference.tokens
    for a, b in zip(result.step_logits, reference.step_logits, strict=True):
        assert a.shape == (LLAMA_TINY.vocab_size,)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(result.prefill_logits, reference.prefill_logits, atol=1e-5, rtol=1e-4)


def test_generation_accepts_sequence_outputs_and_validates(model: Llama) -> None:
    prompt = example_prompt(LLAMA_TINY, 4)

    def as_list(tokens: torch.Tensor, pos: torch.Tensor) -> list[torch.Tensor]:
        return [model(tokens, pos)]

    model.reset_cache()
    expected = greedy_generate(model.prefill, model.decode, prompt, 5)
    model.reset_cache()
    assert greedy_generate(as_list, as_list, prompt, 5) == expected
    model.reset_cache()
    stopped = greedy_generate(model.prefill, model.decode, prompt, 5, eos_token_id=expected[1])
    assert stopped == expected[: expected.index(expected[1]) + 1]
    with pytest.raises(ValueError):
        greedy_generate(model.prefill, model.decode, prompt, 62, max_seq_len=64)
    with pytest.raises(ValueError):
        greedy_generate(model.prefill, model.decode, prompt[0], 2)
    with pytest.raises(TypeError):
        as_logits({"logits": 1})
    model.reset_cache()


# --------------------------------------------------------------------------- export


def test_method_inputs_and_dynamic_shapes() -> None:
    inputs = llama_method_inputs(LLAMA_TINY, 5)
    tokens, pos = inputs["prefill"]
    assert tokens.shape == (1, 5) and torch.equal(pos, torch.arange(5))
    tokens, pos = inputs["decode"]
    assert tokens.shape == (1, 1) and torch.equal(pos, torch.tensor([5]))
    shapes = llama_dynamic_shapes(LLAMA_TINY)
    assert shapes["decode"] is None
    dim = shapes["prefill"]["tokens"][1]
    assert shapes["prefill"]["input_pos"][0] is dim
    assert (dim.min, dim.max) == (PREFILL_MIN_LEN, 64)
    with pytest.raises(ValueError):
        llama_method_inputs(LLAMA_TINY, 64)
    with pytest.raises(ValueError):
        export_llama(build_llama(LLAMA_TINY), prompt_len=1)
    one = llama_method_inputs(LLAMA_TINY, 5, one_graph=True)  # decode exported from the prefill's graph
    assert all(torch.equal(a, b) for a, b in zip(one["decode"], one["prefill"]))
    shapes = llama_dynamic_shapes(LLAMA_TINY, one_graph=True)
    assert shapes["decode"] is shapes["prefill"] and shapes["prefill"]["tokens"][1].min == PREFILL_MIN_LEN == 1


def test_export_ranges_and_in_place_updates(model: Llama, exported: dict[str, torch.export.ExportedProgram]) -> None:
    assert not any(layer.attention.k_cache.any() for layer in model.layers), "export must not write eager caches"
    (bounds,) = exported["prefill"].range_constraints.values()
    assert (bounds.lower, bounds.upper) == (PREFILL_MIN_LEN, LLAMA_TINY.max_seq_len)
    assert not exported["decode"].range_constraints
    for ep in exported.values():
        # torch.export's default (training) IR keeps the writes in place
        targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
        assert targets.count(torch.ops.aten.index_copy_.default) == len(CACHE_NAMES)


def test_decomposed_programs_mutate_every_cache(decomposed: dict[str, torch.export.ExportedProgram]) -> None:
    for ep in decomposed.values():
        assert set(ep.graph_signature.buffers_to_mutate.values()) == CACHE_NAMES
        assert {"rope_cos", "rope_sin"} <= set(ep.graph_signature.non_persistent_buffers)


def test_cache_update_is_one_index_put_per_buffer(decomposed: dict[str, torch.export.ExportedProgram]) -> None:
    """The edge pattern: placeholder -> aten.index_put(cache, [None, None, input_pos], kv) -> graph output.

    The placeholder has no other user: attention reads the index_put result.
    """
    for ep in decomposed.values():
        sig = ep.graph_signature
        placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        buffer_inputs = {buffer: name for name, buffer in sig.inputs_to_buffers.items()}
        input_pos = placeholders[sig.user_inputs[1]]
        for out_name, buffer in sig.buffers_to_mutate.items():
            (node,) = placeholders[buffer_inputs[buffer]].users
            assert node.name == out_name
            assert node.target == torch.ops.aten.index_put.default
            assert node.args[1] == [None, None, input_pos]
            assert len(node.users) >= 2  # the mutation output and the attention (via unsqueeze/expand)


@pytest.mark.parametrize("stage", ["exported", "decomposed"])
def test_exported_generation_matches_eager(stage: str, model: Llama, request: pytest.FixtureRequest) -> None:
    methods = unlifted_methods(request.getfixturevalue(stage))
    prompt = example_prompt(LLAMA_TINY, 7)
    model.reset_cache()
    expected = greedy_generate_with_logits(model.prefill, model.decode, prompt, 10)
    actual = greedy_generate_with_logits(methods["prefill"], methods["decode"], prompt, 10)
    assert actual.tokens == expected.tokens
    for a, b in zip(actual.step_logits, expected.step_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    cache = methods["decode"].get_buffer("layers.1.attention.v_cache")
    torch.testing.assert_close(cache, model.layers[1].attention.v_cache, atol=1e-5, rtol=1e-4)
    model.reset_cache()


@pytest.mark.parametrize("length", [1, 2, 13, 64])
@torch.no_grad()
def test_dynamic_prefill_lengths(length: int, model: Llama, decomposed: dict) -> None:
    tokens = example_prompt(LLAMA_TINY, length, seed=length)
    prefill = decomposed["prefill"].module()
    model.reset_cache()
    torch.testing.assert_close(
        prefill(tokens, torch.arange(length)), model(tokens, torch.arange(length)), atol=1e-5, rtol=1e-4
    )
    model.reset_cache()


def test_prefill_rejects_lengths_beyond_the_cache(decomposed: dict) -> None:
    with pytest.raises(Exception, match="<= 64"):
        decomposed["prefill"].module()(torch.zeros(1, 65, dtype=torch.long), torch.arange(65))


@pytest.mark.slow
@torch.no_grad()
def test_llama_100m_generation_and_export() -> None:
    model = get_spec("llama_100m").build()
    prompt = example_prompt(model.config, 6)
    expected = greedy_generate_with_logits(model.prefill, model.decode, prompt, 4)
    programs = {name: ep.run_decompositions() for name, ep in export_llama(model).items()}
    assert len(programs["decode"].graph_signature.buffers_to_mutate) == 2 * model.config.n_layers
    methods = unlifted_methods(programs)
    actual = greedy_generate_with_logits(methods["prefill"], methods["decode"], prompt, 4)
    assert actual.tokens == expected.tokens
    for a, b in zip(actual.step_logits, expected.step_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
