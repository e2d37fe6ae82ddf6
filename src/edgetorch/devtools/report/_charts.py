"""The report's charts, inline SVG: gaps along execution order, the op profile, the final-output gap per
execution (generation steps) and per sample (multi-sample gap tables).

Integer and bool rows are compared exactly (``metric`` ``MISMATCH_FRACTION``): the gap chart leaves them out.
Every chart scales down to the page width (``class="chart"``: CSS ``max-width:100%``).
"""

from __future__ import annotations

import html
import math
import os
import re
from typing import Any

import pandas as pd

_STAT = re.compile(r"^(?P<base>.+?)_(?P<stat>mean|max|p99)$")


def _e(x: Any) -> str:
    return html.escape(str(x))


def _val(v: Any) -> float | None:
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f


def _fmt(v: float | None) -> str:
    if v is None:
        return ""
    if math.isinf(v) or math.isnan(v):
        return str(v)
    return "0" if v == 0 else f"{v:.3e}"


def _short_source(src: str) -> str:
    """``/long/path/model.py:12 in forward: code`` -> ``model.py:12 in forward: code``."""
    head, sep, rest = str(src).partition(":")
    return os.path.basename(head) + sep + rest if sep else str(src)


def _exact(df: pd.DataFrame) -> list[bool]:
    """Rows compared exactly (integer/bool: ``metric`` is the mismatch fraction, not the chosen distance)."""
    from edgetorch.devtools.inspector.comparators import EXACT_METRIC

    exact = df.attrs.get("exact_metric", EXACT_METRIC)
    return [m == exact for m in df["metric"]] if "metric" in df else [False] * len(df)


def gap_chart_svg(df: pd.DataFrame, width: int = 1200, height: int = 300) -> str:
    """Accumulated and local gap per row (log scale), delegate rows in another colour. Exact (integer/bool)
    rows are left out of the curve: their mismatch fraction is not on the scale of the distance."""
    exact = _exact(df)
    gaps = [None if x else _val(g) for g, x in zip(df["gap"], exact, strict=True)] if len(df) else []
    local = ([None if x else _val(g) for g, x in zip(df["local_gap"], exact, strict=True)]
             if "local_gap" in df and len(df) else [])
    pos = [g for g in gaps + local if g is not None and g > 0 and math.isfinite(g)]
    if not pos:
        return "<p>All gaps are zero: the runtime reproduces the reference exactly.</p>"
    lo, hi = math.log10(min(pos)), math.log10(max(pos))
    if hi - lo < 1:
        lo, hi = lo - 0.5, hi + 0.5
    pad_l, pad_r, pad_t, pad_b = 60, 10, 10, 40
    n = len(gaps)
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def xy(i: int, g: float) -> tuple[float, float]:
        x = pad_l + (w * i / max(n - 1, 1))
        y = pad_t + h - h * (math.log10(g) - lo) / (hi - lo) if g > 0 else pad_t + h
        return x, y

    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img">']
    for k in range(math.floor(lo), math.ceil(hi) + 1):
        if lo <= k <= hi:
            y = pad_t + h - h * (k - lo) / (hi - lo)
            parts.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            parts.append(f'<text x="{pad_l - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">1e{k}</text>')
    floor_y = pad_t + h
    parts.append(f'<text x="{pad_l - 6}" y="{floor_y + 14:.1f}" font-size="10" text-anchor="end">0</text>')
    for series, colour in ((local, "#2b8a3e"), (gaps, "#c92a2a")):
        pts = [xy(i, max(g, 10 ** lo)) if g > 0 else (xy(i, 10 ** lo)[0], floor_y + 8)
               for i, g in enumerate(series) if g is not None and math.isfinite(g)]
        if pts:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.2" points="{d}"/>')
    for i, g in enumerate(local):
        if g is not None and math.isfinite(g) and g > 0:
            x, y = xy(i, max(g, 10 ** lo))
            parts.append(f'<rect x="{x - 3:.1f}" y="{y - 3:.1f}" width="6" height="6" fill="#2b8a3e">'
                         f'<title>#{i} local gap {_fmt(g)}</title></rect>')
    delegates = list(df["delegate"]) if "delegate" in df else [None] * n
    for i, g in enumerate(gaps):
        if g is None or not math.isfinite(g):
            continue
        x, y = xy(i, max(g, 10 ** lo)) if g > 0 else (xy(i, 10 ** lo)[0], floor_y + 8)
        row = df.iloc[i]
        colour = "#1971c2" if delegates[i] else "#c92a2a"
        tip = f"#{i} {', '.join(map(str, row['aot_ops']))[:120]} gap={_fmt(g)} local={_fmt(_val(row.get('local_gap')))}"
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"><title>{_e(tip)}</title></circle>')
    parts.append(f'<text x="{pad_l}" y="{height - 4}" font-size="11">op (execution order) →</text>')
    parts.append("</svg>")
    legend = ('<div class="legend"><span><i class="sw" style="background:#c92a2a"></i>accumulated gap</span>'
              '<span><i class="sw" style="background:#2b8a3e"></i>local gap (op re-run on runtime inputs)</span>'
              '<span><i class="sw" style="background:#1971c2"></i>row inside/for a delegate</span></div>')
    return legend + "".join(parts)


