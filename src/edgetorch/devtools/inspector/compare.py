"""``compare_results``: per-output SNR, MSE and cosine similarity between a reference output and a run's output,
with the reference ExecuTorch's signature and result shape (``{"snr" | "mse" | "cosine_similarity": [value per
output, rounded to 2 decimals]}``), computed with edgetorch's comparators."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

import torch

from edgetorch.devtools.inspector.comparators import CosineComparator, MSEComparator, SNRComparator
from edgetorch.errors import InspectorError

__all__ = ["METRICS", "compare_results"]

METRICS = {"snr": SNRComparator, "mse": MSEComparator, "cosine_similarity": CosineComparator}


def _flat(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    raise InspectorError(f"compare_results compares tensors (or lists of them), got {type(x).__name__}")


def compare_results(reference_output: Any, run_output: Any, metrics: Sequence[str] | None = None,
                    plot: bool = False, file: IO[str] = sys.stdout) -> dict[str, list[float]]:
    """Per output pair: each metric of ``metrics`` (default all of ``METRICS``), rounded to 2 decimals; prints the
    table to ``file`` (``plot=True`` plots it with matplotlib instead). ``InspectorError`` for an unknown metric
    or when the outputs do not pair up (their counts, or a pair's element counts, differ)."""
    names = list(METRICS) if metrics is None else [str(m).strip().lower() for m in metrics]
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise InspectorError(f"unknown metric(s) {unknown}; use {sorted(METRICS)}")
    refs, runs = _flat(reference_output), _flat(run_output)
    if len(refs) != len(runs):
        raise InspectorError(f"{len(refs)} reference output(s) but {len(runs)} run output(s)")
    results: dict[str, list[float]] = {}
    for m in names:
        cmp = METRICS[m]()
        try:
            results[m] = [round(cmp.compare(a, b), 2) for a, b in zip(refs, runs)]
        except ValueError as e:
            raise InspectorError(f"compare_results: {e}") from None
    if plot:
        _plot(results)
    else:
        for m, values in results.items():
            print(f"{m}\n{'-' * 20}", file=file)
            for i, v in enumerate(values):
                print(f"{i:<5}{v:>8.5f}", file=file)
            print(file=file)
    return results


def _plot(results: dict[str, list[float]]) -> None:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise InspectorError("compare_results(plot=True) needs matplotlib; use plot=False") from None
    for m, values in results.items():
        plt.figure()
        plt.bar(range(len(values)), values)
        plt.title(m)
        plt.xlabel("output")
    plt.show()
