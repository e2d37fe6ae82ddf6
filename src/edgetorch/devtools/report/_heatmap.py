"""The report's section for a low-bit generation against the float model (``Inspector.quantized_generation_table``):
per token (execution) x quantized layer heat maps of the local and the accumulated SQNR, the first token whose
greedy choice differs from the float model's and the layer most responsible."""

from __future__ import annotations

import math

import pandas as pd

from ._charts import _e

__all__ = ["heatmap_html", "quant_generation_section", "share_colour", "sqnr_colour"]

#: SQNR (dB) at or below which a cell is fully red, and at or above which it is fully green
LOW_DB, HIGH_DB = 5.0, 30.0


def sqnr_colour(db: float) -> str:
    """Red (low SQNR, much error) through yellow to green (high SQNR); grey when unknown."""
    if db != db:
        return "#dddddd"
    t = 1.0 if math.isinf(db) and db > 0 else min(1.0, max(0.0, (db - LOW_DB) / (HIGH_DB - LOW_DB)))
    r, g = (255, int(80 + 175 * 2 * t)) if t < 0.5 else (int(255 - 175 * 2 * (t - 0.5)), 255)
    return f"#{r:02x}{g:02x}60"


def share_colour(share: float) -> str:
    """A share of the logit error: green (none) through yellow to red (half of it or more); grey when unknown."""
    return "#dddddd" if share != share else sqnr_colour(HIGH_DB - min(1.0, max(0.0, 2 * share)) * (HIGH_DB - LOW_DB))


def _pct(share: float) -> str:
    return "-" if share != share else f"{100 * share:.1f}"


def _fmt(db: float) -> str:
    return "-" if db != db else ("inf" if math.isinf(db) and db > 0 else f"{db:.1f}")


def heatmap_html(df: pd.DataFrame, value: str, first: int | None, responsible: str | None) -> str:
    """One heat map: a row per execution, a column per layer (graph order), cells coloured by ``value`` (an SQNR
    in dB, or ``logit_share`` in percent)."""
    colour, fmt, unit = (share_colour, _pct, "%") if value == "logit_share" else (sqnr_colour, _fmt, " dB")
    layers = list(dict.fromkeys(df["layer"]))
    grid = df.pivot(index="execution", columns="layer", values=value)
    methods = df.drop_duplicates("execution").set_index("execution")["method"]
    outline = " style='outline:2px solid #000'"
    head = "".join(f"<th class='rot'{outline if lay == responsible else ''}><div>{_e(lay)}</div></th>"
                   for lay in layers)
    out = [f"<div class='scroll'><table class='heatmap' data-value='{_e(value)}'><thead><tr><th>call</th>{head}"
           "</tr></thead><tbody>"]
    for k in grid.index:
        mark = " style='font-weight:bold'" if k == first else ""
        cells = "".join(f"<td class='num' style='background:{colour(float(grid.at[k, lay]))}' "
                        f"title='{_e(lay)}, call {k}: {fmt(float(grid.at[k, lay]))}{unit}'>"
                        f"{fmt(float(grid.at[k, lay]))}</td>" for lay in layers)
        out.append(f"<tr><td{mark}>{k} {_e(methods.get(k, ''))}{' &larr;' if k == first else ''}</td>{cells}</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def quant_generation_section(df: pd.DataFrame) -> str:
    """The whole section: the verdict, the per-call tokens and the two heat maps."""
    first, responsible = df.attrs.get("first_divergence"), df.attrs.get("responsible_layer")
    verdict = ("the greedy tokens agree with the float model's on every call" if first is None else
               f"call {first} is the first whose greedy choice differs from the float model's")
    out = ["<h2 id='qgen'>Quantized generation against the float model</h2>",
           f"<p>{_e(verdict)}; layer most responsible: <b>{_e(responsible or '-')}</b> (outlined). The float "
           "model ran on the runtime's own inputs (its tokens). Local SQNR: the float layer fed the runtime's input "
           "against the runtime's output (the error the layer adds); accumulated: the float model's output of the "
           f"layer against the runtime's. Colours from red ({LOW_DB:g} dB) to green ({HIGH_DB:g} dB).</p>"]
    tokens = df.attrs.get("tokens")
    if isinstance(tokens, pd.DataFrame) and not tokens.empty:
        out.append("<table class='generation'><thead><tr><th>call</th><th>method</th><th>runtime token</th>"
                   "<th>float token</th><th>logits SQNR (dB)</th></tr></thead><tbody>")
        for t in tokens.itertuples():
            style = " style='background:#ffd0d0'" if t.runtime_token != t.float_token else ""
            out.append(f"<tr{style}><td class='num'>{t.execution}</td><td>{_e(t.method)}</td>"
                       f"<td class='num'>{t.runtime_token}</td><td class='num'>{t.float_token}</td>"
                       f"<td class='num'>{_fmt(float(t.logits_sqnr_db))}</td></tr>")
        out.append("</tbody></table>")
    out += ["<h3>Local SQNR (dB) per call and layer</h3>", heatmap_html(df, "local_sqnr_db", first, responsible),
            "<h3>Accumulated SQNR (dB) per call and layer</h3>", heatmap_html(df, "sqnr_db", first, responsible)]
    if "logit_share" in df.columns:
        out += ["<h3>Share of the logit error (%) per call and layer: the layer's own error alone, injected into the "
                "float model</h3>", heatmap_html(df, "logit_share", first, responsible)]
    return "".join(out)