def profile_chart_svg(profile: pd.DataFrame, top: int = 20, width: int = 900) -> str:
    """Horizontal bars of the slowest events (median time)."""
    col = next((c for c in profile.columns if str(c).startswith("p50")), None)
    if col is None or profile.empty:
        return "<p>No profile events.</p>"
    skip = {"Method::execute", "Program::load_method", "Method::init"}
    rows = profile[~profile["event_name"].isin(skip)].dropna(subset=[col])
    rows = rows.sort_values(col, ascending=False).head(top)
    if rows.empty:
        return "<p>No op events.</p>"
    vmax = float(rows[col].max()) or 1.0
    bar_h, label_w = 16, 330
    height = bar_h * len(rows) + 10
    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg">']
    for i, (_, r) in enumerate(rows.iterrows()):
        y = 5 + i * bar_h
        bw = (width - label_w - 90) * float(r[col]) / vmax
        colour = "#1971c2" if r.get("is_delegated_op") or r.get("delegate_backend_name") else "#868e96"
        parts.append(f'<text x="{label_w - 6}" y="{y + 11}" font-size="11" text-anchor="end">'
                     f'{_e(str(r["event_name"])[:48])}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 2}" width="{bw:.1f}" height="{bar_h - 4}" fill="{colour}"/>')
        parts.append(f'<text x="{label_w + bw + 4:.1f}" y="{y + 11}" font-size="11">{float(r[col]):.4f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _bar_y(v: float, lo: float, hi: float, top: int, h: int) -> float:
    return top + h - h * (math.log10(v) - lo) / (hi - lo)


def generation_chart_svg(gen: pd.DataFrame, width: int = 900, height: int = 220) -> str:
    """One bar per execution (``Inspector.generation_gaps``): the final-output gap against the reference
    replay, log scale; an exact zero is drawn as a stub at the bottom. Bars are coloured per method."""
    vals = [_val(v) for v in gen["output_gap"]]
    pos = [v for v in vals if v is not None and v > 0 and math.isfinite(v)]
    lo, hi = (math.log10(min(pos)), math.log10(max(pos))) if pos else (-12.0, -11.0)
    if hi - lo < 1:
        lo, hi = lo - 0.5, hi + 0.5
    pad_l, pad_t, pad_b = 60, 10, 36
    h = height - pad_t - pad_b
    step = (width - pad_l - 10) / max(len(vals), 1)
    colours = ["#1971c2", "#c92a2a", "#2b8a3e", "#e67700", "#862e9c"]
    methods = list(dict.fromkeys(gen["method"]))
    parts = [f'<svg class="generation" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img">']
    for k in range(math.ceil(lo), math.floor(hi) + 1):
        y = _bar_y(10.0 ** k, lo, hi, pad_t, h)
        parts.append(f'<line x1="{pad_l}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{pad_l - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">1e{k}</text>')
    for i, (v, (_, row)) in enumerate(zip(vals, gen.iterrows(), strict=True)):
        x = pad_l + i * step + step * 0.15
        y = _bar_y(max(v, 10.0 ** lo), lo, hi, pad_t, h) if v else pad_t + h - 2
        colour = colours[methods.index(row["method"]) % len(colours)]
        tip = f"execution {row['execution']} ({row['method']} #{row['run']}): output gap {_fmt(v)}"
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.7:.1f}" height="{pad_t + h - y:.1f}" '
                     f'fill="{colour}"><title>{_e(tip)}</title></rect>')
        parts.append(f'<text x="{x + step * 0.35:.1f}" y="{pad_t + h + 14}" font-size="10" text-anchor="middle">'
                     f'{row["execution"]}</text>')
    parts.append(f'<text x="{pad_l}" y="{height - 4}" font-size="11">execution (call order) →</text></svg>')
    legend = "".join(f'<span><i class="sw" style="background:{colours[i % len(colours)]}"></i>{_e(m)}</span>'
                     for i, m in enumerate(methods))
    return f'<div class="legend">{legend}</div>' + "".join(parts)




