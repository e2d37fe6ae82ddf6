"""The mixed-precision fix of a low-bit LLM, proven in tokens (``find_generation_fix``): the recipe's 8-bit / float
exclusions reach the program; on a llama_tiny taught a confident task (next token = token + 1: a random model's
flat logits flip under any rounding), a layer planted with outliers that ruin its int4 group scales is ranked
first, and keeping it at int8 / float restores greedy agreement with the float model within 4 re-exports: checked
by a free-running generation of the fixed program on the runtime against the float model's own."""

from __future__ import annotations

import copy

import pytest
import torch

from edgetorch.errors import InspectorError, RecipeError
from edgetorch.export import ExportRecipe, PortableRecipeType
from edgetorch.models.llama import build_llama_tiny, example_prompt

pytest.importorskip("torchao")

RECIPE = PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR
PLANTED = "layers.0.feed_forward.w2"
TOKENS = 32


def _source_transform(model, **options):
    from edgetorch.export.stages import PipelineArtifact, SourceTransformStage

    stage = SourceTransformStage(ExportRecipe.get_recipe(RECIPE, **options).quantization_recipe)
    stage.run(PipelineArtifact({"decode": model}))
    return stage.get_artifacts().data["decode"]


def test_recipe_keeps_named_layers_at_int8_or_float():
    from edgetorch.export.lowbit import LowBitLinear

    model = build_llama_tiny()
    q = _source_transform(model, int8_module_paths=("layers.0.attention.wv",),
                          exclude_module_paths=("layers.1.attention.wo",))
    bits = {n: m.bits for n, m in q.named_modules() if isinstance(m, LowBitLinear)}
    assert bits["layers.0.attention.wv"] == 8 and not q.get_submodule("layers.0.attention.wv").act_quant
    assert type(q.get_submodule("layers.1.attention.wo")) is torch.nn.Linear
    assert sum(b == 4 for b in bits.values()) == 13 and len(bits) == 14
    # the int8 weights are torchao's int8 per-channel quantization of the float weight
    w = model.get_submodule("layers.0.attention.wv").weight.detach()
    m = q.get_submodule("layers.0.attention.wv")
    deq = m.weight.float() * m.scales.reshape(-1, 1)
    assert float((deq - w).abs().max()) <= float(m.scales.max()) / 2 + 1e-6
    # excluded wins over int8
    q = _source_transform(model, int8_module_paths="layers.0.attention.wv", exclude_module_paths="attention.wv")
    assert type(q.get_submodule("layers.0.attention.wv")) is torch.nn.Linear
    with pytest.raises(RecipeError, match="int8_module_paths"):
        ExportRecipe.get_recipe(RECIPE, int8_module_paths=("",))


def test_bad_arguments_raise_typed_errors():
    from edgetorch.workflows.generation_fix import find_generation_fix

    model = build_llama_tiny()
    prompt = example_prompt(model.config, 4)
    with pytest.raises(RecipeError, match="not a torchao low-bit recipe"):
        find_generation_fix(model, prompt, PortableRecipeType.FP32)
    with pytest.raises(InspectorError, match="tokens"):
        find_generation_fix(model, prompt, RECIPE, tokens=0)
    with pytest.raises(InspectorError, match="keep"):
        find_generation_fix(model, prompt, RECIPE, keep="int4")
    with pytest.raises(InspectorError, match="prompt"):
        find_generation_fix(model, prompt[0], RECIPE)
    with pytest.raises(RecipeError, match="method_inputs"):
        find_generation_fix(torch.nn.Linear(2, 2), prompt, RECIPE)
    for top in (0, True, 2.5):
        with pytest.raises(InspectorError, match="top must be a positive int or None"):
            find_generation_fix(model, prompt, RECIPE, top=top)


def _fresh_caches(model):
    for mod in model.modules():
        for b in list(mod._buffers):
            if "cache" in b:
                mod._buffers[b] = torch.zeros_like(mod._buffers[b]).detach()


