"""Planted bad layers in low-bit (torchao 8da4w, int4 in groups of 32) LLM programs: is the layer the generation
debugger ranks first the planted one, and does ``find_generation_fix`` restore greedy agreement with the float
model over 32 tokens within 4 re-exports? (issue 25)

Three families: the zoo's ``llama_tiny``, and tiny Hugging Face ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` built
from configs (``edgetorch.models.hf``, fixed seeds). Random weights give nearly flat logits whose greedy choice any
rounding flips, so each family is first taught a task with confident answers that needs attention (``a, b, a+1,
b+1, ...``: next token = the one before last + 1, mod vocab; 600 Adam steps of batch 8, seeded): with next =
token + 1 alone the MLPs answer and q/k faults change no token. The prompt is 8 tokens of the task.

A plant (an outlier fault as real LLM weights show them): in every group of 32 input columns of one Linear, the
column whose float input is smallest (mean |x| over the float model's own generation) gets weights of ``k`` x the
weight's largest magnitude (a seeded sign per row): every int4 group's scale grows ``k`` fold and most of its
other 31 weights round to zero, while the float model, whose input barely reaches that column, keeps its answers.
``k`` is the first of 4, 8, 16, 32 whose 8da4w program agrees with its float model on fewer leading tokens than
the clean model's 8da4w program does (of 32): the plant is *effective*. A plant no factor makes effective is
reported as not effective (counted and printed, not dropped).
Sites cycle over q/k/v/o/gate/up/down (zoo: wq/wk/wv/wo/w1/w3/w2) and both decoder layers.

``top1``: the fix's ranking of the baseline program (the layers whose own error is abnormal first, then mean logit
share, from ``Inspector.quantized_generation_table``) names the planted layer first; ``abnormal``: the layers the
table flags (``attrs["abnormal"]``: own SQNR, the quantized op on the float model's own input, far below the
other layers'). ``fixed``: a re-export restored agreement over the 32 tokens (the strict count: every greedy
token equal to the float model's); ``reexports``: how many it took; ``kept``: how many layers each export keeps
at int8 / in float; ``near_tie``: beside it, never instead, each export's ``near_tie_agreement`` (a step whose
float top-2 margin is below the program's RMS logit error also counts); ``float margin``: the float model's
smallest top-2 margin in logit standard deviations, and its step. ``--top`` caps the layers a fix may keep
(default: no cap, the API's default).
Per family, the un-planted (clean) model is ranked too: no layer of it may be flagged abnormal (its own SQNRs are
printed: lowest, median, the abnormal limit).

Usage: ``python bench/bench_planted_lowbit.py [--families llama_tiny,hf_llama,hf_qwen2] [--plants 8]
[--json out.json]``. One line per plant as it ends, one line per family, a summary.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time
import warnings
from typing import Any

import torch

FAMILIES = ("llama_tiny", "hf_llama", "hf_qwen2")
SITES = {  # module paths, {} = the decoder layer: q, k, v, o, gate, up, down
    "llama_tiny": ["layers.{}.attention.wq", "layers.{}.attention.wk", "layers.{}.attention.wv",
                   "layers.{}.attention.wo", "layers.{}.feed_forward.w1", "layers.{}.feed_forward.w3",
                   "layers.{}.feed_forward.w2"],
    "hf": ["model.model.layers.{}.self_attn.q_proj", "model.model.layers.{}.self_attn.k_proj",
           "model.model.layers.{}.self_attn.v_proj", "model.model.layers.{}.self_attn.o_proj",
           "model.model.layers.{}.mlp.gate_proj", "model.model.layers.{}.mlp.up_proj",
           "model.model.layers.{}.mlp.down_proj"],
}
FACTORS = (4, 8, 16, 32)
GROUP = 32


def _caches(model: torch.nn.Module, batch: int) -> None:
    """Every KV cache buffer of the zoo model replaced by zeros of batch size ``batch``."""
    for mod in model.modules():
        for b in list(mod._buffers):
            if "cache" in b and mod._buffers[b] is not None:
                old = mod._buffers[b]
                mod._buffers[b] = torch.zeros((batch, *old.shape[1:]), dtype=old.dtype)


def task(starts: torch.Tensor, length: int) -> torch.Tensor:
    """Sequences ``a, b, a + 1, b + 1, a + 2, ...`` (mod 256) from ``starts`` ``(B, 2)``: each next token is the one
    before last plus one, so the answer needs attention (a q/k/v/o fault changes it), not only the MLPs."""
    t = torch.arange(length)
    return (starts.gather(1, (t % 2).expand(starts.shape[0], -1)) + t // 2) % 256


def train(model: torch.nn.Module, hf: bool, steps: int, seq: int = 40, batch: int = 8, seed: int = 0) -> float:
    """Adam on :func:`task` (seeded), the loss on positions >= 4; returns the last loss."""
    g = torch.Generator().manual_seed(seed)
    net = model.model if hf else model
    vocab = net.config.vocab_size
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    net.train()
    loss = torch.zeros(())
    for _ in range(steps):
        ids = task(torch.randint(vocab, (batch, 2), generator=g), seq + 1)
        if hf:
            logits = net(input_ids=ids[:, :-1], use_cache=False).logits
        else:
            _caches(model, batch)
            logits = model(ids[:, :-1], torch.arange(seq))
        loss = torch.nn.functional.cross_entropy(logits[:, 4:].reshape(-1, vocab), ids[:, 5:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    if not hf:  # a Hugging Face static cache's tensors are held by its StaticCache too: never replaced
        _caches(model, 1)
    for p in model.parameters():
        p.requires_grad_(False)
    return float(loss.detach())


def build(family: str, steps: int) -> tuple[torch.nn.Module, torch.Tensor, float]:
    """The trained model of ``family``, its prompt (8 tokens of the task, seeded starts) and its last loss."""
    from edgetorch.models import hf
    from edgetorch.models.llama import build_llama_tiny

    if family == "llama_tiny":
        model = build_llama_tiny()
    else:
        model = hf.build_hf_llama_static() if family == "hf_llama" else hf.build_hf_qwen2_static()
    loss = train(model, family != "llama_tiny", steps)
    model.reset_cache()
    prompt = task(torch.randint(256, (1, 2), generator=torch.Generator().manual_seed(7)), 8)
    return model.eval(), prompt, loss


def input_magnitude(model: torch.nn.Module, path: str, prompt: torch.Tensor, tokens: int) -> torch.Tensor:
    """Mean |x| per input column of Linear ``path`` over the float model's greedy generation of ``tokens``."""
    from edgetorch.models.generation import greedy_generate

    acc: list[torch.Tensor] = []
    hook = model.get_submodule(path).register_forward_hook(
        lambda _m, args, _o: acc.append(args[0].detach().abs().reshape(-1, args[0].shape[-1]).sum(0)))
    try:
        model.reset_cache()
        with torch.no_grad():
            greedy_generate(model.prefill, model.decode, prompt, tokens)
    finally:
        hook.remove()
        model.reset_cache()
    return torch.stack(acc).sum(0)


