"""Numeric gaps over many inputs, streamed: per-op mean / max / p99 and the stability of the culprit ranking.

One input decides nothing about data-dependent error (quantization, an input-dependent kernel fault). Here the
program is loaded once with an ETDump tracer and a debug buffer; for each sample it is run, its intermediates are
compared with the reference program run on the same sample (``Inspector.calculate_numeric_gap(inputs=...)``),
the per-row numbers are kept and the sample's tensors dropped (the tracer is cleared and its debug buffer
rewound), so memory is bounded by one sample's intermediates plus a few floats per row and sample.

Result: one row per op group, in execution order, with the first sample's identifying columns (``aot_ops``,
``runtime_ops``, ``source``, ``module``, ``delegate``, ``noise_floor`` ...), and for each of ``gap``,
``local_gap``, ``rel_error`` and ``local_rel_error``: ``<name>_mean``, ``<name>_max`` and ``<name>_p99`` (float
rows; exact rows use the mismatch fraction). ``gap`` / ``local_gap`` / ``rel_error`` / ``local_rel_error`` /
``verdict`` hold the worst sample's values, so ``find_culprits`` works on the aggregate (the worst case over the
samples). Ranking stability: ``culprit_frequency`` (fraction of samples in which the row is a culprit),
``top1_frequency`` (fraction where it is the first culprit), ``mean_culprit_rank`` (its mean rank among the
culprits of the samples that name it). ``df.attrs``: ``samples`` (N), ``rank_stability`` (mean Jaccard
similarity between each sample's top-k culprit set and the aggregate's; 1.0 when every sample names the same
culprits, also when none names any), ``top1_agreement`` (fraction of samples whose first culprit is the most
frequent first culprit; None when no sample names one), ``noise_model``, ``distance``, ``method``.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd
import torch.utils._pytree as pytree

from edgetorch.devtools.inspector.culprits import find_culprits
from edgetorch.devtools.inspector.noise import verdict
from edgetorch.errors import InspectorError

__all__ = ["STATS", "samples_of", "numeric_gap_over_samples"]

STATS = ("gap", "local_gap", "rel_error", "local_rel_error")
_KEEP = ("aot_debug_handle", "aot_ops", "runtime_ops", "kind", "runtime_debug_handle", "metric", "dtype", "source",
         "module", "instruction_id", "delegate", "in_delegate_call", "shape", "ref_handle", "noise_floor",
         "stacktraces")


def _val(v: Any) -> float:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return math.nan if v is None else float(v)


def samples_of(samples: Any, method: str) -> Iterable[tuple]:
    """Input tuples from an iterable of tuples (or single tensors) or a ``BundledProgram`` (its test suite for
    ``method``)."""
    suites = getattr(samples, "method_test_suites", None)
    if suites is not None:
        for s in suites:
            if s.method_name == method:
                return (tuple(tc.inputs) for tc in s.test_cases)
        raise InspectorError(f"samples: the bundled program has no test suite for method '{method}'")
    if samples is None or isinstance(samples, (str, bytes)) or not hasattr(samples, "__iter__"):
        raise InspectorError(f"samples must be an iterable of input tuples or a BundledProgram, got "
                             f"{type(samples).__name__}")
    return (s if isinstance(s, (tuple, list, dict)) else (s,) for s in samples)


def _load(program: Any, debug_buffer_path: str) -> Any:
    from edgetorch.runtime import Runtime

    buf = getattr(program, "program_buffer", None)  # a BundledProgram
    if buf is not None:
        program = buf
    elif hasattr(program, "buffer") and not isinstance(program, (bytes, bytearray, memoryview)):
        program = program.buffer  # an ExecutorchProgramManager
    if not isinstance(program, (str, os.PathLike, bytes, bytearray, memoryview)):
        raise InspectorError(f"program must be a .pte path, its bytes, an ExecutorchProgramManager or a "
                             f"BundledProgram, got {type(program).__name__}")
    # the runtime streams each sample's intermediates into this file; sealed in place after the run (no copy)
    return Runtime.get().load_program(program, enable_etdump=True, debug_buffer_path=debug_buffer_path)


class _Stats:
    """Per-row values of every sample (floats only) and the culprit ranks of each sample."""

    def __init__(self) -> None:
        self.first: dict[tuple, dict[str, Any]] = {}
        self.order: list[tuple] = []
        self.values: dict[tuple, dict[str, list[float]]] = {}
        self.ranks: list[list[tuple]] = []

    def add(self, df: pd.DataFrame, top: int) -> None:
        cols = {c: df[c].tolist() for c in {*_KEEP, *STATS, "aot_debug_handle", "instruction_id", "runtime_ops"}
                if c in df.columns}  # column lists: no per-row Series (pandas copies attrs for each)
        keys = [(tuple(a), int(i), tuple(o)) for a, i, o in zip(cols["aot_debug_handle"], cols["instruction_id"],
                                                                 cols["runtime_ops"])]
        for j, k in enumerate(keys):
            if k not in self.first:
                self.first[k] = {c: cols[c][j] for c in _KEEP if c in cols}
                self.order.append(k)
                self.values[k] = {s: [] for s in STATS}
            for s in STATS:
                self.values[k][s].append(_val(cols[s][j]))
        cul = find_culprits(df, top=max(top, 1))
        self.ranks.append([keys[df.index.get_loc(i)] for i in cul.index])


def _agg(vals: list[float]) -> tuple[float, float, float]:
    a = np.asarray([v for v in vals if not math.isnan(v)], dtype=float)
    if not a.size:
        return math.nan, math.nan, math.nan
    return float(a.mean()), float(a.max()), float(np.percentile(a, 99))


def _frame(st: _Stats, top: int, distance: str) -> pd.DataFrame:
    rows = []
    n = len(st.ranks)
    for k in st.order:
        r = dict(st.first[k])
        for s in STATS:
            mean, mx, p99 = _agg(st.values[k][s])
            r.update({f"{s}_mean": mean, f"{s}_max": mx, f"{s}_p99": p99})
        worst = {s: (None if math.isnan(r[f"{s}_max"]) else r[f"{s}_max"]) for s in STATS}
        r["gap"], r["local_gap"] = [worst["gap"]], [worst["local_gap"]]
        r["rel_error"], r["local_rel_error"] = worst["rel_error"], worst["local_rel_error"]
        exact = r.get("metric") == "MISMATCH_FRACTION"
        r["verdict"] = verdict(worst["local_rel_error"], r.get("noise_floor"), exact, worst["local_gap"],
                               worst["rel_error"])
        named = [ranks.index(k) + 1 for ranks in st.ranks if k in ranks]
        r["culprit_frequency"] = len(named) / n if n else 0.0
        r["top1_frequency"] = sum(1 for ranks in st.ranks if ranks[:1] == [k]) / n if n else 0.0
        r["mean_culprit_rank"] = float(np.mean(named)) if named else None
        rows.append(r)
    df = pd.DataFrame(rows)
    df.attrs["distance"] = distance
    return df


def _stability(df: pd.DataFrame, st: _Stats, top: int) -> tuple[float, float | None]:
    agg = [st.order[i] for i in find_culprits(df, top=top).index]
    aset = set(agg)
    sims = []
    for ranks in st.ranks:
        s = set(ranks[:top])
        sims.append(1.0 if not s and not aset else len(s & aset) / len(s | aset))
    firsts = [ranks[0] for ranks in st.ranks if ranks]
    if not firsts:
        return float(np.mean(sims)) if sims else 1.0, None
    common = max(set(firsts), key=firsts.count)
    return float(np.mean(sims)), firsts.count(common) / len(st.ranks)


def numeric_gap_over_samples(etrecord: Any, program: Any, samples: Any, distance: Any = "MSE",
                             method: str = "forward", top: int = 5, reference_graph: str | None = None,
                             progress: Callable[[str], None] | None = None, *,
                             inspector_type: Callable[..., Any]) -> pd.DataFrame:
    """Runs ``program`` on every sample with an ETDump tracer and aggregates the per-op gaps (see the module
    docstring). ``samples``: an iterable of input tuples or a ``BundledProgram`` (its test suite of
    ``method``); ``program``: a .pte path, bytes, ExecutorchProgramManager or BundledProgram;
    ``inspector_type``: the Inspector class that reads each sample's ETDump (given by the caller, so this
    module does not import the Inspector that imports it)."""
    Inspector = inspector_type  # noqa: N806 - a class

    if not isinstance(top, int) or top < 1:
        raise InspectorError(f"top must be a positive int, got {top!r}")
    st = _Stats()
    attrs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="edgetorch-samples-") as d:
        dump, dbg = os.path.join(d, "sample.etdp"), os.path.join(d, "sample_debug.bin")
        loaded = _load(program, dbg)
        m = loaded.load_method(method)
        for i, sample in enumerate(samples_of(samples, method)):
            loaded.tracer.clear()  # one sample's intermediates at a time
            args = pytree.tree_leaves(tuple(sample)) if not isinstance(sample, dict) else list(sample.values())
            m.execute(*args)
            loaded.write_etdump_result_to_file(dump)
            insp = Inspector(etdump_path=dump, etrecord=etrecord, debug_buffer_path=dbg)
            df = insp.calculate_numeric_gap(distance, method=method, reference_graph=reference_graph,
                                            inputs=tuple(args))
            attrs = {k: v for k, v in df.attrs.items() if k != "coverage"}
            st.add(df.drop(columns=["aot_intermediate_output", "runtime_intermediate_output"]), top)
            del df, insp  # releases the mapping of the debug buffer file before the next run rewrites it
            if progress is not None:
                progress(f"sample {i + 1}: {len(st.ranks[-1])} culprit(s)")
        loaded.tracer.clear()
        loaded.tracer.close()
    if not st.ranks:
        raise InspectorError("samples is empty: give at least one input tuple")
    out = _frame(st, top, attrs.get("distance", str(distance)))
    out.attrs.update(attrs)
    out.attrs["samples"] = len(st.ranks)
    out.attrs["rank_stability"], out.attrs["top1_agreement"] = _stability(out, st, top)
    return out
