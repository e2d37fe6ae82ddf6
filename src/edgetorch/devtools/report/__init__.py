"""A one-file HTML report of a numeric-gap analysis: the culprits, the edge graph coloured by the error each op
adds, the gap table (sortable, filterable), per-sample and per-step charts, and the op profile.

Colours and culprits use the gap table's scale-aware columns when it has them (``rel_error``,
``local_rel_error``, ``noise_floor``, ``verdict``): a node is grey when the runtime reproduces the op exactly,
green when its local error is within the op's rounding noise, orange to red when it is beyond (by how many
times the noise floor). Culprits (pink rows, outlined nodes with a star) are the ops that add error beyond
noise (``find_culprits``), never the largest accumulated gaps, which sit downstream of the cause. Without the
scale-aware columns the nodes are coloured by local gap on a relative scale and no op is called a culprit.

Graph. ``write_report(..., etrecord=record)`` (or ``graph=extract_graph(record)``) draws the edge program of
the table's method: one node per debug handle (``devtools.graph_view``), delegate partitions boxed, long graphs
split into pages at module boundaries. Every gap-table row other than a ``DELEGATE_CALL`` row belongs to exactly
one node (the op of its group's last handle; the finest row when several name it); a ``DELEGATE_CALL`` row
belongs to its partition box. Click a node for its row, source line and stack trace; click a row's ``#`` to
find its node.

Integer and bool rows are compared exactly (``metric`` ``MISMATCH_FRACTION``, with their ``mismatches``
count): the table shows them with their metric, the gap chart leaves them out, and any mismatch marks them.
Everything is inline (SVG, CSS, a few lines of JavaScript): the file can be mailed or attached as is.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from typing import Any

import pandas as pd

from edgetorch._fileio import atomic_write
from edgetorch.devtools.graph_view import EdgeGraph, GraphViewError, extract_graph, layout, rows_for_nodes
from edgetorch.errors import EdgeTorchError
from edgetorch.formats.handles import DELEGATE_CALL

from ._assets import CSS, JS
from ._charts import (
    _e,
    _exact,
    _fmt,
    _short_source,
    _val,
    gap_chart_svg,
    generation_chart_svg,
    per_sample_chart_svg,
    profile_chart_svg,
    samples_chart_svg,
    stat_columns,
)
from ._graph import NodeStyle, graph_html
from ._heatmap import quant_generation_section
from ._quant import is_float_reference, quant_section

__all__ = ["ReportError", "culprit_rows", "gap_chart_svg", "generation_chart_svg", "is_scaled", "profile_chart_svg",
           "row_colours", "samples_chart_svg", "write_report"]

log = logging.getLogger(__name__)
SCALE = ("rel_error", "local_rel_error", "noise_floor", "verdict")


class ReportError(EdgeTorchError, ValueError):
    """A bad argument to ``write_report``."""


# -- severity: colour of a row / node ------------------------------------------------------------------------

def _mix(a: str, b: str, t: float) -> str:
    t = min(max(t, 0.0), 1.0)
    ca, cb = (tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in (a, b))
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb))


def _times(r: float | None) -> str:
    return "" if r is None else f"{r:.3g} ×"


def _ratio(row: pd.Series) -> float | None:
    lrel, floor = _val(row.get("local_rel_error")), _val(row.get("noise_floor"))
    if lrel is None or floor is None or floor <= 0:
        return None
    return lrel / floor


def _severity(row: pd.Series, exact: bool, scaled: bool, span: tuple[float, float]) -> tuple[str, float, str]:
    """(fill colour, rank, one-line description) of a row: on the noise scale when ``scaled``, else on the
    table's own log range of local gaps ``span``."""
    if scaled and row.get("verdict") in ("exact", "noise", "real"):
        v, r = row["verdict"], _ratio(row)
        if v == "exact":
            return "#e9ecef", 0.5, "exact (bit-identical to the reference)"
        if v == "noise":
            return "#b2f2bb", 1.0, f"within rounding noise ({_times(r)} the noise floor)" if r else "noise"
        t = math.log10(r) / 4 if r and r > 1 else 1.0
        return _mix("#ffc078", "#c92a2a", t), 2.0 + t, (f"{_times(r)} the noise floor" if r else
                                                         "mismatching elements")
    lg = _val(row.get("local_gap"))
    if exact:
        return ("#c92a2a", 3.0, "mismatching elements") if lg else ("#e9ecef", 0.5, "exact")
    if lg is None or not math.isfinite(lg):
        return "#ffffff", 0.0, "no local gap"
    if lg == 0:
        return "#e9ecef", 0.5, "local gap 0"
    lo, hi = span
    t = (math.log10(lg) - lo) / (hi - lo) if hi > lo else 1.0
    return _mix("#fff3bf", "#f08c00", t), 1.0 + t, f"local gap {_fmt(lg)} (no noise scale)"