def plant(model: torch.nn.Module, path: str, factor: float, magnitude: torch.Tensor, seed: int) -> list[int]:
    """Outliers of ``factor`` x the largest weight, one column per group of 32 (its quietest input column), a
    seeded sign per row; returns the columns."""
    w = model.get_submodule(path).weight
    cols = [g + int(magnitude[g:g + GROUP].argmin()) for g in range(0, w.shape[1], GROUP)]
    sign = torch.randint(2, (w.shape[0], 1), generator=torch.Generator().manual_seed(seed)).float() * 2 - 1
    with torch.no_grad():
        w[:, cols] = factor * w.abs().max() * sign
    return cols


def _case(base: torch.nn.Module, prompt: torch.Tensor, path: str, seed: int, clean: int,
          args: argparse.Namespace) -> dict[str, Any]:
    from edgetorch.export import PortableRecipeType
    from edgetorch.workflows.generation_fix import find_generation_fix

    t0 = time.perf_counter()
    magnitude = input_magnitude(base, path, prompt, args.tokens)
    for factor in FACTORS:  # the first factor that changes a token the clean program generated
        model = copy.deepcopy(base)
        cols = plant(model, path, factor, magnitude, seed)
        r = find_generation_fix(model, prompt, PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR,
                                tokens=args.tokens, max_reexports=args.max_reexports, top=args.top)
        if r.baseline.agreement < clean:
            break
    fix, b = r.fix_step, r.baseline
    own = b.own_sqnr_db
    return {"path": path, "factor": factor, "columns": cols, "effective": b.agreement < clean,
            "top1": bool(r.ranking) and r.ranking[0] == path, "ranked": r.ranking[:3], "abnormal": b.abnormal,
            "own_sqnr_planted": round(own.get(path, math.nan), 1),
            "own_sqnr_median": round(statistics.median(own.values()), 1) if own else None,
            "baseline_agreement": b.agreement, "fixed": r.proven, "reexports": r.reexports,
            "agreement": [s.agreement for s in r.steps], "near_tie": [s.near_tie_agreement for s in r.steps],
            "kept": [len(s.int8) + len(s.float) for s in r.steps], "fix": r.fix,
            "float_margin_std": round(r.float_margin[0], 3), "float_margin_step": r.float_margin[1],
            "size_ratio": round(fix.size_bytes / b.size_bytes, 3) if fix else None,
            "sqnr": [round(s.logits_sqnr_db, 1) for s in r.steps], "seconds": round(time.perf_counter() - t0, 1)}


