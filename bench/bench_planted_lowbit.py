"""Planted bad layers in low-bit (torchao 8da4w, int4 in groups of 32) LLM programs: is the layer the generation
debugger ranks first the planted one, and does ``find_generation_fix`` restore greedy agreement with the float
model over 32 tokens within 4 re-exports? (issue 25)

Three families: the zoo's ``llama_tiny``, and tiny Hugging Face ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` built
from configs (``edgetorch.models.hf``). Random weights give nearly flat logits whose greedy choice any rounding
flips (a random llama_tiny disagrees with itself at 8da4w from the first token, whatever few layers are kept
float), so each family is first taught a task with confident answers: next token = token + 1 (mod vocab), a few
hundred Adam steps (seeded), as a trained LM's greedy choices are confident.

A plant: one input column per group of 32 of one Linear (columns ``c, c + 32, ...``) set to ``k`` x the weight's
largest magnitude: every int4 group's scale grows ``k`` fold and its other 31 weights round to zero. ``k`` is the
first of 16, 32, 64 whose 8da4w program no longer agrees with its float model over the 32 tokens (a plant that
changes no token proves nothing: the trained model's tokens survive much, a column merely multiplied by 8-16 changed
none).
``top1``: the fix's ranking of the baseline program (mean logit share, then mean local SQNR, from
``Inspector.quantized_generation_table``) names the planted layer first; ``top1_local``: the table's own ranking
(mean local SQNR alone) does. ``fixed``: a re-export restored agreement
over the 32 tokens; ``reexports``: how many it took. Plants whose 8da4w program already agrees with their float
model over 32 tokens (the plant did not change a token) are counted apart (``harmless``).

Usage: ``python bench/bench_planted_lowbit.py [--families llama_tiny,hf_llama,hf_qwen2] [--plants 7]
[--json out.json]``. One line per plant as it ends, one line per family, a summary.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from typing import Any

import torch

FAMILIES = ("llama_tiny", "hf_llama", "hf_qwen2")
SITES = {  # (module path relative to the decoder layers, layer index)
    "llama_tiny": ["layers.{}.attention.wv", "layers.{}.attention.wo", "layers.{}.feed_forward.w2",
                   "layers.{}.feed_forward.w1", "layers.{}.feed_forward.w3", "layers.{}.attention.wq",
                   "layers.{}.attention.wk"],
    "hf": ["model.model.layers.{}.self_attn.v_proj", "model.model.layers.{}.self_attn.o_proj",
           "model.model.layers.{}.mlp.down_proj", "model.model.layers.{}.mlp.gate_proj",
           "model.model.layers.{}.mlp.up_proj", "model.model.layers.{}.self_attn.q_proj",
           "model.model.layers.{}.self_attn.k_proj"],
}
FACTORS = (16, 32, 64)


def _fresh_caches(model: torch.nn.Module) -> None:
    for mod in model.modules():
        for b in list(mod._buffers):
            if "cache" in b and mod._buffers[b] is not None:
                mod._buffers[b] = torch.zeros_like(mod._buffers[b]).detach()


def train_successor(model: torch.nn.Module, hf: bool, steps: int, seq: int = 40, seed: int = 0) -> float:
    """Adam on next = (token + 1) % vocab; returns the last loss."""
    g = torch.Generator().manual_seed(seed)
    net = model.model if hf else model
    vocab = net.config.vocab_size
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    net.train()
    loss = torch.zeros(())
    for _ in range(steps):
        ids = (torch.randint(vocab, (8 if hf else 1, 1), generator=g) + torch.arange(seq + 1)) % vocab
        if hf:
            logits = net(input_ids=ids[:, :-1], use_cache=False).logits
        else:
            _fresh_caches(model)
            logits = model(ids[:, :-1], torch.arange(seq))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    if not hf:  # a Hugging Face static cache's tensors are held by its StaticCache too: never replaced
        _fresh_caches(model)
    for p in model.parameters():
        p.requires_grad_(False)
    return float(loss.detach())


def build(family: str, steps: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The trained model of ``family`` and its prompt (8 seeded tokens)."""
    from edgetorch.models import hf
    from edgetorch.models.llama import build_llama_tiny

    if family == "llama_tiny":
        model = build_llama_tiny()
    else:
        model = hf.build_hf_llama_static() if family == "hf_llama" else hf.build_hf_qwen2_static()
    train_successor(model, family != "llama_tiny", steps)
    model.reset_cache()
    vocab = model.config.vocab_size if family == "llama_tiny" else model.model.config.vocab_size
    return model.eval(), torch.randint(vocab, (1, 8), generator=torch.Generator().manual_seed(7))


