"""Shared helpers of the benchmark scripts: alternating timing against eager PyTorch, medians, RSS."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator

import psutil
import torch


def rss_mb() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / 2**20


def alternate(fns: dict[str, Callable[[], object]], runs: int, warmup: int = 2,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Times each function ``runs`` times, interleaved (a, b, a, b, ...); returns median seconds of ``clock``
    (wall time by default; ``time.thread_time``: the calling thread's CPU time, which a busy machine disturbs
    less)."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, f in fns.items():
            t0 = clock()
            f()
            samples[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def thread_settings() -> list[int]:
    """Thread counts to report: 1 and the default (if different)."""
    default = torch.get_num_threads()
    return [1] if default == 1 else [1, default]


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch runs ``n`` threads inside the block; with 1 thread the process is pinned to one core. Both are
    restored afterwards."""
    default, cores = torch.get_num_threads(), sorted(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    os.sched_setaffinity(0, cores[:1] if n == 1 else cores)
    try:
        yield
    finally:
        torch.set_num_threads(default)
        os.sched_setaffinity(0, cores)
