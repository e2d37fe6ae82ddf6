"""``edgetorch fix``: find the smallest set of ops to keep in float (INT8 recipes) or off the ONNX Runtime delegate
(float ORT recipe) that brings a zoo model's final output within a tolerance of the float model, re-exporting and
re-running each candidate (``edgetorch.workflows.fix.find_fix``).

    edgetorch fix --model resnet18 --recipe portable_int8_static_per_tensor --tolerance 0.1
    edgetorch fix --model mlp --recipe portable_int8_static_per_tensor --outlier fc2.weight --tolerance 0.05

One line per step as it runs (baseline, candidates, each re-export with its final error, latency and size), then
the verdict. ``--outlier PARAM`` plants a weight outlier (60 x the largest magnitude) in one parameter first, the
textbook badly quantized layer. Exit status 0 when the final output is within tolerance (a fix was found and
proven, or none was needed), 1 when no fix was found within ``--max-reexports``.

With a torchao low-bit recipe (``portable_torchao_8da4w``, ``onnxruntime_torchao_int4_weight_only``, ...) the
model is an LLM (``llama_tiny``, ``llama_100m``, ``llama_1b``, or the tiny Hugging Face ``hf_llama`` /
``hf_qwen2``) and the fix is proven in tokens (``edgetorch.workflows.generation_fix.find_generation_fix``): the
layers most responsible for the quantized generation's departure from the float model are kept at int8
(``--keep int8``, default) or in float until the program's greedy tokens agree with the float model's over
``--tokens`` tokens; ``--tolerance`` is not used. ``--outlier PATH`` then names a Linear (module path) whose input
column 0 is set to 60 x its largest weight (every int4 group of that column ruined).

    edgetorch fix --model llama_tiny --recipe portable_torchao_8da4w --tokens 32 --outlier layers.0.attention.wv

Exit status 0 when agreement was restored (or never lost), 1 when not within ``--max-reexports``.
"""

from __future__ import annotations

import argparse

from edgetorch.cli._common import CliError, guarded

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="mlp", help="zoo model (edgetorch.models.list_models()) or your own: a "
                   "Python entry point module:function returning (nn.Module, example inputs)")
    p.add_argument("--recipe", default="portable_int8_static_per_tensor",
                   help="export recipe: portable_int8_static_per_tensor|_per_channel, "
                        "onnxruntime_int8_static_per_tensor|_per_channel, onnxruntime_fp32")
    p.add_argument("--tolerance", type=float, default=None,
                   help="largest relative L2 error of the final output against the float model (required but with "
                        "a torchao recipe)")
    p.add_argument("--samples", type=int, default=4, help="random inputs shaped as the example inputs (seeded)")
    p.add_argument("--max-reexports", type=int, default=None,
                   help="re-export budget of the search (default 5; 4 with a torchao recipe)")
    p.add_argument("--top", type=int, default=8, help="candidates considered, worst first")
    p.add_argument("--outlier", default=None, help="plant a weight outlier in this parameter first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=32,
                   help="torchao recipes: greedy tokens that must agree with the float model")
    p.add_argument("--prompt-len", type=int, default=8, help="torchao recipes: tokens of the seeded prompt")
    p.add_argument("--keep", choices=["int8", "float"], default="int8",
                   help="torchao recipes: keep the responsible layers at int8 weight-only or in float")


def _recipe(name: str):
    from edgetorch.export import OrtRecipeType, PortableRecipeType

    for kind in (PortableRecipeType, OrtRecipeType):
        for member in kind:
            if name in (member.value, member.name.lower()) or name == f"{kind.get_backend_name()}_{member.name}":
                return member
    known = [m.value for k in (PortableRecipeType, OrtRecipeType) for m in k]
    raise CliError(f"--recipe {name!r} is not a recipe; choose one of {', '.join(known)}")