def _span(df: pd.DataFrame) -> tuple[float, float]:
    pos = [v for v in (_val(x) for x in df.get("local_gap", [])) if v is not None and v > 0 and math.isfinite(v)]
    return (math.log10(min(pos)), math.log10(max(pos))) if pos else (0.0, 0.0)


def is_scaled(df: pd.DataFrame) -> bool:
    """Whether the gap table has the scale-aware columns (``local_rel_error``, ``noise_floor``, ``verdict``)."""
    return all(c in df for c in ("local_rel_error", "noise_floor", "verdict"))


def row_colours(df: pd.DataFrame) -> list[str]:
    """The fill colour of each row of a gap table, as the report draws its node (see the module docstring)."""
    exact, scaled, span = _exact(df), is_scaled(df), _span(df)
    return [_severity(row, exact[k], scaled, span)[0] for k, (_, row) in enumerate(df.iterrows())]


def _legend(scaled: bool) -> str:
    items = ([("#e9ecef", "exact"), ("#b2f2bb", "within rounding noise"), ("#ffc078", "beyond noise (×1)"),
              (_mix("#ffc078", "#c92a2a", 0.5), "×100"), ("#c92a2a", "×10⁴ the noise floor")] if scaled else
             [("#e9ecef", "local gap 0"), ("#fff3bf", "smallest local gap"), ("#f08c00", "largest local gap")])
    items.append(("#ffffff", "not compared (dashed)"))
    txt = "".join(f'<span><i class="sw" style="background:{c}"></i>{_e(t)}</span>' for c, t in items)
    note = ("" if scaled else "<span>(no noise scale in this gap table: colours are relative, no culprit "
            "named)</span>")
    return (f'<div class="legend">{txt}<span><b style="color:#a61e4d">★</b> culprit</span>'
            f'<span><i class="sw" style="border:1px dashed {"#1971c2"}"></i>delegate partition</span>{note}</div>')


# -- culprits ------------------------------------------------------------------------------------------------

def culprit_rows(df: pd.DataFrame, culprits: pd.DataFrame | None = None) -> list[Any]:
    """Index labels of the culprit rows, worst first: ``culprits`` (a ``find_culprits`` result) when given,
    else ``inspector.culprits.find_culprits(df)``; only rows whose ``verdict`` is ``"real"`` (beyond noise)
    are kept, and none when the table has no ``verdict`` column (no noise scale: nothing to call a culprit)."""
    if "verdict" not in df:
        return []
    if culprits is None:
        culprits = _find_culprits(df)
    real = df["verdict"] == "real"
    return [i for i in culprits.index if i in df.index and real.loc[i]]


def _find_culprits(df: pd.DataFrame) -> pd.DataFrame:
    try:
        from edgetorch.devtools.inspector.culprits import find_culprits

        return find_culprits(df, top=len(df))
    except (ImportError, EdgeTorchError):  # a table without the columns find_culprits needs
        real = df[df["verdict"] == "real"]
        return real.loc[sorted(real.index, key=lambda i: -(_ratio(df.loc[i]) or math.inf))]


