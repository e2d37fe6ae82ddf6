"""Tests for the tiny Hugging Face Llama / Qwen2 LMs wrapped with a static KV cache held in buffers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from edgetorch.models.generation import (  # noqa: E402
    greedy_generate,
    greedy_generate_with_logits,
    unlifted_methods,
)
from edgetorch.models.hf import (  # noqa: E402
    HF_MAX_CACHE_LEN,
    build_hf_llama,
    build_hf_qwen2,
    export_hf_lm,
    hf_dynamic_shapes,
    hf_method_inputs,
    hf_reference_greedy,
    wrap_static_cache,
)

BUILDERS = {"llama": build_hf_llama, "qwen2": build_hf_qwen2}
N_LAYERS = 2
CACHE_NAMES = {f"{kind}_cache_{i}" for i in range(N_LAYERS) for kind in ("key", "value")}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def hf_pair(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, torch.nn.Module]:
    model = BUILDERS[request.param]()
    return request.param, model, wrap_static_cache(model)


@pytest.fixture(scope="module")
def llama_programs() -> tuple[torch.nn.Module, dict[str, torch.export.ExportedProgram]]:
    wrapper = wrap_static_cache(build_hf_llama())
    programs = {name: ep.run_decompositions() for name, ep in export_hf_lm(wrapper).items()}
    return wrapper, programs


def _prompt(length: int = 8) -> torch.Tensor:
    return hf_method_inputs(256, length)["prefill"][0]


def test_builds_are_seeded() -> None:
    a, b = build_hf_llama(), build_hf_llama()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert any(name.endswith("q_proj.bias") for name, _ in build_hf_qwen2().named_parameters())


def test_wrapper_holds_cache_in_buffers(hf_pair: tuple) -> None:
    _, _, wrapper = hf_pair
    buffers = dict(wrapper.named_buffers())
    assert CACHE_NAMES <= set(buffers)
    assert buffers["key_cache_0"].shape == (1, 2, HF_MAX_CACHE_LEN, 16)
    assert buffers["cumulative_length_1"].dtype == torch.int64


@torch.no_grad()
def test_prefill_logits_match_cache_free_forward(hf_pair: tuple) -> None:
    _, model, wrapper = hf_pair
    prompt = _prompt(9)
    wrapper.reset_cache()
    logits = wrapper.prefill(prompt, torch.arange(9))
    torch.testing.assert_close(logits, model(input_ids=prompt, use_cache=False).logits, atol=1e-5, rtol=1e-4)
    wrapper.reset_cache()


def test_eager_greedy_matches_hf_generate(hf_pair: tuple) -> None:
    _, model, wrapper = hf_pair
    prompt = _prompt()
    wrapper.reset_cache()
    tokens = greedy_generate(wrapper.prefill, wrapper.decode, prompt, 12, max_seq_len=wrapper.max_cache_len)
    assert len(set(tokens)) > 3
    assert tokens == hf_reference_greedy(model, prompt, 12)
    generated = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False, use_cache=True
    )
    assert tokens == generated[0, prompt.shape[1] :].tolist()
    wrapper.reset_cache()


def test_dynamic_shapes_helper() -> None:
    shapes = hf_dynamic_shapes()
    dim = shapes["prefill"]["input_ids"][1]
    assert shapes["prefill"]["cache_position"][0] is dim
    assert (dim.min, dim.max) == (1, HF_MAX_CACHE_LEN)
    assert shapes["decode"] is None


def test_exported_llama_mutates_caches(llama_programs: tuple) -> None:
    _, programs = llama_programs
    for ep in programs.values():
        mutated = set(ep.graph_signature.buffers_to_mutate.values())
        assert CACHE_NAMES <= mutated
        assert {f"cumulative_length_{i}" for i in range(N_LAYERS)} <= mutated
        targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
        assert torch.ops.aten.index_put.default in targets
    prefill = programs["prefill"]
    ids = next(n for n in prefill.graph.nodes if n.name == prefill.graph_signature.user_inputs[0])
    bounds = prefill.range_constraints[ids.meta["val"].shape[1].node.expr]
    assert (bounds.lower, bounds.upper) == (1, HF_MAX_CACHE_LEN)
    # (after run_decompositions HF's program also lists a stale symbol VR[2, int_oo] that no shape uses)


def _compare_exported(wrapper: torch.nn.Module, programs: dict) -> None:
    prompt = _prompt(6)
    wrapper.reset_cache()
    expected = greedy_generate_with_logits(wrapper.prefill, wrapper.decode, prompt, 10)
    methods = unlifted_methods(programs)
    actual = greedy_generate_with_logits(methods["prefill"], methods["decode"], prompt, 10)
    assert actual.tokens == expected.tokens
    for a, b in zip(actual.step_logits, expected.step_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    wrapper.reset_cache()


def test_exported_llama_generation_matches_eager(llama_programs: tuple) -> None:
    _compare_exported(*llama_programs)


@pytest.mark.slow
def test_exported_qwen2_generation_matches_eager() -> None:
    wrapper = wrap_static_cache(build_hf_qwen2())
    programs = {name: ep.run_decompositions() for name, ep in export_hf_lm(wrapper).items()}
    for ep in programs.values():
        assert CACHE_NAMES <= set(ep.graph_signature.buffers_to_mutate.values())
    _compare_exported(wrapper, programs)
