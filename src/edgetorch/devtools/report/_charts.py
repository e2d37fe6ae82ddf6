"""A one-file HTML report: numeric gaps along the graph (picture + sortable table) and the op profile.

Integer and bool rows are compared exactly (``metric`` ``MISMATCH_FRACTION``, with their ``mismatches``
count): the table shows them with their metric, the chart leaves them out, and any mismatch marks them.

No external assets: charts are inline SVG, sorting is a few lines of inline JavaScript, so the file can be
mailed or attached to a bug report as is.
"""

from __future__ import annotations

import html
import math
import os
from typing import Any

import pandas as pd

from edgetorch._fileio import atomic_write

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1c1c1c;max-width:1400px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;width:100%}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3;cursor:pointer;position:sticky;top:0}
tr.hot td{background:#fde8e8}tr.first td{background:#fff3cd}
.num{text-align:right;font-variant-numeric:tabular-nums}
.summary td{border:none;padding:2px 12px 2px 0;font-size:13px}
details{font-size:11px}pre{white-space:pre-wrap;margin:2px 0}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
p.warn{background:#fff3cd;padding:6px;border-left:4px solid #e0a800}
"""

_JS = """
document.querySelectorAll('table.sortable th').forEach((th,i)=>th.addEventListener('click',()=>{
 const t=th.closest('table'),b=t.tBodies[0],rows=[...b.rows],asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
 rows.sort((x,y)=>{const a=x.cells[i].dataset.v??x.cells[i].innerText,c=y.cells[i].dataset.v??y.cells[i].innerText;
  const na=parseFloat(a),nc=parseFloat(c);const r=(!isNaN(na)&&!isNaN(nc))?na-nc:a.localeCompare(c);return asc?r:-r});
 rows.forEach(r=>b.appendChild(r));}));
"""


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
    return f"{v:.3e}" if (v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4)) else f"{v:.4g}"


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

    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" role="img">']
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
    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
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
    parts = [f'<svg class="generation" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" '
             'role="img">']
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


def _generation_section(gen: pd.DataFrame) -> str:
    distance = gen.attrs.get("distance", "gap")
    out = [f"<h2>Final-output gap ({_e(distance)}) per execution</h2>", generation_chart_svg(gen),
           "<table class='sortable generation'><thead><tr><th>execution</th><th>method</th><th>run</th>"
           "<th>output gap</th><th>worst local gap</th><th>worst op</th></tr></thead><tbody>"]
    for _, r in gen.iterrows():
        g, w = _val(r["output_gap"]), _val(r["worst_local_gap"])
        out.append(f"<tr><td class='num'>{r['execution']}</td><td>{_e(r['method'])}</td>"
                   f"<td class='num'>{r['run']}</td><td class='num' data-v='{g if g is not None else ''}'>{_fmt(g)}"
                   f"</td><td class='num' data-v='{w if w is not None else ''}'>{_fmt(w)}</td>"
                   f"<td>{_e(', '.join(map(str, r['worst_op'] or [])))}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def write_report(path: str | os.PathLike, gap_df: pd.DataFrame | None, profile_df: pd.DataFrame | None = None,
                 title: str = "edgetorch numerical debugging report", summary: dict[str, Any] | None = None,
                 threshold: float | None = None, generation_df: pd.DataFrame | None = None) -> str:
    """Writes the HTML report atomically; returns the path. ``generation_df`` (``Inspector.generation_gaps()``)
    adds the final-output gap per execution (chart and table) when it has more than one execution."""
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
           f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>"]
    if summary:
        out.append("<table class='summary'>")
        for k, v in summary.items():
            out.append(f"<tr><td><b>{_e(k)}</b></td><td>{_e(v)}</td></tr>")
        out.append("</table>")
    if generation_df is not None and len(generation_df) > 1:
        out.append(_generation_section(generation_df))
    if gap_df is not None:
        distance = gap_df.attrs.get("distance", "gap")
        out.append(f"<h2>Numeric gap ({_e(distance)}) along the graph</h2>")
        out.append(gap_chart_svg(gap_df))
        first = None
        exact = _exact(gap_df)
        if threshold is not None:
            for i, g in enumerate(gap_df["gap"]):
                v = _val(g)
                if v is not None and (v > 0 if exact[i] else v > threshold):
                    first = i
                    break
        cov = gap_df.attrs.get("coverage")
        if cov is not None:
            out.append(f"<p>{_e(cov.summary())}</p>")
        effect = gap_df.attrs.get("observer_effect")
        if effect is not None:
            from edgetorch.formats.etdump import OBSERVER_EFFECT_TOLERANCE

            changed = effect > OBSERVER_EFFECT_TOLERANCE
            note = ("exposing the delegate's intermediates changed its final outputs: rows inside the delegate "
                    "show the observed (differently fused) computation" if changed else
                    "exposing the delegate's intermediates left its final outputs within the tolerance")
            out.append(f"<p class='{'warn' if changed else ''}'><b>Observer effect</b>: {effect:.3g} relative "
                       f"(tolerance {OBSERVER_EFFECT_TOLERANCE:g}); {_e(note)}.</p>")
        out.append("<h2>Per-op gaps</h2><table class='sortable'><thead><tr>")
        cols = ["#", "aot_ops", "runtime_ops", "gap", "local_gap", "metric", "mismatches", "dtype", "shape",
                "delegate", "module", "source", "stack trace"]
        out.append("".join(f"<th>{c}</th>" for c in cols) + "</tr></thead><tbody>")
        worst = max((_val(g) or 0.0 for g, x in zip(gap_df["gap"], exact, strict=True) if not x), default=0.0)
        for i, row in gap_df.reset_index(drop=True).iterrows():
            g, lg = _val(row["gap"]), _val(row.get("local_gap"))
            hot = (g or 0) > 0 if exact[i] else bool(worst and g and g >= 0.5 * worst)
            cls = "first" if first == i else ("hot" if hot else "")
            mism = row.get("mismatches")
            traces = "".join(f"<pre>{_e(k)}:\n{_e(v)}</pre>" for k, v in (row["stacktraces"] or {}).items() if v)
            out.append(
                f"<tr class='{cls}'><td class='num'>{i}</td><td>{_e(', '.join(map(str, row['aot_ops'])))}</td>"
                f"<td>{_e(', '.join(map(str, row['runtime_ops'])))}</td>"
                f"<td class='num' data-v='{g if g is not None else ''}'>{_fmt(g)}</td>"
                f"<td class='num' data-v='{lg if lg is not None else ''}'>{_fmt(lg)}</td>"
                f"<td>{_e(row.get('metric') or '')}</td>"
                f"<td class='num'>{'' if mism is None or mism != mism else int(mism)}</td>"
                f"<td>{_e(row.get('dtype') or '')}</td><td>{_e(row.get('shape', ''))}</td>"
                f"<td>{_e(row.get('delegate') or '')}</td>"
                f"<td>{_e(row.get('module', ''))}</td><td>{_e(_short_source(row.get('source', '')))}</td>"
                f"<td><details><summary>show</summary>{traces}</details></td></tr>")
        out.append("</tbody></table>")
        if cov is not None and cov.unmatched:
            out.append("<h2>Not compared</h2><table class='sortable'><thead><tr><th>side</th><th>ops</th>"
                       "<th>handles</th><th>reason</th></tr></thead><tbody>")
            for u in cov.unmatched:
                out.append(f"<tr><td>{_e(u['side'])}</td><td>{_e(', '.join(map(str, u['ops'])))}</td>"
                           f"<td>{_e(u['handles'])}</td><td>{_e(u['reason'])}</td></tr>")
            out.append("</tbody></table>")
    if profile_df is not None and not profile_df.empty:
        out.append("<h2>Profile: slowest ops (median)</h2>")
        out.append(profile_chart_svg(profile_df))
    out.append(f"<script>{_JS}</script></body></html>")
    atomic_write(path, ["".join(out).encode("utf-8")])
    return os.fspath(path)
