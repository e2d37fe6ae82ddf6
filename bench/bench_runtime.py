"""Runtime latency vs eager PyTorch, load time and compile time (issue: compiler and runtime core).

Usage: python bench/bench_runtime.py [--models mlp small_cnn resnet18 vit_b_16] [--runs N]
For each model: export -> to_edge -> to_executorch (timed), save the .pte, load it from disk (timed, RSS
measured), then time ``Method.execute`` and the eager model alternately (medians) at 1 thread and at the
default thread count (1-thread runs pinned to one core). bench/bench_portable.py covers every zoo model.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import alternate, rss_mb, thread_settings, threads  # noqa: E402

from edgetorch.exir import to_edge  # noqa: E402
from edgetorch.models import get_spec  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402


def bench_model(name: str, runs: int, tmp: str) -> list[str]:
    spec = get_spec(name)
    model = spec.build()
    inputs = spec.example_inputs()["forward"]
    t0 = time.perf_counter()
    ep = torch.export.export(model, inputs)
    t1 = time.perf_counter()
    epm = to_edge(ep)
    t2 = time.perf_counter()
    et = epm.to_executorch()
    t3 = time.perf_counter()
    path = os.path.join(tmp, f"{name}.pte")
    et.save(path)
    del et, epm, ep
    rss0 = rss_mb()
    t4 = time.perf_counter()
    program = Runtime.get().load_program(path)
    method = program.load_method("forward")
    t5 = time.perf_counter()
    rss1 = rss_mb()
    lines = [f"{name}: export {t1 - t0:.2f}s, to_edge {t2 - t1:.2f}s, to_executorch {t3 - t2:.2f}s "
             f"(total {t3 - t0:.2f}s); load_program+load_method {1000 * (t5 - t4):.1f} ms, "
             f"RSS +{rss1 - rss0:.1f} MB (arena {method.metadata.arena_bytes / 2**20:.1f} MB, "
             f"file {os.path.getsize(path) / 2**20:.1f} MB)"]
    for n_threads in thread_settings():
        with threads(n_threads), torch.no_grad():
            med = alternate({"eager": lambda: model(*inputs), "edgetorch": lambda: method.execute(*inputs)},
                            runs)
        lines.append(f"  threads={n_threads}: eager {1000 * med['eager']:.3f} ms, edgetorch "
                     f"{1000 * med['edgetorch']:.3f} ms, ratio {med['edgetorch'] / med['eager']:.3f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=["mlp", "small_cnn", "resnet18", "vit_b_16"])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            runs = args.runs if get_spec(name).slow else args.runs * 20
            for line in bench_model(name, runs, tmp):
                print(line, flush=True)


if __name__ == "__main__":
    main()