def _culprit_section(df: pd.DataFrame, order: list[int], node_of: dict[int, str], scaled: bool) -> str:
    out = ["<h2 id='culprits'>Culprits: ops that add error beyond noise</h2>"]
    if not scaled:
        out.append("<p>This gap table has no noise scale (<code>local_rel_error</code>, <code>noise_floor</code>, "
                   "<code>verdict</code>): no op is called a culprit. Sort the table by <i>local_gap</i> to see "
                   "which ops add the most error.</p>")
        return "".join(out)
    if not order:
        out.append("<p>None: every op's local error is within its rounding noise (or exact).</p>")
        return "".join(out)
    first = min(order)
    out.append(f"<p>{len(order)} op{'s' if len(order) > 1 else ''}, worst first; the first in execution order is "
               f"<a href='#r{first}'>row {first}</a> (everything after it may inherit its error).</p>"
               "<ol class='culprits'>")
    for k in order:
        row = df.iloc[k]
        node = node_of.get(k)
        link = f" data-node='{_e(node)}'" if node else ""
        where = ", ".join(x for x in (f"inside {row.get('delegate')}" if row.get("delegate") else "",
                                      f"module {row.get('module')}" if row.get("module") else "") if x)
        out.append(f"<li><a href='#r{k}'>row {k}</a> <b{link}>{_e(', '.join(map(str, row['aot_ops']))[:160])}</b>: "
                   f"local error {_fmt(_val(row.get('local_rel_error')))} = {_times(_ratio(row))} its noise floor "
                   f"{_fmt(_val(row.get('noise_floor')))}; accumulated {_fmt(_val(row.get('rel_error')))}"
                   f"{' (' + _e(where) + ')' if where else ''}<br><code>{_e(_short_source(row.get('source', '')))}"
                   "</code></li>")
    out.append("</ol>")
    return "".join(out)


# -- the gap table -------------------------------------------------------------------------------------------