def plant(model: torch.nn.Module, path: str, factor: float, column: int) -> None:
    w = model.get_submodule(path).weight
    with torch.no_grad():
        w[:, column % 32::32] = factor * w.abs().max()


def _case(base: torch.nn.Module, prompt: torch.Tensor, path: str, column: int,
          args: argparse.Namespace) -> dict[str, Any]:
    from edgetorch.export import PortableRecipeType
    from edgetorch.workflows.generation_fix import find_generation_fix

    t0 = time.perf_counter()
    for factor in FACTORS:  # the first factor that changes a token
        model = copy.deepcopy(base)
        plant(model, path, factor, column)
        r = find_generation_fix(model, prompt, PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR,
                                tokens=args.tokens, max_reexports=args.max_reexports)
        if not r.baseline.restored:
            break
    fix = r.fix_step
    return {"path": path, "factor": factor, "column": column, "harmless": r.baseline.restored,
            "top1": bool(r.ranking) and r.ranking[0] == path, "ranked": r.ranking[:3],
            "top1_local": bool(r.baseline.local_ranking) and r.baseline.local_ranking[0] == path,
            "baseline_agreement": r.baseline.agreement, "fixed": r.proven, "reexports": r.reexports,
            "fix": r.fix, "size_ratio": fix.size_bytes / r.baseline.size_bytes if fix else None,
            "sqnr": [round(s.logits_sqnr_db, 1) for s in r.steps], "seconds": round(time.perf_counter() - t0, 1)}


def _family_line(family: str, cases: list[dict[str, Any]]) -> str:
    hurt = [c for c in cases if not c["harmless"]]
    fixed = [c for c in hurt if c["fixed"]]
    re = [c["reexports"] for c in fixed]
    return (f"{family}: {len(cases)} plants, {len(cases) - len(hurt)} harmless; of {len(hurt)} harmful: planted "
            f"named first {sum(c['top1'] for c in hurt)}/{len(hurt)}, agreement restored {len(fixed)}/{len(hurt)}"
            f" (re-exports {sorted(re)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--plants", type=int, default=8, help="plants per family")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--max-reexports", type=int, default=4)
    p.add_argument("--train-steps", type=int, default=150)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    out: dict[str, list[dict[str, Any]]] = {}
    for family in args.families.split(","):
        base, prompt = build(family, args.train_steps)
        sites = SITES["llama_tiny" if family == "llama_tiny" else "hf"]
        cases = []
        for i in range(args.plants):
            path = sites[i % len(sites)].format(i % 2)
            in_features = base.get_submodule(path).weight.shape[1]
            c = _case(base, prompt, path, (7 * i + 3) % in_features, args)
            cases.append(c)
            print(f"  {family} {path} x{c['factor']} col {c['column']}: baseline {c['baseline_agreement']}/"
                  f"{args.tokens}, ranked {c['ranked']}, top1 {c['top1']} (local {c['top1_local']}), fixed "
                  f"{c['fixed']} in {c['reexports']} "
                  f"re-export(s) {c['fix']}, size x{c['size_ratio']}, SQNR {c['sqnr']} dB, {c['seconds']} s",
                  flush=True)
        out[family] = cases
        print(_family_line(family, cases), flush=True)
    every = [c for cs in out.values() for c in cs if not c["harmless"]]
    if every:
        print(f"summary: {len(every)} harmful plants over {len(out)} families: planted named first "
              f"{sum(c['top1'] for c in every) / len(every):.0%}, agreement over {args.tokens} tokens restored "
              f"{sum(c['fixed'] for c in every) / len(every):.0%} with <= {args.max_reexports} re-exports")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