def _trained_llama(steps: int = 150):
    """llama_tiny taught next = (token + 1) % vocab (Adam, seeded): confident greedy choices."""
    model = build_llama_tiny()
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        ids = (torch.randint(256, (1, 1), generator=g) + torch.arange(41)) % 256
        _fresh_caches(model)
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1], torch.arange(40))[0], ids[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    _fresh_caches(model)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def _plant(model, path, factor=16.0):
    w = model.get_submodule(path).weight
    with torch.no_grad():
        w[:, 17::32] = factor * w.abs().max()  # one outlier per int4 group: every group's scale ruined


def _free_running(pte: bytes, prompt, n):
    from edgetorch.models.generation import greedy_generate
    from edgetorch.runtime import Runtime

    prog = Runtime.get().load_program(pte)
    return greedy_generate(prog.load_method("prefill").execute, prog.load_method("decode").execute, prompt, n)


@pytest.mark.slow
def test_planted_layer_ranked_first_and_fix_restores_agreement():
    from edgetorch.models.generation import greedy_generate
    from edgetorch.workflows.generation_fix import _export, find_generation_fix, llm_export_args

    model = _trained_llama()
    _plant(model, PLANTED)
    prompt = torch.randint(256, (1, 8), generator=torch.Generator().manual_seed(7))
    lines: list[str] = []
    result = find_generation_fix(copy.deepcopy(model), prompt, RECIPE, tokens=TOKENS, max_reexports=4,
                                 progress=lines.append)
    model.reset_cache()
    with torch.no_grad():
        want = greedy_generate(model.prefill, model.decode, prompt, TOKENS)
    model.reset_cache()  # the programs exported below start from an empty cache (stored as no bytes), as the fix's
    assert result.float_tokens == want
    # the baseline's agreement is that of a free-running generation on the runtime
    base = _export(model, RECIPE, {}, llm_export_args(model), etrecord=False)
    got = _free_running(base.buffer, prompt, TOKENS)
    prefix = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), TOKENS)
    assert result.baseline.agreement == prefix < TOKENS
    assert result.ranking[0] == PLANTED
    assert result.proven and 1 <= result.reexports <= 4, result.to_dataframe().to_string()
    fix = result.fix
    assert PLANTED in fix["float"]  # abnormal: in float at once
    # cumulative: every export keeps what the one before kept; the fix is the first export whose tokens all agree
    # (here the planted layer alone leaves a near tie of the float model flipped, so a later export restores it)
    for a, b in zip(result.steps, result.steps[1:]):
        assert set(a.int8) <= set(b.int8) | set(b.float) and set(a.float) <= set(b.float)
    assert [s.restored for s in result.steps] == [False] * result.reexports + [True]
    assert result.best is result.fix_step and result.fix_step.near_tie_agreement == TOKENS
    for path in fix["int8"] + fix["float"]:  # module paths of the model's Linears
        assert isinstance(model.get_submodule(path), torch.nn.Linear)
    # proven independently: the fixed program, re-exported, generates the float model's tokens
    options = {"int8_module_paths": tuple(fix["int8"]), "exclude_module_paths": tuple(fix["float"])}
    fixed = _export(model, RECIPE, options, llm_export_args(model), etrecord=False)
    assert _free_running(fixed.buffer, prompt, TOKENS) == want
    step = result.fix_step
    assert step.size_bytes == len(fixed.buffer) and step.size_bytes > result.baseline.size_bytes
    assert step.logits_sqnr_db > result.baseline.logits_sqnr_db
    assert lines[0].startswith("baseline:") and "re-export 1:" in lines[1]
    assert "(proven)" in result.summary() and PLANTED in result.summary()
    # the float margin: an independent top-2 over the float logits
    model.reset_cache()
    with torch.no_grad():
        from edgetorch.models.generation import greedy_generate_with_logits

        rows = torch.stack(greedy_generate_with_logits(model.prefill, model.decode, prompt, TOKENS).step_logits)
    top = rows.sort(-1, descending=True).values
    want_margin = ((top[:, 0] - top[:, 1]) / rows.std(-1)).min()
    assert result.float_margin[0] == pytest.approx(float(want_margin), rel=1e-4)


