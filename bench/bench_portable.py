"""Portable runtime latency against eager PyTorch on the zoo models (issue 13: portable <= 1.0x eager).

Usage: python bench/bench_portable.py [--models mobilenet_v2 resnet18 ...] [--runs N] [--threads 1 2] [--int8]

Per model, in one process: export -> to_edge -> to_executorch, load the program, then time
``Method.execute`` and the eager model round-robin (a, b, a, b, ...), at 1 thread pinned to one core and at the
default thread count (all cores). Prints the median of each, the ratio of medians and the range of the
per-pair ratios (25th-75th percentile), so a noisy machine shows as a wide range rather than a wrong figure.
``--int8``: the program is the static per-channel INT8 recipe's (``PortableRecipeType.INT8_STATIC_PER_CHANNEL``,
calibrated on the example input and 7 seeded random ones), still against the float eager model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(__file__))

from _common import threads  # noqa: E402

from edgetorch.exir import to_edge  # noqa: E402
from edgetorch.models import get_spec  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402

DEFAULT_MODELS = ["mlp", "mlp_fp16", "mlp_bf16", "small_cnn", "resnet18", "mobilenet_v2", "transformer_encoder",
                  "vit_b_16", "vit_tiny", "multi_output", "two_method", "llama_tiny"]


def _quantiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def paired(a: Callable[[], object], b: Callable[[], object], runs: int, warmup: int = 3) -> dict[str, float]:
    """Times ``a`` and ``b`` alternately (the order flips every pair); medians and the per-pair ratio range."""
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for i in range(runs):
        for which, f in ((0, a), (1, b)) if i % 2 == 0 else ((1, b), (0, a)):
            t0 = time.perf_counter()
            f()
            (ta if which == 0 else tb).append(time.perf_counter() - t0)
    ratios = [x / y for x, y in zip(ta, tb)]
    lo, hi = _quantiles(ratios)
    return {"a": statistics.median(ta), "b": statistics.median(tb), "lo": lo, "hi": hi}


def _runs_for(seconds_per_call: float, budget: float, runs: int | None) -> int:
    if runs is not None:
        return runs
    return int(max(15, min(400, budget / max(seconds_per_call, 1e-6))))


def _int8_program(model: torch.nn.Module, inputs: tuple, path: str) -> None:
    from edgetorch.export import ExportRecipe, PortableRecipeType, export

    g = torch.Generator().manual_seed(1)
    calib = [inputs] + [tuple(torch.randn(x.shape, generator=g) if x.is_floating_point() else x for x in inputs)
                        for _ in range(7)]
    with open(path, "wb") as f:
        f.write(export(model, calib, ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL))
                .get_pte_buffer())


def bench_model(name: str, thread_counts: list[int], runs: int | None, budget: float, tmp: str,
                int8: bool = False) -> list[str]:
    spec = get_spec(name)
    model = spec.build().eval()
    inputs = spec.example_inputs()["forward"]
    path = os.path.join(tmp, f"{name}.pte")
    if int8:
        _int8_program(model, inputs, path)
    else:
        to_edge(torch.export.export(model, inputs)).to_executorch().save(path)
    method = Runtime.get().load_program(path).load_method("forward")
    lines = []
    for n_threads in thread_counts:
        with threads(n_threads), torch.no_grad():
            t0 = time.perf_counter()
            model(*inputs)
            n = _runs_for(time.perf_counter() - t0, budget, runs)
            r = paired(lambda: method.execute(*inputs), lambda: model(*inputs), n)
        lines.append(f"| {name}{' INT8' if int8 else ''} | {n_threads} | {1000 * r['a']:.3f} | {1000 * r['b']:.3f} | "
                     f"{r['a'] / r['b']:.3f} | {r['lo']:.2f}-{r['hi']:.2f} | {n} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--runs", type=int, default=None, help="pairs per setting (default: fit --budget)")
    ap.add_argument("--budget", type=float, default=6.0, help="seconds of eager time per setting")
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="default: 1 and torch's default")
    ap.add_argument("--int8", action="store_true", help="time the static per-channel INT8 program instead")
    args = ap.parse_args()
    default = torch.get_num_threads()
    threads = args.threads or ([1] if default == 1 else [1, default])
    print("| model | threads | portable ms | eager ms | ratio | pair ratio p25-p75 | pairs |")
    print("|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for line in bench_model(name, threads, args.runs, args.budget, tmp, args.int8):
                print(line, flush=True)


if __name__ == "__main__":
    main()