class _Traces:
    """Deduplicated stack traces (a ViT's twelve blocks share theirs): the table and the graph refer to them by
    index into the ``traces`` list of the page's JSON block."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def add(self, text: str | None) -> int | None:
        if not text:
            return None
        if text not in self._index:
            self._index[text] = len(self.items)
            self.items.append(text)
        return self._index[text]

    def refs(self, traces: dict[str, str] | None) -> str:
        return ",".join(str(k) for k in (self.add(f"{n}:\n{t}") for n, t in (traces or {}).items()) if k is not None)


def _ref(k: int | None) -> str:
    return "" if k is None else str(k)


def _num_td(v: Any) -> str:
    f = _val(v)
    return f"<td class='num' data-v='{'' if f is None else f}'>{_fmt(f)}</td>"


def _columns(df: pd.DataFrame) -> list[str]:
    stats = [c for cs in stat_columns(df).values() for c in cs.values()]
    freq = [c for c in ("culprit_frequency", "top1_frequency", "mean_culprit_rank") if c in df]
    return (["#", "aot_ops", "runtime_ops", "gap", "local_gap"] + [c for c in SCALE if c in df] + freq + stats +
            ["metric", "mismatches", "dtype", "shape", "delegate", "module", "source", "stack trace"])


def _cell(c: str, row: pd.Series, traces: _Traces) -> str:
    v = row.get(c)
    if c in ("aot_ops", "runtime_ops"):
        return f"<td class='w'>{_e(', '.join(map(str, v or [])))}</td>"
    if c == "mismatches":
        return f"<td class='num'>{'' if v is None or v != v else int(v)}</td>"
    if c == "source":
        return f"<td class='w'>{_e(_short_source(v or ''))}</td>"
    if c == "stack trace":
        return f"<td><details data-t='{traces.refs(row.get('stacktraces'))}'><summary>show</summary></details></td>"
    if c in ("metric", "dtype", "shape", "delegate", "module", "verdict"):
        return f"<td>{_e('' if v is None or v != v else v)}</td>"
    return _num_td(v)


def _table_section(df: pd.DataFrame, culprits: set[int], first: int | None, node_of: dict[int, str],
                   traces: _Traces) -> str:
    cols = _columns(df)
    out = ["<h2 id='table'>Per-op gaps</h2><div class='filters'><input id='flt' type='search' "
           "placeholder='filter: op, module, source…' aria-label='filter rows'><select id='fv' aria-label='rows'>"
           "<option value=''>all rows</option><option value='culprit'>culprits</option><option value='real'>"
           "beyond noise</option><option value='noise'>noise</option><option value='exact'>exact</option>"
           f"<option value='delegate'>in a delegate</option></select><span id='fcount'>{len(df)} rows</span></div>",
           "<div class='scroll'><table id='gaps' class='sortable'><thead><tr>",
           "".join(f"<th>{_e(c)}</th>" for c in cols), "</tr></thead><tbody>"]
    for k, (_, row) in enumerate(df.iterrows()):
        cls = "first" if first == k else ("culprit" if k in culprits else "")
        node = node_of.get(k)
        attrs = (f" id='r{k}' class='{cls}' data-verdict='{_e(row.get('verdict') or '')}'"
                 f" data-d='{1 if row.get('delegate') else 0}'" + (f" data-node='{_e(node)}'" if node else ""))
        cells = "".join(_cell(c, row, traces) for c in cols[1:])
        out.append(f"<tr{attrs}><td class='num'>{k}</td>{cells}</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _first_divergence(df: pd.DataFrame, threshold: float | None) -> int | None:
    if threshold is None:
        return None
    exact = _exact(df)
    for i, g in enumerate(df["gap"]):
        v = _val(g)
        if v is not None and (v > 0 if exact[i] else v > threshold):
            return i
    return None


# -- the graph -----------------------------------------------------------------------------------------------

def _graph_section(graph: EdgeGraph, df: pd.DataFrame, culprits: set[int], scaled: bool, traces: _Traces,
                   max_page_nodes: int) -> tuple[str, dict[int, str], dict[str, Any]]:
    groups = [(k, tuple(r.get("aot_debug_handle") or ()),
               int(r["instruction_id"]) if r.get("kind") == DELEGATE_CALL else None)
              for k, (_, r) in enumerate(df.iterrows())]
    node_row, part_row = rows_for_nodes(graph, groups)
    lay = layout(graph, max_page_nodes)
    exact, span = _exact(df), _span(df)
    graph_nodes = graph.by_id()
    styles = {}
    for nid, k in node_row.items():
        row = df.iloc[k]
        fill, rank, what = _severity(row, exact[k], scaled, span)
        ops = [str(o) for o in row["aot_ops"] or []]
        tip = f"{', '.join(ops)[:80]} (row {k}; edge ops {graph_nodes[nid].op}): {what}"
        label = re.sub(r"_\d+$", "", ops[-1]) if ops else ""
        styles[nid] = NodeStyle(fill, tip, k in culprits, k, 4 if k in culprits else rank, label)
    data = {n.id: {"op": n.op, "names": n.names, "h": n.debug_handle, "part": n.partition, "mod": n.module,
                   "src": _short_source(n.source), "tr": _ref(traces.add(n.stack_trace))} for n in graph.nodes}
    html = ("<h2 id='graph'>Edge graph</h2><p>One node per op (debug handle) of the edge program "
            f"'{_e(graph.method)}': {len(graph.nodes)} nodes, {len(node_row)} with a gap-table row, "
            f"{len(lay.pages)} page{'s' if len(lay.pages) > 1 else ''}.</p>" +
            graph_html(graph, lay, styles, part_row, _legend(scaled)))
    return html, {k: nid for nid, k in node_row.items()}, data


def _resolve_graph(graph: EdgeGraph | None, etrecord: Any, df: pd.DataFrame) -> EdgeGraph | None:
    """The graph to draw: ``graph``, else the ETRecord's edge graph of the table's method; None for a table
    whose handles are not the edge program's (a comparison with the float program numbers its own ops)."""
    if "aot_debug_handle" not in df or "float_debug_handle" in df:
        return None
    method = df.attrs.get("method", "forward")
    if graph is not None or etrecord is None:
        return graph
    try:
        return extract_graph(etrecord, method)
    except (GraphViewError, EdgeTorchError, KeyError) as e:
        log.warning("report: no graph view of method %r: %s", method, e)
        return None


