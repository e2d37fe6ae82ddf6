"""The report's quantization section: each float op's INT8 error against the float model.

Its input is a float-reference gap table (``calculate_numeric_gap(distance, reference_graph="float")``, one row
per float op in graph order). The section names the worst layers, i.e. those whose own quantization adds the most
error (lowest local SQNR, :func:`~edgetorch.devtools.inspector.float_reference.rank_quantization_culprits`).
It then draws the local and accumulated SQNR along the graph (higher is better; the worst layers in red), and
gives the table with the weight and RMSE/scale columns.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ._charts import _e

QUANT_COLUMNS = ("sqnr_db", "local_sqnr_db", "quantized")  # what makes a table a float-reference table
_CELLS = (("sqnr_db", "SQNR dB"), ("local_sqnr_db", "local SQNR dB"), ("rmse_over_scale", "RMSE / scale"),
          ("weight_sqnr_db", "weight SQNR dB"), ("output_impact", "output impact"), ("samples", "samples"))


def _db(v: Any) -> float | None:
    """A finite or infinite dB value, or None (missing / NaN)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _name(row: pd.Series) -> str:
    ops = row.get("aot_ops")
    return ", ".join(map(str, ops)) if isinstance(ops, (list, tuple)) else str(ops)


def ranking(df: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """``find_culprits`` on the float-reference table (``culprits.float_culprits``): the ``top`` quantized rows
    with a finite local SQNR, lowest first, with ``attrs["lost_from"]`` and ``attrs["no_signal"]``."""
    from edgetorch.devtools.inspector.culprits import float_culprits

    return float_culprits(df, top)


def worst_rows(df: pd.DataFrame, top: int = 5) -> list[int]:
    """Positions (0-based, graph order) of the ``top`` worst quantized rows, worst first."""
    if df.empty:
        return []
    pos = {label: k for k, label in enumerate(df.index)}
    return [pos[i] for i in ranking(df, top).index]


def sqnr_chart_svg(df: pd.DataFrame, worst: list[int], width: int = 1200, height: int = 260) -> str:
    """One bar per row: its local SQNR (dB), the worst rows red; a line: the accumulated SQNR. The scale ends
    10 dB above the quantized rows' best; a finite bar beyond it (a float row's rounding-level error) is drawn to
    the top and marked with a triangle. A row without a finite local SQNR gets a marker on the 0 dB line, not a
    bar: "exact" (a circle, infinite SQNR: no error) or "no signal" (a cross: -inf, the float output is zero
    there, or NaN, not compared)."""
    local = [_db(v) for v in df["local_sqnr_db"]]
    acc = [_db(v) for v in df["sqnr_db"]]
    finite = [v for v in local + acc if v is not None and math.isfinite(v)]
    if not finite:
        return "<p>No row has a finite SQNR: the runtime reproduces the float model exactly.</p>"
    # the scale follows the quantized rows: a float row's 140 dB (float rounding) would flatten them; taller bars
    # are drawn to the top and marked
    quantized = [v for v, q in zip(local + acc, [*df["quantized"], *df["quantized"]], strict=True)
                 if q and v is not None and math.isfinite(v)] if "quantized" in df else []
    lo = math.floor(min(0.0, min(finite)) / 10) * 10
    hi = math.ceil(max(quantized or finite) / 10) * 10 + 10
    pad_l, pad_r, pad_t, pad_b = 50, 10, 10, 36
    n, w, h = len(df), width - pad_l - pad_r, height - pad_t - pad_b
    step = w / max(n, 1)

    def y(v: float) -> float:
        return pad_t + h - h * (min(max(v, lo), hi) - lo) / (hi - lo)

    parts = [f'<svg class="chart" id="sqnr" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img">']
    for t in range(int(lo), int(hi) + 1, 10):
        parts.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#eee"/>'
                     f'<text x="{pad_l - 6}" y="{y(t) + 4:.1f}" font-size="10" text-anchor="end">{t} dB</text>')
    bad = set(worst)
    for i, v in enumerate(local):
        if v is None or math.isinf(v):  # exact (+inf) or no signal (-inf, nan): a marker, not a bar
            parts.append(_marker(df.iloc[i], i, v, pad_l + (i + 0.5) * step, y(max(lo, 0.0)), step))
            continue
        row = df.iloc[i]
        top, base = y(v), y(max(lo, 0.0))
        colour = "#c92a2a" if i in bad else "#4dabf7"
        tip = f"#{i} {_name(row)[:100]}: local SQNR {v:.1f} dB, SQNR {_fmt_db(acc[i])}"
        cls = "qbar worst" if i in bad else "qbar"
        parts.append(f'<rect class="{cls}" data-row="{i}" x="{pad_l + i * step + step * 0.1:.1f}" '
                     f'y="{min(top, base):.1f}" width="{max(step * 0.8, 1):.1f}" height="{abs(base - top):.1f}" '
                     f'fill="{colour}"><title>{_e(tip)}</title></rect>')
        if v > hi:
            cx = pad_l + (i + 0.5) * step
            parts.append(f'<path class="qinf" d="M{cx - 3:.1f},{pad_t + 6:.1f} L{cx + 3:.1f},{pad_t + 6:.1f} '
                         f'L{cx:.1f},{pad_t:.1f}Z" fill="#495057"/>')
    pts = [(pad_l + (i + 0.5) * step, y(v)) for i, v in enumerate(acc) if v is not None]
    if pts:
        parts.append('<polyline fill="none" stroke="#212529" stroke-width="1.5" points="'
                     + " ".join(f"{x:.1f},{yy:.1f}" for x, yy in pts) + '"/>')
    parts.append(f'<text x="{pad_l}" y="{height - 6}" font-size="11">float op (graph order) →</text></svg>')
    legend = ('<div class="legend"><span><i class="sw" style="background:#4dabf7"></i>local SQNR (the op fed the '
              "runtime's inputs: the error its own quantization adds)</span><span><i class=\"sw\" "
              'style="background:#c92a2a"></i>worst layers</span><span><i class="sw" style="background:#212529">'
              "</i>accumulated SQNR (runtime vs the float model)</span><span><b style=\"color:#495057\">○</b> "
              "exact (infinite SQNR: its quantization adds no error)</span><span><b style=\"color:#e67700\">×"
              "</b> no signal (SQNR -inf: the float output is zero; or not compared)</span></div>")
    return legend + "".join(parts)


