"""``edgetorch fix --recipe <torchao recipe>``: the mixed-precision fix of a low-bit LLM, proven in tokens
(``edgetorch.workflows.generation_fix``); see ``edgetorch.cli.fix``."""

from __future__ import annotations

import argparse
import time
from typing import Any

from edgetorch.cli._common import CliError

__all__ = ["LLMS", "main"]

LLMS = ("llama_tiny", "llama_100m", "llama_1b", "hf_llama", "hf_qwen2")


def _check(args: argparse.Namespace) -> None:
    if args.model not in LLMS:
        raise CliError(f"--model {args.model!r}: a torchao recipe fixes an LLM; choose one of {', '.join(LLMS)}")
    if args.max_reexports is None:
        args.max_reexports = 4  # find_generation_fix's default: the budget
    for flag in ("tokens", "prompt_len", "max_reexports", "top"):
        if getattr(args, flag) < 1:
            raise CliError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")


def _build(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model and its seeded prompt."""
    if args.model.startswith("hf_"):
        from edgetorch.models import hf

        model = hf.build_hf_llama_static() if args.model == "hf_llama" else hf.build_hf_qwen2_static()
        if args.prompt_len + args.tokens > model.max_cache_len:
            raise CliError(f"--prompt-len + --tokens must be at most {model.max_cache_len} (the cache length)")
        vocab = model.model.config.get_text_config().vocab_size
        return model, hf.hf_method_inputs(vocab, args.prompt_len, seed=args.seed + 7)["prefill"][0]
    from edgetorch.models import get_spec
    from edgetorch.models.llama import example_prompt

    model = get_spec(args.model).build().eval()
    if args.prompt_len + args.tokens > model.config.max_seq_len:
        raise CliError(f"--prompt-len + --tokens must be at most {model.config.max_seq_len} (the cache length "
                       f"of {args.model})")
    return model, example_prompt(model.config, args.prompt_len)


def _plant(model: Any, path: str) -> None:
    import torch

    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if path not in linears:
        raise CliError(f"--outlier {path!r} is not a Linear of the model; e.g. {', '.join(linears[:4])}")
    w = model.get_submodule(path).weight
    with torch.no_grad():
        w[:, 0] = 60 * w.abs().max()


def main(args: argparse.Namespace, recipe: Any) -> int:
    """Runs the generation fix; 0 when agreement is restored (or never lost), 1 when not."""
    _check(args)
    from edgetorch.workflows.generation_fix import find_generation_fix

    model, prompt = _build(args)
    if args.outlier:
        _plant(model, args.outlier)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    say(f"{args.model} with {recipe.value}: prompt of {prompt.shape[1]} tokens, {args.tokens} tokens against the "
        f"float model, keep {args.keep}")
    result = find_generation_fix(model, prompt, recipe, tokens=args.tokens, max_reexports=args.max_reexports,
                                 keep=args.keep, top=args.top, progress=say)
    table = result.to_dataframe()
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(result.summary())
    if result.fix:
        kept = [f"{p} at int8" for p in result.fix["int8"]] + [f"{p} in float" for p in result.fix["float"]]
        print("in the model's modules: keep " + ", ".join(kept))
    return 0 if result.proven or result.baseline.restored else 1
