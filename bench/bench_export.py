"""End-to-end time of ``edgetorch.export.export`` (issue 5: export sessions and recipes).

Usage: python bench/bench_export.py [--model resnet18] [--calibration 8] [--repeat 1]
Times ``export(model, <N calibration inputs>, ExportRecipe.get_recipe(OrtRecipeType.INT8_STATIC_PER_CHANNEL))``
(ORT INT8 static; target: <= 30 s on ResNet-18 with 8 inputs), the same on the portable backend, and the FP32
recipes, printing each stage's duration, the .pte size, and each program's error vs the float eager model on a
held-out input. Each export runs first in a fresh process (``--fresh``, the default: one-time costs such as
building the torchlib ONNX registry included), or all in this process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, RecipeType, export
from edgetorch.models import get_spec


def _inputs(x: tuple, n: int, seed: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    if x[0].dtype == torch.int64:
        return [(torch.randint(0, 1000, x[0].shape, generator=g),) for _ in range(n)]
    return [(torch.randn(x[0].shape, generator=g),) for _ in range(n)]


def run(model_name: str, recipe_type: RecipeType, n_inputs: int) -> None:
    spec = get_spec(model_name)
    model, x = spec.build(), spec.example_inputs()["forward"]
    samples = [x] + _inputs(x, n_inputs - 1, 1)
    t0 = time.perf_counter()
    session = export(model, samples, ExportRecipe.get_recipe(recipe_type))
    total = time.perf_counter() - t0
    stages = ", ".join(f"{s.name} {ms / 1000:.2f}s" for s, ms in session.stage_durations_ms.items())
    held_out = _inputs(x, 1, 2)[0]
    with torch.no_grad():
        want = model(*held_out).double()
    got = session.run_method("forward", held_out).double()
    rel = ((got - want).abs().max() / want.abs().max()).item()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    size = session.get_executorch_program_manager().size
    print(f"{model_name} {recipe_type.value} ({len(samples)} inputs): total {total:.2f}s [{stages}]; "
          f".pte {size / 2**20:.1f} MiB; vs eager: rel max err {rel:.4f}, cosine {cos:.5f}", flush=True)


RECIPES = {t.value: t for t in (OrtRecipeType.INT8_STATIC_PER_CHANNEL, PortableRecipeType.INT8_STATIC_PER_CHANNEL,
                                OrtRecipeType.FP32, PortableRecipeType.FP32)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--calibration", type=int, default=8, help="number of example inputs (all calibrate)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--in-process", action="store_true", help="run every export in this process")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        run(args.model, RECIPES[args.one], args.calibration)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for _ in range(args.repeat):
        for name in args.recipes:
            if args.in_process:
                run(args.model, RECIPES[name], args.calibration)
            else:
                subprocess.run([sys.executable, __file__, "--model", args.model, "--calibration",
                                str(args.calibration), "--one", name], check=True)


if __name__ == "__main__":
    main()
