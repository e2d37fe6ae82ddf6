"""``edgetorch generate``: an LLM on the runtime, token by token.

Exports a zoo decoder (``llama_tiny`` by default) as ``prefill`` (dynamic prompt length) + ``decode`` (one token)
methods sharing a static KV cache, lowers it (portable or ONNX Runtime), saves the ``.pte`` (and its ETRecord),
generates ``--tokens`` tokens greedily on the runtime, the same with eager PyTorch, and prints both sequences, the
first step where they differ (if any) and the per-token latency. ``--etdump`` records every step (each
``execute`` is one run block, every intermediate logged) for ``edgetorch inspect`` / the Inspector.
"""

from __future__ import annotations

import argparse
import os
import time

from edgetorch.cli._common import CliError, guarded

__all__ = ["LLMS", "add_arguments", "run"]

LLMS = ("llama_tiny", "llama_100m", "llama_1b")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama_tiny", help=f"zoo decoder: {', '.join(LLMS)}")
    p.add_argument("--backend", default="portable", choices=["portable", "onnxruntime"])
    p.add_argument("--prompt-len", type=int, default=8, help="tokens of the seeded prompt")
    p.add_argument("--tokens", type=int, default=16, help="tokens to generate")
    p.add_argument("--out", default="edgetorch-llm", help="folder for the .pte, ETRecord and ETDump")
    p.add_argument("--etdump", action="store_true", help="record every step with its intermediates")
    p.add_argument("--recipe", default=None,
                   help="an export recipe by value (e.g. portable_torchao_8da4w, onnxruntime_torchao_8da4w, "
                        "portable_torchao_int4_weight_only): quantize and lower through it (its backend replaces "
                        "--backend); eager is then the same quantized model in PyTorch")


def _check(args: argparse.Namespace) -> None:
    if args.model not in LLMS:
        raise CliError(f"--model {args.model!r} is not a zoo decoder; choose one of {', '.join(LLMS)}")
    if args.prompt_len < 1 or args.tokens < 1:
        raise CliError("--prompt-len and --tokens must be at least 1")
    if args.recipe is not None and _recipe_type(args.recipe) is None:
        raise CliError(f"--recipe {args.recipe!r} is not a recipe; choose one of {', '.join(_recipe_values())}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise CliError(f"--out {args.out} exists and is not a directory")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot create --out {args.out}: {e.strerror}") from None


def _recipe_values() -> list[str]:
    from edgetorch.export import OrtRecipeType, PortableRecipeType

    return [r.value for enum in (PortableRecipeType, OrtRecipeType) for r in enum]


def _recipe_type(value: str):  # noqa: ANN202 - a RecipeType member or None
    from edgetorch.export import OrtRecipeType, PortableRecipeType

    return next((r for enum in (PortableRecipeType, OrtRecipeType) for r in enum if r.value == value), None)


def _lower(model, args: argparse.Namespace):  # noqa: ANN001, ANN202 - (ExecutorchProgramManager, eager module)
    """The program (plain lowering, or the export session of ``--recipe``) and the eager module it should match
    (with a recipe: the quantized module the session exported, which runs the same low-bit kernels)."""
    if args.recipe is None:
        from edgetorch.exir import to_edge_transform_and_lower
        from edgetorch.models.llama import export_llama

        eps = export_llama(model)
        parts = None
        if args.backend == "onnxruntime":
            from edgetorch.backends.onnxruntime import OrtPartitioner

            parts = [OrtPartitioner()]
        print(f"[2/4] lowering ({args.backend}) and emitting", flush=True)
        return to_edge_transform_and_lower(eps, partitioner=parts, generate_etrecord=args.etdump).to_executorch(), model
    from edgetorch.export import ExportRecipe, StageType, export
    from edgetorch.models.llama import llama_dynamic_shapes, llama_method_inputs

    print(f"[2/4] quantizing, lowering and emitting through the recipe {args.recipe}", flush=True)
    one = args.recipe.startswith("onnxruntime")  # decode from the prefill's graph: one ORT session serves both
    inputs = llama_method_inputs(model.config, one_graph=one)
    session = export({"prefill": model, "decode": model}, {k: [v] for k, v in inputs.items()},
                     ExportRecipe.get_recipe(_recipe_type(args.recipe)),
                     dynamic_shapes=llama_dynamic_shapes(model.config, one_graph=one), generate_etrecord=args.etdump)
    eager = session.get_stage_artifacts()[StageType.SOURCE_TRANSFORM].data["decode"]
    return session.get_executorch_program_manager(), eager


