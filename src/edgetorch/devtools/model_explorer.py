"""Per-node values of a gap table in Google Model Explorer's *node data* format, to overlay on the graph there.

Model Explorer (``ai-edge-model-explorer``) colours a graph's nodes from a JSON file loaded with "Add per-node
data". Its schema (``node_data_builder``): a ``ModelNodeData`` maps a graph id to a ``GraphNodeData``
``{"results": {node id: {"value": number, "bgColor"?: css colour}}, "thresholds"?: [{"value", "bgColor"}],
"gradient"?: [{"stop", "bgColor"}]}``; a threshold list colours values ``<= value`` with its colour (first
match; larger values stay white), a per-result ``bgColor`` overrides both.

Node ids. Model Explorer's PyTorch adapter names a ``torch.export`` program's graph ``"graph"`` and each node by
its FX name: the gap table's ``aot_ops`` are those names for the ATen program the ETRecord holds (save it with
``torch.export.save(ep, "model.pt2")`` and open that file). Each row's value goes to every node of its group;
a ``DELEGATE_CALL`` row only to its last op, and only when no finer row gave that op a value.

Values (``value=``): ``"noise_ratio"`` (default when the table has it: ``local_rel_error / noise_floor``, > 1 is
beyond rounding noise; thresholds at 1, 100 and 10^4 match the HTML report's colours), or any numeric column
(``local_rel_error``, ``rel_error``, ``local_gap``, ``gap``). Exact rows are 0; rows without a value are left out.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pandas as pd

from edgetorch._fileio import atomic_write
from edgetorch.errors import EdgeTorchError
from edgetorch.formats.handles import DELEGATE_CALL

__all__ = ["DEFAULT_GRAPH_ID", "NOISE_THRESHOLDS", "ModelExplorerError", "default_value", "node_data",
           "write_node_data"]

#: the graph id Model Explorer's PyTorch ExportedProgram adapter gives the program's graph
DEFAULT_GRAPH_ID = "graph"
NOISE_THRESHOLDS = [{"value": 0, "bgColor": "#e9ecef"}, {"value": 1, "bgColor": "#b2f2bb"},
                    {"value": 100, "bgColor": "#ffc078"}, {"value": 1e4, "bgColor": "#f76707"},
                    {"value": 1e300, "bgColor": "#c92a2a"}]


class ModelExplorerError(EdgeTorchError, ValueError):
    """A value column the gap table does not have."""


def _num(v: Any) -> float | None:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if math.isnan(f):
        return None
    return min(f, 1e308) if f > 0 else max(f, -1e308)


def _values(df: pd.DataFrame, value: str) -> list[float | None]:
    if value == "noise_ratio":
        out = []
        for _, r in df.iterrows():
            lrel, floor = _num(r.get("local_rel_error")), _num(r.get("noise_floor"))
            if r.get("verdict") == "exact":
                out.append(0.0)
            elif lrel is None or floor is None or floor <= 0:
                out.append(1e308 if r.get("verdict") == "real" else None)
            else:
                out.append(lrel / floor)
        return out
    if value not in df:
        raise ModelExplorerError(f"the gap table has no column {value!r} (columns: {', '.join(map(str, df.columns))})")
    return [_num(v) for v in df[value]]


def default_value(df: pd.DataFrame) -> str:
    """``"noise_ratio"`` when the table has the scale-aware columns, else ``"local_gap"``."""
    return "noise_ratio" if {"local_rel_error", "noise_floor", "verdict"} <= set(df.columns) else "local_gap"


def node_data(df: pd.DataFrame, value: str | None = None, graph_id: str | None = DEFAULT_GRAPH_ID) -> dict:
    """The node-data document of a gap table (see the module docstring): a ``ModelNodeData`` keyed by
    ``graph_id``, or a bare ``GraphNodeData`` when ``graph_id`` is None."""
    from edgetorch.devtools.report import row_colours

    value = value or default_value(df)
    vals, colours = _values(df, value), row_colours(df)
    results: dict[str, dict[str, Any]] = {}
    calls: list[tuple[str, dict[str, Any]]] = []
    for (_, row), v, colour in zip(df.iterrows(), vals, colours, strict=True):
        ops = [str(o) for o in (row.get("aot_ops") or [])]
        if v is None or not ops:
            continue
        item = {"value": v, "bgColor": colour}
        if row.get("kind") == DELEGATE_CALL:
            calls.append((ops[-1], item))
            continue
        for op in ops:
            results.setdefault(op, item)
    for op, item in calls:
        results.setdefault(op, item)
    graph: dict[str, Any] = {"results": results}
    if value == "noise_ratio":
        graph["thresholds"] = NOISE_THRESHOLDS
    else:
        graph["gradient"] = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#c92a2a"}]
    return graph if graph_id is None else {graph_id: graph}


def write_node_data(path: str | os.PathLike, df: pd.DataFrame, value: str | None = None,
                    graph_id: str | None = DEFAULT_GRAPH_ID) -> str:
    """Writes ``node_data(df, value, graph_id)`` as JSON, atomically; returns the path."""
    doc = node_data(df, value, graph_id)
    atomic_write(path, [json.dumps(doc, indent=1, allow_nan=False).encode()])
    return os.fspath(path)