def clean_check(base: torch.nn.Module, prompt: torch.Tensor, tokens: int) -> dict[str, Any]:
    """The un-planted model's baseline program ranked: the layers flagged abnormal (should be none) and its own
    SQNRs (lowest, median, the abnormal limit)."""
    from edgetorch.devtools.inspector.quantized_generation import ABNORMAL_DB, ABNORMAL_MADS
    from edgetorch.export import PortableRecipeType
    from edgetorch.workflows.generation_fix import (
        _export,
        _float_reference,
        llm_export_args,
        measure_program,
        rank_layers,
    )

    recipe = PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR
    ref = _float_reference(base, prompt, tokens)
    et = _export(base, recipe, {}, llm_export_args(base), etrecord=True)
    agreement = measure_program(et.buffer, prompt, *ref)[0]
    _, own, abnormal = rank_layers(et, base, prompt, ref[0][:8])
    vals = list(own.values())
    med = statistics.median(vals)
    mad = statistics.median(abs(v - med) for v in vals)
    return {"agreement": agreement, "abnormal": abnormal, "lowest": (next(iter(own)), round(vals[0], 1)),
            "median": round(med, 1), "limit": round(med - max(ABNORMAL_DB, ABNORMAL_MADS * 1.4826 * mad), 1)}


def _family_line(family: str, cases: list[dict[str, Any]], clean: dict[str, Any]) -> str:
    hurt = [c for c in cases if c["effective"]]
    fixed = [c for c in hurt if c["fixed"]]
    re = [c["reexports"] for c in fixed]
    return (f"{family}: planted {len(cases)}, effective {len(hurt)}; planted named first "
            f"{sum(c['top1'] for c in hurt)}/{len(hurt)}, agreement restored {len(fixed)}/{len(hurt)} (keeping <= 8 "
            f"layers {sum(c['kept'][-1] <= 8 for c in fixed)}), max "
            f"re-exports {max(re, default=0)} ({sorted(re)}); clean model: {clean['agreement']}/32 agree, "
            f"abnormal {clean['abnormal'] or 'none'}, lowest own SQNR {clean['lowest'][1]} dB "
            f"({clean['lowest'][0]}), median {clean['median']} dB, abnormal below {clean['limit']} dB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--plants", type=int, default=8, help="plants per family")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--max-reexports", type=int, default=4)
    p.add_argument("--top", type=int, default=None, help="most layers a fix may keep (default: no limit)")
    p.add_argument("--train-steps", type=int, default=600)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    lines = []
    for family in args.families.split(","):
        base, prompt, loss = build(family, args.train_steps)
        print(f"{family}: trained {args.train_steps} steps, loss {loss:.3f}", flush=True)
        clean = clean_check(base, prompt, args.tokens)
        sites = SITES["llama_tiny" if family == "llama_tiny" else "hf"]
        cases = []
        for i in range(args.plants):
            path = sites[i % len(sites)].format((i % len(sites) + i // len(sites)) % 2)
            c = _case(base, prompt, path, i, clean["agreement"], args)
            cases.append(c)
            print(f"  {family} {path} x{c['factor']}: {'effective' if c['effective'] else 'NOT effective'}, "
                  f"baseline {c['baseline_agreement']}/{args.tokens}, own SQNR {c['own_sqnr_planted']} dB (median "
                  f"{c['own_sqnr_median']}), abnormal {c['abnormal']}, ranked {c['ranked']}, top1 {c['top1']}, "
                  f"fixed {c['fixed']} in {c['reexports']} re-export(s) {c['fix']} agreement {c['agreement']} "
                  f"(near ties counted {c['near_tie']}), kept {c['kept']}, float margin {c['float_margin_std']} std "
                  f"at step {c['float_margin_step']}, "
                  f"size x{c['size_ratio']}, SQNR {c['sqnr']} dB, {c['seconds']} s", flush=True)
        out[family] = {"clean": clean, "cases": cases}
        lines.append(_family_line(family, cases, clean))
        print(lines[-1], flush=True)
    every = [c for f in out.values() for c in f["cases"]]
    hurt = [c for c in every if c["effective"]]
    if hurt:
        fixed = [c for c in hurt if c["fixed"]]
        print(f"summary: {len(every)} plants over {len(out)} families, {len(hurt)} effective: planted named first "
              f"{sum(c['top1'] for c in hurt)}/{len(hurt)} ({sum(c['top1'] for c in hurt) / len(hurt):.0%}), "
              f"agreement over {args.tokens} tokens restored {len(fixed)}/{len(hurt)} "
              f"({len(fixed) / len(hurt):.0%}; keeping <= 8 layers {sum(c['kept'][-1] <= 8 for c in fixed)}, "
              f"{sum(max(c['near_tie']) == args.tokens for c in hurt)}/{len(hurt)} counting near ties), "
              f"max re-exports {max((c['reexports'] for c in fixed), default=0)} "
              f"(budget {args.max_reexports}); clean models flagged abnormal: "
              f"{sum(bool(f['clean']['abnormal']) for f in out.values())}/{len(out)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