# -- sections ------------------------------------------------------------------------------------------------

def _generation_section(gen: pd.DataFrame) -> str:
    distance = gen.attrs.get("distance", "gap")
    out = [f"<h2 id='steps'>Final-output gap ({_e(distance)}) per execution</h2>", generation_chart_svg(gen),
           "<div class='scroll'><table class='sortable generation'><thead><tr><th>execution</th><th>method</th>"
           "<th>run</th><th>output gap</th><th>worst local gap</th><th>worst op</th></tr></thead><tbody>"]
    for _, r in gen.iterrows():
        out.append(f"<tr><td class='num'>{r['execution']}</td><td>{_e(r['method'])}</td>"
                   f"<td class='num'>{r['run']}</td>{_num_td(r['output_gap'])}{_num_td(r['worst_local_gap'])}"
                   f"<td>{_e(', '.join(map(str, r['worst_op'] or [])))}</td></tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _sample_count(df: pd.DataFrame) -> int | None:
    samples = df.attrs.get("samples")
    if isinstance(samples, (pd.DataFrame, list, tuple)):
        return len(samples)
    return int(samples) if isinstance(samples, (int, float)) and samples == samples else None


def _stability(df: pd.DataFrame) -> str:
    """How stable the culprit ranking is over the samples (``rank_stability``, ``top1_agreement``), and the ops
    some sample names a culprit, by how often."""
    a = df.attrs
    parts = []
    if a.get("rank_stability") is not None:
        parts.append(f"culprit-set stability {a['rank_stability']:.2f} (mean Jaccard similarity of each sample's "
                     "culprits with the aggregate's; 1 = every sample names the same)")
    if a.get("top1_agreement") is not None:
        parts.append(f"top-1 agreement {a['top1_agreement']:.0%}")
    out = f"<p>{_e('; '.join(parts))}.</p>" if parts else ""
    if "culprit_frequency" in df:
        named = df[df["culprit_frequency"].fillna(0) > 0].sort_values("culprit_frequency", ascending=False)
        items = "".join(f"<li>{_e(', '.join(map(str, r['aot_ops']))[:100])}: a culprit in "
                        f"{r['culprit_frequency']:.0%} of the samples, first in {r['top1_frequency']:.0%}</li>"
                        for _, r in named.head(10).iterrows())
        out += (f"<ul>{items}</ul>" if items else "<p>No sample names a culprit.</p>")
    return out


def _samples_section(df: pd.DataFrame) -> str:
    """Per-sample bars (``df.attrs["samples"]`` as a frame) and the per-op spread over the samples (mean / p99 /
    max columns); nothing for a single sample without statistics columns."""
    samples, n = df.attrs.get("samples"), _sample_count(df)
    per_op = samples_chart_svg(df)
    if not per_op and not isinstance(samples, pd.DataFrame) and (n or 0) < 2:
        return ""
    out = [f"<h2 id='samples'>Over {_e(n if n is not None else 'several')} samples</h2>", _stability(df)]
    if isinstance(samples, pd.DataFrame):
        out.append(per_sample_chart_svg(samples))
    out.append(per_op or "<p>No per-op statistics columns (mean / max / p99) in this table.</p>")
    return "".join(out)


def _observer_effect(df: pd.DataFrame) -> str:
    effect = df.attrs.get("observer_effect")
    if effect is None:
        return ""
    from edgetorch.formats.etdump import OBSERVER_EFFECT_TOLERANCE

    changed = effect > OBSERVER_EFFECT_TOLERANCE
    note = ("exposing the delegate's intermediates changed its final outputs: rows inside the delegate show the "
            "observed (differently fused) computation" if changed else
            "exposing the delegate's intermediates left its final outputs within the tolerance")
    return (f"<p class='{'warn' if changed else ''}'><b>Observer effect</b>: {effect:.3g} relative (tolerance "
            f"{OBSERVER_EFFECT_TOLERANCE:g}); {_e(note)}.</p>")


def _not_compared(cov: Any) -> str:
    if cov is None or not cov.unmatched:
        return ""
    out = ["<h2>Not compared</h2><div class='scroll'><table class='sortable'><thead><tr><th>side</th><th>ops</th>"
           "<th>handles</th><th>reason</th></tr></thead><tbody>"]
    for u in cov.unmatched:
        out.append(f"<tr><td>{_e(u['side'])}</td><td>{_e(', '.join(map(str, u['ops'])))}</td>"
                   f"<td>{_e(u['handles'])}</td><td>{_e(u['reason'])}</td></tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _gap_sections(df: pd.DataFrame, culprits: pd.DataFrame | None, graph: EdgeGraph | None,
                  threshold: float | None, traces: _Traces, max_page_nodes: int) -> tuple[list[str], dict]:
    pos = {label: k for k, label in enumerate(df.index)}
    order = [pos[i] for i in culprit_rows(df, culprits)]
    attrs = dict(df.attrs)
    df = df.reset_index(drop=True)
    df.attrs.update(attrs)
    scaled = is_scaled(df)
    culprit_pos = set(order)
    distance = df.attrs.get("distance", "gap")
    node_of: dict[int, str] = {}
    nodes: dict[str, Any] = {}
    graph_part = ""
    if graph is not None:
        graph_part, node_of, nodes = _graph_section(graph, df, culprit_pos, scaled, traces, max_page_nodes)
    cov = df.attrs.get("coverage")
    out = [_culprit_section(df, order, node_of, scaled), _samples_section(df), graph_part,
           f"<h2 id='chart'>Numeric gap ({_e(distance)}) along the graph</h2>", gap_chart_svg(df),
           f"<p>{_e(cov.summary())}</p>" if cov is not None else "", _observer_effect(df),
           _table_section(df, culprit_pos, _first_divergence(df, threshold), node_of, traces), _not_compared(cov)]
    return out, nodes


def _summary(summary: dict[str, Any] | None, df: pd.DataFrame | None) -> str:
    items = dict(summary or {})
    if df is not None and df.attrs.get("samples") is not None and "samples" not in items:
        s = df.attrs["samples"]
        items["samples"] = len(s) if isinstance(s, (pd.DataFrame, list, tuple)) else s
    if not items:
        return ""
    return "<table class='summary'>" + "".join(f"<tr><td><b>{_e(k)}</b></td><td>{_e(v)}</td></tr>"
                                                for k, v in items.items()) + "</table>"


_SELF = ("<h2 id='self'>The runtime against the quantized program itself</h2><p>The sections below compare the "
         "runtime with the (fake-)quantized program it ran, not with the float model: they find kernel and runtime "
         "faults, not quantization error (that is the section above). On the portable backend they are near 0.</p>")


def write_report(path: str | os.PathLike, gap_df: pd.DataFrame | None, profile_df: pd.DataFrame | None = None,
                 title: str = "edgetorch numerical debugging report", summary: dict[str, Any] | None = None,
                 threshold: float | None = None, generation_df: pd.DataFrame | None = None, *,
                 etrecord: Any = None, graph: EdgeGraph | None = None, culprits: pd.DataFrame | None = None,
                 max_page_nodes: int = 90, quant_df: pd.DataFrame | None = None,
                 quant_generation_df: pd.DataFrame | None = None) -> str:
    """Writes the HTML report atomically; returns the path.

    ``gap_df``: a ``calculate_numeric_gap`` table (None: profile and per-step sections only). ``etrecord`` or
    ``graph`` (``graph_view.extract_graph``) adds the graph of the table's method; ``culprits`` (a
    ``find_culprits`` result) names the culprits, else they are derived from the ``verdict`` column.
    ``threshold`` marks the first row whose accumulated gap exceeds it. ``generation_df``
    (``Inspector.generation_gaps()``) adds the final-output gap per execution when it has more than one.
    ``max_page_nodes`` bounds the nodes drawn on one graph page. ``quant_df``: a float-reference gap table
    (``calculate_numeric_gap(distance, reference_graph="float")``) adds the quantization section: the worst
    layers, local and accumulated SQNR along the graph, and the per-layer table. With ``quant_df`` (or a
    float-reference table passed as ``gap_df``) the report leads with that section, the answer for an INT8
    program: the worst layer, where the output is lost, what is not ranked; the comparison of the runtime with
    the quantized program itself (``gap_df``) follows it. ``quant_generation_df``
    (``Inspector.quantized_generation_table``) leads with a low-bit generation against the float model: the
    per-token x per-layer heat maps of local and accumulated SQNR."""
    if max_page_nodes < 2:
        raise ReportError(f"max_page_nodes must be >= 2, got {max_page_nodes}")
    if gap_df is not None and not isinstance(gap_df, pd.DataFrame):
        raise ReportError(f"gap_df must be a pandas DataFrame (calculate_numeric_gap), got {type(gap_df).__name__}")
    if quant_df is not None and not (isinstance(quant_df, pd.DataFrame) and is_float_reference(quant_df)):
        raise ReportError("quant_df must be a float-reference gap table (calculate_numeric_gap(..., "
                          f"reference_graph='float')), got {type(quant_df).__name__}")
    if quant_df is None and gap_df is not None and is_float_reference(gap_df):  # the float table as gap_df
        gap_df, quant_df, culprits = None, gap_df, None
    traces = _Traces()
    body, nodes = [], {}
    head_df = gap_df if gap_df is not None else quant_df
    if generation_df is not None and len(generation_df) > 1:
        body.append(_generation_section(generation_df))
    if gap_df is not None:
        parts, nodes = _gap_sections(gap_df, culprits, _resolve_graph(graph, etrecord, gap_df), threshold, traces,
                                     max_page_nodes)
        body = parts[:1] + body + parts[1:]
    if quant_df is not None:  # the answer of an INT8 program is its float-model ranking: first
        body = [quant_section(quant_df)] + ([_SELF] if body else []) + body
    if quant_generation_df is not None:
        if not isinstance(quant_generation_df, pd.DataFrame) or "local_sqnr_db" not in quant_generation_df.columns:
            raise ReportError("quant_generation_df must be an Inspector.quantized_generation_table() table, got "
                              f"{type(quant_generation_df).__name__}")
        body = [quant_generation_section(quant_generation_df)] + body
    if profile_df is not None and not profile_df.empty:
        body += ["<h2 id='profile'>Profile: slowest ops (median)</h2>", profile_chart_svg(profile_df)]
    sections = (("qgen", "quantized generation"), ("quant", "quantization"), ("self", "program vs itself"),
                ("culprits", "culprits"), ("samples", "samples"), ("steps", "steps"), ("graph", "graph"),
                ("table", "table"), ("profile", "profile"))
    nav = "".join(f"<a href='#{a}'>{t}</a>" for a, t in sections if f"id='{a}'" in "".join(body))
    data = json.dumps({"nodes": nodes, "traces": traces.items}, separators=(",", ":")).replace("</", "<\\/")
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width,initial-scale=1'><title>{_e(title)}</title><style>{CSS}</style></head>"
            f"<body><h1>{_e(title)}</h1><nav>{nav}</nav>{_summary(summary, head_df)}{''.join(body)}"
            f"<script type='application/json' id='edata'>{data}</script><script>{JS}</script></body></html>")
    atomic_write(path, [page.encode("utf-8")])
    return os.fspath(path)
