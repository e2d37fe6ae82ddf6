"""Culprits: the ops that *add* error beyond rounding noise, ranked, with their evidence.

A row is a culprit when its local error (the op re-run by the reference on the runtime's own inputs, compared
with the runtime's output) is beyond what rounding in its dtype explains (``verdict == "real"``, see
``inspector.noise``), or, for an integer/bool row, when any element differs locally; also a ``DELEGATE_CALL``
row whose output differs from the value its op logged inside the delegate (an error at the boundary). A
program whose every op is within noise has no culprit: the result is empty.

Most specific row first. A ``DELEGATE_CALL`` row whose compared output is also logged by an op inside the
delegate (an inner row of the same call comparing the same reference op) and found wrong there is the same
tensor seen from outside: the inner row names the op, so the delegate row is not a separate culprit.

Ranking. Exact rows with mismatching elements first (an integer off by one is as wrong as it gets), then
floating-point rows by ``noise_ratio`` = ``local_rel_error / noise_floor`` (how many times the op's error
exceeds what its dtype and reduction length explain), then by ``local_rel_error``. Evidence columns: every
column of the gap table (``gap``/``local_gap``: accumulated vs local in the chosen metric; ``rel_error`` /
``local_rel_error``; ``delegate`` / ``in_delegate_call``; ``source``; ``module``) plus ``noise_ratio`` and
``accumulated_rank`` (the row's rank when sorting by accumulated gap, the reference tool's way; 1 = first).

A float-reference table (``calculate_numeric_gap(..., reference_graph="float")``: a quantized program against its
float model) is ranked by the evidence it carries (``float_culprits``), over its quantized rows with a finite local
SQNR, in two tiers:

1. rows whose own quantization is abnormal *and* where the accumulated SQNR falls: ``local_excess_db`` (the table's
   median local SQNR minus the row's effective one) at least ``EXCESS_DB`` and ``sqnr_drop_db`` at least ``DROP_DB``,
   steepest drop first: a layer quantized far worse than INT8 rounding explains, whose error the output keeps;
2. the others, steepest ``sqnr_drop_db`` first: where the accumulated error grows most (a clean model's answer).

``sqnr_drop_db`` is the fall of the accumulated SQNR from the previous row's (in execution order; the first row
falls from the table's typical local SQNR, what one INT8 rounding gives). The *effective* local SQNR is the local
SQNR measured against the larger of the row's signal and the next row's: a small term added to a large signal (the
``0.044715 * x**3`` of GPT-2's GELU, quantized as the input of its add) has a poor SQNR of its own while its error is
negligible in the value it joins. Signals are the mean square of ``aot_intermediate_output`` (the float model's
value on the first sample); without them the effective local SQNR is the local one.

Rows without a signal are ranked apart, in ``attrs["no_signal"]`` with a ``reason``: a local SQNR of ``-inf`` (the
float op's output is zero there: any error is infinitely large relative to it, and says nothing about the layer)
or ``nan``, and exact rows (``+inf``: the op adds no error). ``attrs["lost_from"]`` names the first row whose
accumulated SQNR is at or below 0 dB (the error is as large as the output itself from there on), else None.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from edgetorch.devtools.inspector.comparators import EXACT_METRIC, larger_is_worse
from edgetorch.errors import InspectorError
from edgetorch.formats.handles import DELEGATE_CALL

__all__ = ["NEEDED", "is_real", "accumulated_ranks", "find_culprits", "FLOAT_NEEDED", "is_float_table",
           "float_culprits", "EXCESS_DB", "DROP_DB"]

#: columns the culprit search needs (``calculate_numeric_gap`` writes them)
NEEDED = ("gap", "local_gap", "metric", "local_rel_error", "noise_floor", "runtime_ops", "instruction_id",
          "in_delegate_call", "ref_handle")


def _first(v: Any) -> float | None:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _opt(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def is_real(metric: str, local_gap: Any, gap: Any, local_rel: Any, rel: Any, floor: Any) -> bool:
    """Whether one row adds error beyond noise: exact rows with a mismatch (local, else accumulated), float
    rows whose local relative error (else accumulated) exceeds the noise floor."""
    if metric == EXACT_METRIC:
        g = _first(local_gap)
        g = _first(gap) if g is None else g
        return bool(g)
    err = _opt(local_rel)
    err = _opt(rel) if err is None else err
    if not err:
        return False
    f = _opt(floor)
    return f is None or err > f


def _row_is_real(verdict: Any, metric: str, *evidence: Any) -> bool:
    """A row's verdict where ``calculate_numeric_gap`` gave one, else :func:`is_real` on its gaps. An exact row
    judged "exact" or "noise" (an integer kernel's output within one quantization step) is not real, whatever its
    mismatch count says."""
    if verdict == "real":
        return True
    if metric == EXACT_METRIC and verdict in ("exact", "noise"):
        return False
    return is_real(metric, *evidence)


def _explained_delegate_rows(df: pd.DataFrame, real: list[bool]) -> set[Any]:
    """DELEGATE_CALL rows whose compared reference op is also compared, and found wrong, by an inner row of
    the same call (the same tensor seen from inside, where the op is named). A delegate row whose inner row is
    within noise stays: the error appeared between the op and the delegate's output."""
    inner: set[tuple[int, Any]] = set()
    for call, h, r in zip(df["in_delegate_call"], df["ref_handle"], real):
        if r and call is not None and not (isinstance(call, float) and math.isnan(call)):
            inner.add((int(call), h))
    kinds = df["kind"] if "kind" in df.columns else [None] * len(df)  # a hand-built table: no delegate rows
    return {i for i, kind, iid, h in zip(df.index, kinds, df["instruction_id"], df["ref_handle"])
            if kind == DELEGATE_CALL and (int(iid), h) in inner}


def _observer_explained(df: pd.DataFrame, real: list[bool]) -> set[Any]:
    """DELEGATE_CALL rows whose error is what the debug session's own observation measured: the run checked the
    observer effect (``df.attrs["observer_effect"]``: the largest ``max|exposed - plain| / max|plain|`` of the
    call's outputs, the plain session fusing Q/DQ into integer kernels the exposing one cannot), and the row's
    runtime output (the plain session's) is within that relative distance of the reference (``max|rt - ref| /
    max|rt|``). A fault inside the delegate moves both sessions alike: it stays beyond the observer effect."""
    oe = _opt(df.attrs.get("observer_effect"))
    if not oe or "kind" not in df.columns:
        return set()
    out = set()
    for i, r, kind in zip(df.index, real, df["kind"]):
        ref, rt = df.at[i, "aot_intermediate_output"], df.at[i, "runtime_intermediate_output"]
        if not (r and kind == DELEGATE_CALL) or not hasattr(ref, "shape") or not hasattr(rt, "shape"):
            continue
        if ref.shape != rt.shape or not ref.dtype.is_floating_point or not rt.numel():
            continue
        a, b = ref.detach().double(), rt.detach().double()
        if (a - b).abs().max().item() <= oe * max(b.abs().max().item(), 1e-12) * (1 + 1e-6):
            out.add(i)
    return out


def accumulated_ranks(df: pd.DataFrame) -> pd.Series:
    """Rank of each row when sorted by accumulated gap, worst first (the reference's way; 1 = first)."""
    worse = larger_is_worse(df.attrs.get("distance", "MSE"), df.attrs)
    keys = pd.Series([_first(g) for g in df["gap"]], index=df.index, dtype=float)
    return keys.rank(ascending=not worse, method="first", na_option="bottom").astype(int)


def find_culprits(df: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """The rows that add error beyond noise, most specific, worst first (at most ``top``); empty when every op
    is within noise. See the module docstring for the ranking and the evidence columns."""
    if not isinstance(top, int) or top < 0:
        raise InspectorError(f"find_culprits: top must be a non-negative int, got {top!r}")
    if is_float_table(df):
        return float_culprits(df, top)
    missing = [c for c in NEEDED if c not in df.columns]
    if missing:
        raise InspectorError(f"find_culprits: df lacks the columns {missing}; pass the DataFrame "
                             "calculate_numeric_gap returned")
    out = df.copy()
    if out.empty:
        return out.assign(noise_ratio=pd.Series(dtype=float), accumulated_rank=pd.Series(dtype=int))
    out["accumulated_rank"] = accumulated_ranks(df)
    ratio = []
    for lrel, rel, floor in zip(df["local_rel_error"], df["rel_error"], df["noise_floor"]):
        err = _opt(lrel) if _opt(lrel) is not None else _opt(rel)
        f = _opt(floor)
        ratio.append(math.inf if err and not f else (err or 0.0) / f if f else 0.0)
    out["noise_ratio"] = ratio
    verdicts = df["verdict"] if "verdict" in df.columns else [None] * len(df)
    real = [_row_is_real(v, m, *a) for v, m, *a in zip(verdicts, df["metric"], df["local_gap"], df["gap"],
                                                        df["local_rel_error"], df["rel_error"], df["noise_floor"])]
    explained = _explained_delegate_rows(df, real) | _observer_explained(df, real)
    keep = [i for i, r in zip(df.index, real) if r and i not in explained]
    out = out.loc[keep]

    def key(i: Any) -> tuple:
        exact = out.at[i, "metric"] == EXACT_METRIC
        lrel = _opt(out.at[i, "local_rel_error"]) or 0.0
        return (0 if exact else 1, -out.at[i, "noise_ratio"], -lrel, i)

    order = sorted(out.index, key=key)
    return out.loc[order[:top]]


#: the columns that make a table a float-reference table (``reference_graph="float"``)
FLOAT_NEEDED = ("sqnr_db", "local_sqnr_db", "aot_ops")


def is_float_table(df: pd.DataFrame) -> bool:
    """Whether ``df`` is a float-reference gap table (a quantized program against its float model)."""
    return df.attrs.get("reference_graph") == "float" or all(c in df.columns for c in FLOAT_NEEDED)


def _no_signal_reason(local_sqnr: float | None) -> str | None:
    if local_sqnr is None or math.isnan(local_sqnr):
        return "no local SQNR (the op was not compared on the runtime's inputs)"
    if local_sqnr == -math.inf:
        return ("no float signal: the float op's output is zero here, so any error is infinite relative to it; "
                "SQNR says nothing about this layer")
    if local_sqnr == math.inf:
        return "exact: its quantization adds no error"
    return None


#: tier 1 of the float-table ranking: own quantization this many dB worse than the table's typical local SQNR ...
EXCESS_DB = 10.0
#: ... and the accumulated SQNR falls at least this many dB there
DROP_DB = 1.0


def _signal(v: Any) -> float | None:
    """Mean square of a row's float value (None when it has none)."""
    if not callable(getattr(v, "is_floating_point", None)) or not v.is_floating_point() or not v.numel():
        return None  # a tensor is read by duck type: importing torch here would make the report's import heavy
    return float(v.detach().double().pow(2).mean())


def _float_evidence(df: pd.DataFrame, keep: list[Any]) -> tuple[dict[Any, float], dict[Any, float], float]:
    """Per kept row: its effective local SQNR and its accumulated-SQNR drop; and the table's typical (median)
    local SQNR (see the module docstring)."""
    values = df["aot_intermediate_output"] if "aot_intermediate_output" in df.columns else [None] * len(df)
    sig = [_signal(v) for v in values]
    index = list(df.index)
    kept = set(keep)
    eff: dict[Any, float] = {}
    for k, i in enumerate(index):
        if i not in kept:
            continue
        nxt = next((x for x in sig[k + 1:] if x), None)
        own = sig[k]
        boost = 10.0 * math.log10(nxt / own) if nxt and own and nxt > own else 0.0
        eff[i] = float(df.at[i, "local_sqnr_db"]) + boost
    typical = statistics.median(float(df.at[i, "local_sqnr_db"]) for i in eff) if eff else 0.0
    drop: dict[Any, float] = {}
    prev = typical
    for i, a in zip(index, df["sqnr_db"]):
        a = _opt(a)
        if a is None or math.isnan(a) or not math.isfinite(a):
            continue
        if i in kept:
            drop[i] = prev - a
        prev = a
    return eff, drop, typical


def float_culprits(df: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """The culprits of a float-reference table (see the module docstring for the two tiers): quantized rows with a
    finite local SQNR, at most ``top``, with the columns ``sqnr_drop_db``, ``local_excess_db`` and ``evidence``;
    rows without a signal in ``attrs["no_signal"]`` (with a ``reason``), the first row whose output is lost in
    ``attrs["lost_from"]``."""
    missing = [c for c in FLOAT_NEEDED if c not in df.columns]
    if missing:
        raise InspectorError(f"find_culprits: the float-reference table lacks the columns {missing}")
    local = [_opt(v) for v in df["local_sqnr_db"]]
    acc = [_opt(v) for v in df["sqnr_db"]]
    quantized = list(df["quantized"]) if "quantized" in df.columns else [True] * len(df)
    reasons = [_no_signal_reason(v) for v in local]
    keep = [i for i, r, q in zip(df.index, reasons, quantized) if r is None and q]
    pos = {i: k for k, i in enumerate(df.index)}
    eff, drop, typical = _float_evidence(df, keep)
    excess = {i: typical - eff[i] for i in keep}
    first = {i for i in keep if excess[i] >= EXCESS_DB and drop.get(i, -math.inf) >= DROP_DB}
    order = sorted(keep, key=lambda i: (i not in first, -drop.get(i, -math.inf), local[pos[i]], pos[i]))
    out = df.loc[order[:top]].copy()
    out["sqnr_drop_db"] = [drop.get(i) for i in out.index]
    out["local_excess_db"] = [excess[i] for i in out.index]
    out["evidence"] = [_evidence_text(local[pos[i]], acc[pos[i]], drop.get(i), excess[i], i in first)
                       for i in out.index]
    apart = [i for i, r in zip(df.index, reasons) if r is not None]
    no_signal = df.loc[apart].copy()
    no_signal["reason"] = [reasons[pos[i]] for i in apart]
    out.attrs = {**df.attrs, "no_signal": no_signal,
                 "lost_from": next((_label(df, i) for i, a in zip(df.index, acc) if a is not None and a <= 0.0),
                                   None)}
    return out


def _evidence_text(local: float, acc: float | None, drop: float | None, excess: float, abnormal: bool) -> str:
    what = (f"its own quantization is {excess:.1f} dB worse than the table's typical" if abnormal
            else "the accumulated error grows here")
    text = f"{what}: local SQNR {local:.1f} dB"
    if acc is not None:
        text += f"; accumulated {acc:.1f} dB"
    if drop is not None:
        text += f" ({drop:+.1f} dB fall)" if drop >= 0 else f" ({-drop:.1f} dB rise)"
    return text


def _label(df: pd.DataFrame, i: Any) -> str:
    module = df.at[i, "module"] if "module" in df.columns else ""
    ops = ", ".join(df.at[i, "aot_ops"])
    return f"{module} ({ops})" if module else ops