def test_ranking_puts_the_abnormal_layer_before_its_downstream_victim():
    """The planted layer's own error is out of line (own SQNR far below the others'); the layer downstream of it
    inherits a larger share of the logit error but its own SQNR is normal: the planted one is ranked first. A
    clean spread of own SQNRs (int4 layers within a few dB) flags no layer."""
    import pandas as pd

    from edgetorch.devtools.inspector.quantized_generation import abnormal_layers, layer_ranking
    from edgetorch.workflows.generation_fix import _ranking

    own = {"q": 27.0, "k": 26.5, "v": 9.0, "o": 25.5, "w1": 27.5, "w2": 26.0, "output": 24.0}
    share = {"q": 0.01, "k": 0.01, "v": 0.3, "o": 0.9, "w1": 0.02, "w2": 0.05, "output": 0.6}
    rows = [{"execution": e, "layer": p, "local_sqnr_db": own[p] - (12 if p == "o" else 0),
             "own_sqnr_db": own[p] + d, "logit_share": share[p]} for e, d in ((0, -0.5), (1, 0.5)) for p in own]
    df = pd.DataFrame(rows)
    df.attrs["ranking"] = ranking = layer_ranking(df)
    assert ranking.index[0] == "v" and ranking["v"] == pytest.approx(9.0)
    df.attrs["abnormal"] = abnormal_layers(ranking)
    assert df.attrs["abnormal"] == ["v"]
    assert _ranking(df)[:3] == ["v", "o", "output"]  # then by share
    clean = pd.Series({p: v for p, v in own.items() if p != "v"}).sort_values()
    assert abnormal_layers(clean) == []
    assert abnormal_layers(pd.Series({"a": 1.0, "b": 20.0})) == []  # too few layers to judge
    # the fix: the abnormal layer goes to float at once (its outliers ruin int8 per-channel scales too), the
    # next worst to int8; kept layers stay kept (cumulative sets), within top
    from edgetorch.workflows.generation_fix import _next_kept

    assert _next_kept(["v", "o", "output"], [], [], "int8", 2, 8, ["v"]) == (["o"], ["v"])
    assert _next_kept(["o", "output", "q"], ["o"], ["v"], "int8", 1, 8, []) == (["o", "output"], ["v"])
    assert _next_kept(["o", "output", "q"], ["o"], ["v"], "float", None, None, []) == (["o"], ["v", "output", "q"])
    assert _next_kept(["o", "output", "q"], ["o"], ["v"], "int8", None, 3, []) == (["o", "output"], ["v"])
    assert _next_kept(["o"], [], [], "int8", 1, 0, []) is None  # nothing left within top
    assert _next_kept(["o"], ["o"], [], "int8", 1, None, []) is None  # nothing left to add
    # a layer at int8 whose int8 op is abnormal moves to float, beside the width's new layers
    assert _next_kept(["o", "q", "k"], ["o"], ["v"], "int8", 1, None, ["o"]) == (["q"], ["v", "o"])
    assert _next_kept(["o"], ["o"], [], "int8", 1, None, ["o"]) == ([], ["o"])


LAYERS = ["a", "b", "c", "d", "e", "f", "g", "h"]


def _fake_search(monkeypatch, agreement, rankings, **kwargs):
    """find_generation_fix with exporting and measuring replaced: ``agreement(int8, float)`` gives each program's
    agreement (its logits SQNR grows with the layers kept), ``rankings[reexport]`` its ranking."""
    from edgetorch.workflows import generation_fix as gf

    calls = []

    def step(model, prompt, ref, recipe_type, options, export_args, reexport, int8, flt, rank):
        calls.append((list(int8), list(flt), rank))
        agree = agreement(set(int8), set(flt))
        s = gf.GenerationStep(reexport, list(int8), list(flt), agree, TOKENS, 10.0 + len(int8) + 2 * len(flt),
                              100 + len(int8) + 4 * len(flt), 1.0, near_tie_agreement=agree)
        if rank and agree < TOKENS:
            s.ranking = list(rankings[reexport])
            s.abnormal = ["a"] if reexport == 0 else []
        return s

    monkeypatch.setattr(gf, "_step", step)
    monkeypatch.setattr(gf, "_float_reference", lambda m, p, n: (list(range(n)), torch.randn(n, 8)))
    result = gf.find_generation_fix(torch.nn.Linear(1, 1), torch.zeros(1, 4, dtype=torch.long), RECIPE,
                                    tokens=TOKENS, method_inputs={}, **kwargs)
    return result, calls