def _samples(inputs: tuple, n: int, seed: int) -> list[tuple]:
    import torch

    g = torch.Generator().manual_seed(seed)

    def like(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.is_floating_point():
            return torch.randn(t.shape, generator=g, dtype=t.dtype)
        hi = int(t.max()) + 1 if t.numel() else 1
        return torch.randint(0, max(hi, 1), t.shape, generator=g, dtype=t.dtype)

    return [tuple(inputs)] + [tuple(like(t) for t in inputs) for _ in range(n - 1)]


def _check(args: argparse.Namespace) -> None:
    from edgetorch.models import list_models

    if args.tolerance is None:
        raise CliError("--tolerance is required (but with a torchao recipe, whose fix is proven in tokens)")
    if ":" not in args.model and args.model not in list_models():
        raise CliError(f"--model {args.model!r} is not a zoo model (or a Python entry point module:function); "
                       f"choose one of {', '.join(list_models())}")
    if not args.tolerance > 0:
        raise CliError(f"--tolerance must be positive, got {args.tolerance}")
    if args.max_reexports is None:
        args.max_reexports = 5
    for flag in ("samples", "max_reexports", "top"):
        if getattr(args, flag) < 1:
            raise CliError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")


def _load_model(spec: str):
    """``(model, example inputs)``: a zoo model, or ``module:function`` (a Python entry point, imported from the
    current directory or the path, called with no argument) returning ``(nn.Module, tuple of inputs)``."""
    import importlib
    import os
    import sys

    import torch

    if ":" not in spec:
        from edgetorch.models import get_model

        return get_model(spec)
    module, _, func = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise CliError(f"--model {spec!r}: cannot load the entry point ({type(e).__name__}: {e})") from e
    got = fn()
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.nn.Module)
            and isinstance(got[1], (tuple, list))):
        raise CliError(f"--model {spec!r}: {func}() must return (torch.nn.Module, tuple of example inputs), got "
                       f"{type(got).__name__}")
    return got[0].eval(), tuple(got[1])


def _module_names(model, inputs: tuple, kept: list[str]) -> list[str]:
    """The fix in the model's terms: each kept node as its module path (``fc2``), the node name in brackets."""
    from edgetorch.exir.quant_annotations import module_paths
    from edgetorch.export.quantizer import capture_float_program
    from edgetorch.workflows.fix import ACTIVATION

    nodes = {n.name: n for n in capture_float_program(model, inputs).graph.nodes}
    out = []
    for k in kept:
        name = k.removeprefix(ACTIVATION)
        paths = [p for p in module_paths(nodes[name]) if p] if name in nodes else []
        what = "output of " if k.startswith(ACTIVATION) else ""
        out.append(f"{what}{paths[-1]} ({name})" if paths else f"{what}{name} (in the model's own forward)")
    return out


def _plant(model, name: str) -> None:
    import torch

    params = dict(model.named_parameters())
    if name not in params:
        raise CliError(f"--outlier {name!r} is not a parameter of the model; e.g. "
                       f"{', '.join(n for n, p in params.items() if p.dim() >= 2)}")
    with torch.no_grad():
        p = params[name]
        p.view(-1)[0] = 60 * p.abs().max()


def _main(args: argparse.Namespace) -> int:
    recipe = _recipe(args.recipe)
    from edgetorch.export.recipes_torchao import TORCHAO_RECIPES

    if recipe.name in TORCHAO_RECIPES:
        from edgetorch.cli._generation_fix import main as generation_fix

        return generation_fix(args, recipe)
    _check(args)
    import time

    from edgetorch.workflows.fix import find_fix

    model, inputs = _load_model(args.model)
    if args.outlier:
        _plant(model, args.outlier)
    samples = _samples(inputs, args.samples, args.seed)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    say(f"{args.model} with {recipe.value}: {len(samples)} sample(s), tolerance {args.tolerance:g}")
    result = find_fix(model, samples, recipe, args.tolerance, max_reexports=args.max_reexports, top=args.top,
                      progress=say)
    table = result.to_dataframe()
    table["kept"] = [", ".join(k) if k else "-" for k in table["kept"]]
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(result.summary())
    if result.fix and result.mode == "quantization":
        print("in the model's modules: keep " + ", ".join(_module_names(model, inputs, result.fix)) + " in float")
    return 0 if result.proven or result.baseline.within else 1


def run(args: argparse.Namespace) -> int:
    return guarded(_main, args)
