"""Terminal output of ``edgetorch inspect --reference-graph float``: the per-layer quantization table against
the float model and its worst layers.

Every value is printed as text (no rich markup), SQNR in dB with one decimal (``inf`` when the runtime matches
the float op exactly), and the module path next to the op so that the layer can be found in the model's code.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgetorch.cli._table import ops_text, sci

_COLUMNS = (("#", None), ("float op", "aot_ops"), ("module", "module"), ("SQNR dB", "sqnr_db"),
            ("local SQNR dB", "local_sqnr_db"), ("RMSE/scale", "rmse_over_scale"),
            ("weight SQNR dB", "weight_sqnr_db"), ("output impact", "output_impact"), ("gap", "gap"))


def db(v: Any) -> str:
    """``41.3``; ``inf`` for no error; ``""`` without a value."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return ""
    if math.isnan(f):
        return ""
    return f"{f:.1f}" if math.isfinite(f) else ("inf" if f > 0 else "-inf")


def _cell(key: str | None, i: int, row: Any) -> str:
    if key is None:
        return str(i)
    v = row.get(key)
    if key == "aot_ops":
        return escape(ops_text(v, 40))
    if key == "module":
        return escape(ops_text(v or "", 36))
    if key in ("gap", "output_impact"):
        return sci(v)
    if key == "rmse_over_scale":
        return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.3f}"
    return db(v)


def print_quant_table(console: Console, df: Any, title: str, rows: int, worst: set[int]) -> None:
    """The table in graph order (``rows`` first rows; 0 = all), the worst layers marked with ``*``."""
    distance = df.attrs.get("distance", "gap")
    console.print(title, highlight=False, markup=False)  # a line of its own: a table title wraps to its width
    table = Table(show_lines=False, pad_edge=False)
    columns = [(n, k) for n, k in _COLUMNS if k != "output_impact" or k in df.columns]
    for name, key in columns:
        table.add_column(f"{distance} gap" if key == "gap" else name, no_wrap=key not in ("aot_ops", "module"),
                         justify="right" if key not in ("aot_ops", "module") else "left", overflow="ellipsis")
    shown = df if rows == 0 else df.head(rows)
    for i, (_, row) in enumerate(shown.iterrows()):
        cells = [_cell(key, i, row) for _, key in columns]
        if i in worst:
            cells[0] += "*"
        table.add_row(*cells)
    console.print(table)
    if rows and len(df) > rows:
        console.print(f"... {len(df) - rows} more rows (--rows 0 shows all)", highlight=False, markup=False)


def print_worst_layers(console: Console, df: Any, ranked: Any, fgm: Any) -> None:
    """One line per worst layer (``find_culprits``' order), with the module, the weight's own error and the
    evidence."""
    samples = df.attrs.get("samples")
    if ranked is None or ranked.empty:
        console.print("no quantized op in the table: nothing to rank", highlight=False, markup=False)
        return
    console.print(f"worst layers (find_culprits: a layer whose own quantization is abnormal where the accumulated "
                  f"SQNR drops, then the steepest drops; {samples} sample(s)):", highlight=False, markup=False)
    pos = {label: k for k, label in enumerate(df.index)}
    for rank, (label, row) in enumerate(ranked.iterrows(), 1):
        module = f" in {row.get('module')}" if row.get("module") else ""
        weight = db(row.get("weight_sqnr_db"))
        console.print(f"  {rank}. #{pos[label]} {ops_text(row['aot_ops'], 60)}{module}: local SQNR "
                      f"{db(row['local_sqnr_db'])} dB, accumulated {db(row['sqnr_db'])} dB"
                      + (f", weight {weight} dB" if weight else "")
                      + (f" ({row.get('evidence')})" if isinstance(row.get("evidence"), str) else ""),
                      highlight=False, markup=False)
    nodes, values = exclusions(ranked, fgm)
    options = ", ".join(f"{k}={v!r}" for k, v in (("quant_exclude_nodes", nodes),
                                                  ("quant_exclude_activations", values)) if v)
    console.print(f"to keep them in float: the recipe options {options} (or let "
                  "edgetorch.workflows.quant_fallback.selective_fallback choose and measure)", highlight=False,
                  markup=False)


def exclusions(ranked: Any, fgm: Any) -> tuple[list[str], list[str]]:
    """The recipe exclusions that keep the ranked rows float (``fgm``: the float graph). The op, when the
    quantizer annotates it, by node name (a fused relu/hardtanh with its conv/linear:
    ``quant_fallback.annotated_layer_nodes``); and the row's output value when it is quantized (``output_scale``:
    by the op's pattern or as the next op's input), by value name."""
    from edgetorch.workflows.quant_fallback import annotated_layer_nodes

    by_name = {n.name: n for n in fgm.graph.nodes}
    nodes, values = [], []
    for _, row in ranked.iterrows():
        ops = row["aot_ops"]
        if not isinstance(ops, (list, tuple)) or not ops:
            continue
        node = by_name.get(str(ops[0]))
        names = annotated_layer_nodes(node) if node is not None else None
        nodes += [n for n in names or () if n not in nodes]
        if names is None or not _missing(row.get("output_scale")):
            values += [str(ops[-1])] if str(ops[-1]) not in values else []
    return nodes, values


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def print_output_impact(console: Console, df: Any, top: int) -> None:
    """The ``top`` layers whose own error alone costs the output most (``output_impact``, largest first)."""
    ranked = df[df["output_impact"].notna()].sort_values("output_impact", ascending=False, kind="stable").head(top)
    console.print("costing the output most (each layer's own error alone injected into the float model: output "
                  "noise / output signal):", highlight=False, markup=False)
    pos = {label: k for k, label in enumerate(df.index)}
    for rank, (label, row) in enumerate(ranked.iterrows(), 1):
        module = f" in {row.get('module')}" if row.get("module") else ""
        console.print(f"  {rank}. #{pos[label]} {ops_text(row['aot_ops'], 60)}{module}: {sci(row['output_impact'])}",
                      highlight=False, markup=False)