def test_search_keeps_cumulative_sets_and_draws_from_the_best_program(monkeypatch):
    """The planted (abnormal) layer alone is not enough; the program with two more layers is worse (a near tie
    flips), so the next step draws from the better first fix's ranking, not the worse program's, and keeps
    every layer kept so far: agreement is restored at the third re-export, with b..e kept."""

    def agreement(int8, flt):
        if "a" not in flt:
            return 3
        return TOKENS if {"b", "c", "d", "e"} <= int8 else (10 if int8 else 20)

    rankings = {0: LAYERS, 1: ["b", "c", "d", "e", "f", "g", "h"], 2: ["h", "g", "f", "e", "d"]}  # 2: the worse's
    result, calls = _fake_search(monkeypatch, agreement, rankings)
    assert [c[:2] for c in calls] == [([], []), ([], ["a"]), (["b", "c"], ["a"]),
                                      (["b", "c", "d", "e", "f", "g"], ["a"])]  # re-export 2's ranking: no d
    assert result.proven and result.reexports == 3 and result.fix == {"int8": calls[3][0], "float": ["a"]}
    assert [s.agreement for s in result.steps] == [3, 20, 10, TOKENS] and result.best is result.steps[3]


def test_search_last_step_keeps_every_layer_left_and_reports_the_best(monkeypatch):
    """No cap: the last re-export the budget allows keeps every ranked layer; a cap (top) bounds it. Without a
    fix the best program (most agreeing tokens, then SQNR) is reported, not the last."""
    every = set(LAYERS) - {"a"}
    result, calls = _fake_search(monkeypatch, lambda i8, f: TOKENS if i8 == every else (12 if i8 else 5),
                                 {0: LAYERS, 1: LAYERS, 2: LAYERS[::-1]}, max_reexports=3)
    assert result.proven and set(calls[3][0]) == every and calls[3][2] == 0  # the last export is not ranked
    assert calls[2][0] == ["b", "c"]
    result, calls = _fake_search(monkeypatch, lambda i8, f: TOKENS if i8 == every else (12 if "b" in i8 else 5),
                                 {0: LAYERS, 1: LAYERS, 2: LAYERS}, max_reexports=3, top=4)
    assert not result.proven and len(calls[3][0]) + len(calls[3][1]) == 4
    assert result.best is result.steps[3]  # 12 tokens, ties step 2 but a higher SQNR
    assert "best: re-export 3, 12/32 tokens" in result.summary()
    with pytest.raises(InspectorError, match="top"):
        _fake_search(monkeypatch, lambda i8, f: 0, {}, top=0)


def test_near_tie_agreement_counts_beside_the_strict_count():
    """A step whose float top-2 margin is below the program's RMS logit error counts as a near tie; an
    independent computation of both counts."""
    import numpy as np

    from edgetorch.workflows.generation_fix import _agreement, near_tie_agreement

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(6, 16, generator=g) * 3
    ref[2, 5], ref[2, 6] = 20.0, 19.95  # a near tie at step 2
    ref[4, 7], ref[4, 8] = 20.0, 15.0  # a clear choice at step 4
    got = ref + 0.2 * torch.randn(6, 16, generator=g)
    got[2, 6] = got[2, 5] + 0.1  # the program flips the near tie
    got[4, 8] = got[4, 7] + 0.1  # and the clear choice
    tokens = ref.argmax(-1).tolist()
    r, p = ref.numpy().astype(np.float64), got.numpy().astype(np.float64)
    srt = np.sort(r, -1)
    margin, rms = srt[:, -1] - srt[:, -2], np.sqrt(((p - r) ** 2).mean(-1))
    assert margin[2] < rms[2] and margin[4] > rms[4]
    assert _agreement(got, tokens) == 2
    assert near_tie_agreement(got, ref, tokens) == 4
    assert near_tie_agreement(ref, ref, tokens) == 6
