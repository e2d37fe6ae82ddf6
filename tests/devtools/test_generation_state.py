"""A clean LLM generation names no culprit, whatever ran before the record was saved: the .pte and the ETRecord
keep the KV caches as they were at ``to_edge`` (the eager model filling its caches afterwards changes neither),
and the replay's local re-runs read the runtime's own caches (an ONNX Runtime delegate's rounding in earlier
steps is not charged to the portable cache writes)."""

from __future__ import annotations

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector.generation import logged_state
from edgetorch.devtools.inspector.numeric_gap import runtime_entries
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.models.generation import greedy_generate_with_logits
from edgetorch.models.llama import build_llama_tiny, example_prompt, export_llama
from edgetorch.runtime import Runtime

PROMPT_LEN = 5
NEW_TOKENS = 5  # prefill + 4 decode calls


@pytest.fixture(scope="module", params=["portable", "onnxruntime"])
def generation(request, tmp_path_factory):
    """(inspector, eager model, runtime result) of a generation whose ETRecord and .pte bytes were taken after
    the eager model generated (its caches full)."""
    model = build_llama_tiny()
    parts = None
    if request.param == "onnxruntime":
        from edgetorch.backends.onnxruntime import OrtPartitioner
        parts = [OrtPartitioner()]
    et = to_edge_transform_and_lower(export_llama(model), partitioner=parts, generate_etrecord=True).to_executorch()
    pte = et.buffer  # as `edgetorch generate` does: the .pte saved first, the record after the eager run
    prompt = example_prompt(model.config, PROMPT_LEN)
    with torch.no_grad():  # the eager model fills its caches before the record is saved
        model.reset_cache()
        want = greedy_generate_with_logits(model.prefill, model.decode, prompt, NEW_TOKENS)
    assert any(layer.attention.k_cache.abs().sum() > 0 for layer in model.layers)
    tmp = tmp_path_factory.mktemp(request.param)
    et.get_etrecord().save(tmp / "rec.bin")
    assert et.buffer == pte  # emission copied the caches: the .pte bytes do not follow the eager model
    prog = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
    prefill, decode = prog.load_method("prefill"), prog.load_method("decode")
    got = greedy_generate_with_logits(prefill.execute, decode.execute, prompt, NEW_TOKENS)
    prog.write_etdump_result_to_file(tmp / "gen.etdp", tmp / "gen.bin")
    insp = Inspector(etdump_path=tmp / "gen.etdp", etrecord=tmp / "rec.bin", debug_buffer_path=tmp / "gen.bin")
    return insp, want, got


def test_the_pte_keeps_the_caches_as_emitted():
    """Without an ETRecord too: a .pte built lazily (``et.buffer``) after the eager model ran starts from the
    caches as they were at ``to_executorch``."""
    model = build_llama_tiny()
    et = to_edge_transform_and_lower(export_llama(model)).to_executorch()
    with torch.no_grad():
        model.reset_cache()
        model.prefill(example_prompt(model.config, PROMPT_LEN), torch.arange(PROMPT_LEN))
    cache = model.layers[0].attention.k_cache
    assert cache.abs().sum() > 0
    prog = Runtime.get().load_program(et.buffer)
    prog.load_method("prefill")
    assert torch.equal(prog.buffers["layers.0.attention.k_cache"], torch.zeros_like(cache))


def test_the_program_starts_from_the_caches_at_export(generation):
    _, want, got = generation
    assert got.tokens == want.tokens  # the runtime started from empty caches, as the eager generation did
    for a, b in zip(got.step_logits, want.step_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_no_culprit_and_no_divergence_in_any_execution(generation):
    insp, _, _ = generation
    assert len(insp.executions) == NEW_TOKENS
    for k in reversed(range(NEW_TOKENS)):  # a later execution first: the replay seeks through the earlier ones
        df = insp.calculate_numeric_gap("MSE", execution=k)
        culprits = insp.find_culprits(df)
        assert culprits.empty, (k, [list(o) for o in culprits["aot_ops"]], list(culprits["noise_ratio"]))
        assert df.attrs["output_gap"] < 1e-9
    assert insp.first_divergence_across_executions(1e-6) is None


def test_the_replay_reads_the_caches_the_runtime_logged(generation):
    """The state the local re-runs read before a decode call is the cache the runtime's writer logged in the
    call before, bit for bit."""
    insp, _, _ = generation
    replay = insp.replay(None)
    replay.gap_table(2)
    gm, _ = replay.module("decode")
    rec = replay.records[1]
    logged = logged_state(gm, runtime_entries(insp.event_blocks[rec.block].events, rec.block_run))
    assert len(logged) == 4  # k and v caches of both layers
    replay._seek(2)  # back to the state before execution 2: the one execution 1 left
    for target, t in logged.items():
        assert t.abs().sum() > 0 and torch.equal(replay._rt_state[target], t)