def _marker(row: pd.Series, i: int, v: float | None, cx: float, cy: float, step: float) -> str:
    """The chart's mark of a row without a finite local SQNR: a circle labelled "exact" (+inf) or a cross
    labelled "no signal" (-inf / NaN); the label is written out where the rows are wide enough to read it."""
    exact = v is not None and v > 0
    what = ("exact: local SQNR ∞ (its quantization adds no error)" if exact else
            "no signal: local SQNR -inf (the float output is zero there)" if v is not None else
            "no signal: no local SQNR (not compared)")
    tip = f"<title>{_e(f'#{i} {_name(row)[:100]}: {what}')}</title>"
    label = "exact" if exact else "no signal"
    text = (f'<text x="{cx:.1f}" y="{cy - 8:.1f}" font-size="9" text-anchor="start" '
            f'transform="rotate(-90 {cx:.1f} {cy - 8:.1f})">{label}</text>' if step >= 9 else "")
    if exact:
        return (f'<g class="qexact" data-row="{i}"><circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="#fff" '
                f'stroke="#495057" stroke-width="1.2"/>{text}{tip}</g>')
    return (f'<g class="qnosig" data-row="{i}"><path d="M{cx - 3:.1f},{cy - 3:.1f} L{cx + 3:.1f},{cy + 3:.1f} '
            f'M{cx - 3:.1f},{cy + 3:.1f} L{cx + 3:.1f},{cy - 3:.1f}" stroke="#e67700" stroke-width="1.5"/>'
            f'{text}{tip}</g>')


def _fmt_db(v: float | None) -> str:
    if v is None:
        return "-"
    return "∞" if math.isinf(v) and v > 0 else f"{v:.1f}"


def _fmt_cell(col: str, v: Any) -> tuple[str, str]:
    """(text, sort value) of one numeric cell."""
    if col == "samples":
        return ("" if v is None else _e(v)), ("" if v is None else _e(v))
    f = _db(v)
    if f is None:
        return "", ""
    text = _fmt_db(f) if col.endswith("_db") else f"{f:.3e}" if col == "output_impact" else f"{f:.3f}"
    return text, ("1e308" if math.isinf(f) and f > 0 else f"{f:.6g}")


def _worst_list(df: pd.DataFrame, worst: list[int]) -> str:
    if not worst:
        return "<p>No quantized op in the table.</p>"
    items = []
    for k in worst:
        row = df.iloc[k]
        module = row.get("module") or ""
        where = f" in <code>{_e(module)}</code>" if module else ""
        weight = _db(row.get("weight_sqnr_db"))
        items.append(f"<li><a href='#q{k}'><b>{_e(_name(row))}</b></a>{where}: local SQNR "
                     f"{_fmt_db(_db(row['local_sqnr_db']))} dB, accumulated {_fmt_db(_db(row['sqnr_db']))} dB"
                     f"{'' if weight is None else ', weight ' + _fmt_db(weight) + ' dB'}</li>")
    return "<ol class='culprits'>" + "".join(items) + "</ol>"