def stat_columns(df: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Multi-sample statistics columns of a gap table, ``{base column: {"mean"|"max"|"p99": column}}``
    (``local_rel_error_mean``, ``gap_p99``, ...)."""
    out: dict[str, dict[str, str]] = {}
    for c in df.columns:
        m = _STAT.match(str(c))
        if m:
            out.setdefault(m["base"], {})[m["stat"]] = str(c)
    return out


def samples_chart_svg(df: pd.DataFrame, width: int = 1200, height: int = 240) -> str:
    """Per op (execution order), the spread of its error over the samples of a multi-sample gap table: mean
    and p99/max of the preferred statistic (local relative error first), log scale. "" without such columns."""
    stats = stat_columns(df)
    base = next((b for b in ("local_rel_error", "rel_error", "local_gap", "gap") if b in stats), None)
    if base is None or not len(df):
        return ""
    series = [(k, c, [_val(v) for v in df[stats[base][k]]]) for k, c in
              (("max", "#c92a2a"), ("p99", "#e67700"), ("mean", "#1971c2")) if k in stats[base]]
    if base.endswith("rel_error") and "noise_floor" in df:  # relative errors compare with the noise floor
        series.append(("noise floor", "#868e96", [_val(v) for v in df["noise_floor"]]))
    pos = [v for _, _, vals in series for v in vals if v is not None and v > 0 and math.isfinite(v)]
    if not pos:
        return f"<p>{_e(base)} is 0 on every sample.</p>"
    lo, hi = math.log10(min(pos)), math.log10(max(pos))
    lo, hi = (lo - 0.5, hi + 0.5) if hi - lo < 1 else (lo, hi)
    pad_l, pad_t, h = 60, 10, height - 46
    step = (width - pad_l - 10) / max(len(df) - 1, 1)
    parts = [f'<svg class="chart samples" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img">']
    for k in range(math.ceil(lo), math.floor(hi) + 1):
        y = _bar_y(10.0 ** k, lo, hi, pad_t, h)
        parts.append(f'<line x1="{pad_l}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{pad_l - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">1e{k}</text>')
    for k, colour, vals in series:
        pts = [(pad_l + i * step, _bar_y(max(v, 10.0 ** lo), lo, hi, pad_t, h))
               for i, v in enumerate(vals) if v is not None and v > 0 and math.isfinite(v)]
        dash = ' stroke-dasharray="4 3"' if k == "noise floor" else ""
        if pts:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.2"{dash} points="'
                         + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
            parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{colour}"/>' for x, y in pts if not dash]
    parts.append(f'<text x="{pad_l}" y="{height - 4}" font-size="11">op (execution order) →</text></svg>')
    legend = "".join(f'<span><i class="sw" style="background:{c}"></i>'
                     f'{_e(k if k == "noise floor" else f"{base} {k} over the samples")}</span>' for k, c, _ in series)
    return f'<div class="legend">{legend}</div>' + "".join(parts)


def per_sample_chart_svg(samples: pd.DataFrame, width: int = 900, height: int = 220) -> str:
    """One bar per sample of ``df.attrs["samples"]`` (a frame with a numeric column, e.g. the final-output
    gap of each sample), log scale. "" when there is nothing numeric to draw."""
    num = [c for c in samples.columns if pd.api.types.is_numeric_dtype(samples[c]) and c != "sample"]
    if not num or not len(samples):
        return ""
    col = next((c for c in num if "output" in str(c)), num[-1])
    gen = pd.DataFrame({"output_gap": samples[col].astype(float), "method": "sample",
                        "execution": list(samples["sample"] if "sample" in samples else range(len(samples))),
                        "run": range(len(samples))})
    svg = generation_chart_svg(gen, width, height).replace('class="generation"', 'class="chart per-sample"')
    return svg.replace("execution (call order)", f"sample ({_e(col)})").replace("execution ", "sample ")
