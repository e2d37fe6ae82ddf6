"""End-to-end time of ``edgetorch.export.export`` (issue 5: export sessions and recipes).

Usage: python bench/bench_export.py [--model resnet18] [--calibration 8] [--repeat 1]
Times ``export(model, <N calibration inputs>, ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL))``
(target: <= 30 s on ResNet-18 with 8 inputs) and the FP32 recipe, printing each stage's duration, the .pte size,
and the INT8 program's error vs the float eager model on a held-out input.
"""

from __future__ import annotations

import argparse
import time

import torch

from edgetorch.export import ExportRecipe, PortableRecipeType, export
from edgetorch.models import get_spec


def _inputs(x: tuple, n: int, seed: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    if x[0].dtype == torch.int64:
        return [(torch.randint(0, 1000, x[0].shape, generator=g),) for _ in range(n)]
    return [(torch.randn(x[0].shape, generator=g),) for _ in range(n)]


def run(model_name: str, recipe_type: PortableRecipeType, n_inputs: int) -> None:
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
    print(f"{model_name} {recipe_type.name} ({len(samples)} inputs): total {total:.2f}s [{stages}]; "
          f".pte {size / 2**20:.1f} MiB; vs eager: rel max err {rel:.4f}, cosine {cos:.5f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--calibration", type=int, default=8, help="number of example inputs (all calibrate)")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for _ in range(args.repeat):
        run(args.model, PortableRecipeType.INT8_STATIC_PER_CHANNEL, args.calibration)
        run(args.model, PortableRecipeType.FP32, args.calibration)


if __name__ == "__main__":
    main()