def _table(df: pd.DataFrame, worst: list[int]) -> str:
    bad = set(worst)
    shown = [(c, t) for c, t in _CELLS if c != "output_impact" or c in df.columns]
    head = "".join(f"<th>{_e(t)}</th>" for t in ("#", "float op", "module", *(t for _, t in shown)))
    rows = []
    for k in range(len(df)):
        row = df.iloc[k]
        cells = []
        for col, _ in shown:
            text, v = _fmt_cell(col, row.get(col))
            cells.append(f"<td class='num' data-v='{v}'>{text}</td>")
        cls = " class='culprit'" if k in bad else ""
        rows.append(f"<tr id='q{k}'{cls}><td class='num' data-v='{k}'>{k}</td><td>{_e(_name(row))}</td>"
                    f"<td>{_e(row.get('module') or '')}</td>{''.join(cells)}</tr>")
    return (f"<div class='scroll'><table id='quant' class='sortable'><thead><tr>{head}</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></div>")


def _answer(df: pd.DataFrame, worst: list[int]) -> str:
    """The section's first lines: the worst layer, where the output is lost (accumulated SQNR <= 0 dB), and the
    rows the ranking sets apart (no float signal, exact)."""
    found = ranking(df, 1)
    out = []
    if worst:
        row = df.iloc[worst[0]]
        module = row.get("module") or ""
        out.append(f"<p class='answer'>Worst layer: <a href='#q{worst[0]}'><b>{_e(_name(row))}</b></a>"
                   f"{' in <code>' + _e(module) + '</code>' if module else ''} (local SQNR "
                   f"{_fmt_db(_db(row['local_sqnr_db']))} dB: its own quantization adds the most error).</p>")
    lost = found.attrs.get("lost_from")
    if lost:
        out.append(f"<p class='answer lost'><b>The output is lost from {_e(lost)} on</b> (accumulated SQNR "
                   "&le; 0 dB: the quantization noise is as large as the float signal from there).</p>")
    apart = found.attrs.get("no_signal")
    if apart is not None and len(apart):
        reasons = list(apart["reason"])
        silent = [i for i, r in zip(apart.index, reasons, strict=True) if not r.startswith(("exact", "no local"))]
        exact = sum(r.startswith("exact") for r in reasons)
        names = ", ".join(_e(apart.at[i, "module"] if "module" in apart.columns and apart.at[i, "module"]
                             else _name(apart.loc[i])) for i in silent[:5])
        names = f": {names}{' ...' if len(silent) > 5 else ''}" if names else ""
        other = len(reasons) - len(silent) - exact
        parts = [f"{len(silent)} without a float signal (local SQNR -inf: the float output is zero there, any "
                 f"error is infinite relative to it){names}" if silent else "",
                 f"{exact} exact (no quantization error)" if exact else "",
                 f"{other} not compared" if other else ""]
        out.append(f"<p class='nosignal'>Not ranked: {'; '.join(p for p in parts if p)}.</p>")
    return "".join(out)


def quant_section(df: pd.DataFrame, top: int = 5) -> str:
    """The HTML of the quantization section of a float-reference gap table: the answer first (the worst layer,
    where the output is lost, what is not ranked), then the worst layers, the chart and the per-layer table."""
    worst = worst_rows(df, top)
    samples = df.attrs.get("samples")
    note = (f"<p>{len(df)} float ops, {_e(samples)} sample(s); {int(df['quantized'].sum())} quantized. SQNR: "
            "signal over quantization noise, over all samples (higher is better; 6 dB per bit).</p>")
    impact = ""
    if "output_impact" in df.columns:
        impact = ("<h3>Costing the output most (each layer's own error alone injected into the float model: output "
                  "noise / output signal)</h3>" + _impact_list(df, top))
    return ("<h2 id='quant'>Quantization error per layer (against the float model)</h2>" + _answer(df, worst)
            + "<h3>Worst layers (lowest local SQNR)</h3>" + _worst_list(df, worst) + impact + note
            + sqnr_chart_svg(df, worst) + _table(df, worst))


def _impact_list(df: pd.DataFrame, top: int) -> str:
    vals = [(k, _db(v)) for k, v in enumerate(df["output_impact"])]
    ranked = sorted(((k, v) for k, v in vals if v is not None), key=lambda kv: -kv[1])[:top]
    items = "".join(f"<li><a href='#q{k}'><b>{_e(_name(df.iloc[k]))}</b></a>: {v:.3e}</li>" for k, v in ranked)
    return f"<ol class='culprits impact'>{items}</ol>"


def is_float_reference(df: pd.DataFrame | None) -> bool:
    """Whether ``df`` is a float-reference gap table (``reference_graph="float"``)."""
    return df is not None and (df.attrs.get("reference_graph") == "float"
                               or all(c in df.columns for c in QUANT_COLUMNS))
