"""LLMs on the runtime: a Llama-style zoo decoder and Hugging Face Llama/Qwen2 with a static KV cache, exported as
``prefill`` (dynamic prompt length) + ``decode`` (one token) methods sharing the cache, lowered portable and to
ONNX Runtime; greedy generation on the runtime matches eager token for token, and logits stay close."""

from __future__ import annotations

import pytest
import torch

from edgetorch.backends.onnxruntime import OrtPartitioner
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.models.generation import greedy_generate_with_logits
from edgetorch.models.llama import build_llama_tiny, example_prompt, export_llama
from edgetorch.runtime import Runtime

NEW_TOKENS = 12


def _runtime_generate(eps: dict, prompt: torch.Tensor, ort: bool, n: int = NEW_TOKENS):
    et = to_edge_transform_and_lower(eps, partitioner=[OrtPartitioner()] if ort else None).to_executorch()
    prog = Runtime.get().load_program(et.buffer)
    prefill, decode = prog.load_method("prefill"), prog.load_method("decode")
    result = greedy_generate_with_logits(prefill.execute, decode.execute, prompt, n)
    return prog, et, result


def _check(got, want, atol: float) -> None:
    assert got.tokens == want.tokens
    for g, w in zip(got.step_logits, want.step_logits):
        torch.testing.assert_close(g, w, rtol=0, atol=atol)


@pytest.fixture(scope="module")
def llama():
    model = build_llama_tiny()
    eps = export_llama(model)
    prompt = example_prompt(model.config, 7)
    model.reset_cache()
    want = greedy_generate_with_logits(model.prefill, model.decode, prompt, NEW_TOKENS)
    return model, eps, prompt, want


@pytest.mark.parametrize("ort", [False, True], ids=["portable", "ort"])
def test_zoo_llama_generates_the_eager_tokens(llama, ort):
    model, eps, prompt, want = llama
    prog, et, got = _runtime_generate(eps, prompt, ort)
    _check(got, want, atol=1e-4)
    plan = et.program.plan("prefill")
    assert len(plan.symbols) == 1 and plan.symbols[0].max == model.config.max_seq_len
    assert {mb.name for mb in plan.mutable_buffers} == {mb.name for mb in et.program.plan("decode").mutable_buffers}
    # a second prompt after reset() gives the same tokens as a fresh program
    prog.reset()
    again = greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                        prompt, NEW_TOKENS)
    assert again.tokens == want.tokens


def test_prompts_of_other_lengths_reuse_the_same_program(llama):
    model, eps, _, _ = llama
    et = to_edge_transform_and_lower(eps).to_executorch()
    prog = Runtime.get().load_program(et.buffer)
    for length in (2, 19, 40):
        prompt = example_prompt(model.config, length, seed=length)
        model.reset_cache()
        want = greedy_generate_with_logits(model.prefill, model.decode, prompt, 4)
        prog.reset()
        got = greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                          prompt, 4)
        _check(got, want, atol=1e-4)


@pytest.fixture(scope="module")
def hf_exported():
    """Each Hugging Face family's exported programs, prompt and eager tokens, exported once (a strict export of two
    methods) for its portable and its ORT test, as ``llama`` above is."""
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            pytest.importorskip("transformers")
            from edgetorch.models import hf

            wrapper = hf.build_hf_llama_static() if family == "llama" else hf.build_hf_qwen2_static()
            eps = hf.export_hf_lm(wrapper)
            prompt = hf.hf_method_inputs(prompt_len=6, seed=7)["prefill"][0]
            cache[family] = eps, prompt, hf.hf_reference_greedy(wrapper.model, prompt, 8)  # plain HF, no cache
        return cache[family]

    yield get
    cache.clear()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("ort", [False, True], ids=["portable", "ort"])
def test_hugging_face_causal_lm_with_static_cache(family, ort, hf_exported):
    eps, prompt, want = hf_exported(family)
    _, _, got = _runtime_generate(eps, prompt, ort, 8)
    assert got.tokens == want