def _main(args: argparse.Namespace) -> int:
    _check(args)
    import torch

    from edgetorch.cli._table import Ticker, table_console
    from edgetorch.models import get_spec
    from edgetorch.models.generation import greedy_generate_with_logits
    from edgetorch.models.llama import example_prompt
    from edgetorch.runtime import Runtime

    model = get_spec(args.model).build().eval()
    cfg = model.config
    if args.prompt_len + args.tokens > cfg.max_seq_len:
        raise CliError(f"--prompt-len + --tokens must be at most {cfg.max_seq_len} (the cache length of "
                       f"{args.model})")
    print(f"[1/4] exporting {args.model} as prefill + decode", flush=True)
    float_model = model
    et, model = _lower(model, args)
    pte = os.path.join(args.out, "model.pte")
    et.save(pte)
    prompt = example_prompt(cfg, args.prompt_len)
    if args.etdump:  # before anything runs; the prefill's input lets `inspect --gap` check execution 0 alone
        rec = et.get_etrecord()
        rec.update_representative_inputs({"prefill": [(prompt, torch.arange(args.prompt_len))]})
        rec.save(os.path.join(args.out, "etrecord.bin"))
    print(f"[3/4] generating {args.tokens} tokens on the runtime", flush=True)
    prog = Runtime.get().load_program(pte, enable_etdump=args.etdump,
                                      debug_buffer_size="auto" if args.etdump else 0)
    prefill, decode = prog.load_method("prefill"), prog.load_method("decode")
    t0 = time.perf_counter()
    with Ticker(table_console(), args.tokens, "token") as ticker:
        got = greedy_generate_with_logits(prefill.execute, decode.execute, prompt, args.tokens,
                                          on_token=lambda k, _tok: ticker.tick(k))
    dt = time.perf_counter() - t0
    print("[4/4] the same with eager PyTorch", flush=True)
    with torch.no_grad():
        model.reset_cache()
        want = greedy_generate_with_logits(model.prefill, model.decode, prompt, args.tokens)
    print(f"runtime tokens: {got.tokens}")
    print(f"eager tokens:   {want.tokens}")
    diverged = next((i for i, (a, b) in enumerate(zip(got.tokens, want.tokens)) if a != b), None)
    worst = max((a - b).abs().max().item() for a, b in zip(got.step_logits, want.step_logits))
    print("tokens match eager" if diverged is None else f"tokens differ from step {diverged}",
          f"(largest logit difference {worst:.3e}); {1000 * dt / args.tokens:.2f} ms per token on the runtime")
    if args.recipe is not None:
        _against_float(float_model, prompt, got, args.tokens)
    if args.etdump:
        prog.write_etdump_result_to_file(os.path.join(args.out, "etdump.etdp"),
                                         os.path.join(args.out, "debug_buffer.bin"))
        print(f"ETDump ({args.tokens} runs), debug buffer and ETRecord written to {args.out}")
    return 0 if diverged is None else 1


def _against_float(float_model, prompt, got, tokens: int) -> None:  # noqa: ANN001
    """How far the quantized generation is from the float model's: the first step whose greedy token differs,
    and each step's logits SQNR while the two still read the same tokens."""
    import math

    import torch

    from edgetorch.models.generation import greedy_generate_with_logits

    with torch.no_grad():
        float_model.reset_cache()
        ref = greedy_generate_with_logits(float_model.prefill, float_model.decode, prompt, tokens)
    first = next((i for i, (a, b) in enumerate(zip(got.tokens, ref.tokens)) if a != b), None)
    same = len(got.tokens) if first is None else first + 1  # step `first` still read the same inputs
    sqnr = []
    for a, b in zip(got.step_logits[:same], ref.step_logits[:same]):
        noise = float((a.float() - b.float()).pow(2).sum())
        sqnr.append(math.inf if noise == 0 else 10 * math.log10(float(b.float().pow(2).sum()) / noise))
    print(f"float tokens:   {ref.tokens}")
    agree = "greedy tokens agree with the float model" if first is None else (
        f"the float model's greedy choice differs from step {first}")
    print(f"{agree}; logits SQNR against float per step (same inputs): "
          + ", ".join(f"{v:.1f}" for v in sqnr) + " dB")


def run(args: argparse.Namespace) -> int:
    return guarded(_main, args)
