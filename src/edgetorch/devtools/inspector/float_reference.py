"""Quantization debugging against the float model: which layer's INT8 costs the accuracy, and by how much.

``Inspector.calculate_numeric_gap(distance, reference_graph="float")`` (or :func:`float_numeric_gap`) compares the
runtime of a quantized program with the float program it was quantized from, which a quantizing export records
in the ETRecord as ``graph_map["float/<method>"]``. The float ops carry torchao's PT2E numeric debug handles; the
quantized program kept them through prepare/convert (``meta["custom"]["numeric_debug_handle"]``), so every
quantized group (dequantize -> op -> quantize) maps to its float op.

One row per float op whose quantized counterpart logged a value (a float op folded into its producer at
prepare time, such as a batch norm after a conv, joins that producer's row). The runtime value of a row is what
the quantized group hands downstream: the dequantized output of the group's quantize (the ``dequantize`` kernel's
output, or an int8 value dequantized with the group's scale and zero point, e.g. inside an ONNX Runtime delegate),
else the op's own float output. Columns:

* ``gap``: the accumulated error (the float model run on the sample vs the runtime), ``distance`` averaged over
  the samples; ``sqnr_db``: its signal-to-quantization-noise ratio (PyTorch's numeric suite), over all samples;
* ``local_gap`` / ``local_sqnr_db``: the float op fed the runtime's own (dequantized) inputs and the float weights
  vs the runtime output (ONNX Runtime's ``qdq_err``, TFLite's per-layer verify): the error this op's
  quantization adds;
* ``rmse_over_scale``: TFLite's statistic, the local RMSE divided by the output's quantization scale (about
  0.29 = 1/sqrt(12) for pure rounding; None without an output quantizer);
* ``weight_sqnr_db`` / ``weight_mse``: the dequantized int8 weight vs the float weight (a batch norm folded into
  the weight at prepare time folded into the float weight too);
* ``kind``: the ``HandleGroup.kind`` of the runtime entry the row reads (``formats.handles.KINDS``, a categorical
  as in ``calculate_numeric_gap``): ``kernel``, ``in_delegate`` or ``delegate_call`` (a delegate call's output);
* ``samples``: how many (sample, run) pairs the row aggregates: every recorded execution of ``method`` that has
  a representative input (record the calibration set with ``etrecord.update_representative_inputs(samples)``).

:func:`rank_quantization_culprits` orders the rows worst first (lowest local SQNR).

This module is the table and its state (:class:`FloatReference`, one per Inspector: ``inspector.float_reference``);
``_float_match`` matches the quantized groups to their float ops and reads their runtime values, ``_float_runner``
runs the float graph (the accumulated and the local reference in one generated module).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pandas as pd
import torch
import torch.fx
import torch.utils._pytree as pytree

from edgetorch.devtools.inspector._float_match import (
    Group,
    Read,
    RowPlan,
    const_eval,
    edge_last,
    float_ends,
    float_weight,
    input_plans,
    quantized_groups,
    quantized_inputs,
    read_value,
    row_plans,
    runtime_by_edge_handle,
)
from edgetorch.devtools.inspector._float_runner import Inject, JointRunner, flat_cat, sum_sq
from edgetorch.devtools.inspector.comparators import get_comparator
from edgetorch.devtools.inspector.numeric_gap import RuntimeEntry, runtime_entries
from edgetorch.errors import InspectorError
from edgetorch.exir.debug_handles import source_location
from edgetorch.exir.quant_annotations import ANNOTATED_OPS, module_paths
from edgetorch.formats.handles import KERNEL, KINDS

__all__ = ["FLOAT_GRAPH", "FloatReference", "annotated_consumers", "float_graph", "float_numeric_gap", "output_impact",
           "rank_quantization_culprits", "simulate_fallback", "with_output_impact"]

#: the ``reference_graph`` name of the float model
FLOAT_GRAPH = "float"



# ---------------------------------------------------------------------------------------------------------------
@dataclass
class _Stats:
    """Sums over samples of one row."""

    gaps: list[float] = field(default_factory=list)
    local_gaps: list[float] = field(default_factory=list)
    signal: float = 0.0
    noise: float = 0.0
    local_signal: float = 0.0
    local_noise: float = 0.0
    elements: int = 0
    first: tuple[torch.Tensor, torch.Tensor] | None = None
    runtime_node: str = ""
    kind: str = KERNEL  # HandleGroup.kind of the runtime entry the row reads

    def add(self, ref: torch.Tensor, local: torch.Tensor, rt: torch.Tensor, sums: list[float],
            comparator: Any) -> None:
        signal, noise, local_signal, local_noise = sums
        if getattr(comparator, "name", None) == "MSE":  # the sums already hold it
            n = max(1, ref.numel())
            self.gaps.append(noise / n)
            self.local_gaps.append(local_noise / n)
        else:
            self.gaps.append(float(comparator.compare(ref, rt)))
            self.local_gaps.append(float(comparator.compare(local, rt)))
        self.signal += signal
        self.noise += noise
        self.local_signal += local_signal
        self.local_noise += local_noise
        self.elements += ref.numel()
        if self.first is None:
            self.first = (ref, rt)



def _sqnr(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _samples(inspector: Any, method: str, runs: Sequence[int] | None
             ) -> list[tuple[int, tuple, list[RuntimeEntry]]]:
    """(representative input index, inputs, runtime entries) of every recorded execution of ``method`` with a
    representative input."""
    from edgetorch.formats import etdump as ed

    reps = (inspector.etrecord.representative_inputs or {}).get(method) or []
    if not reps:
        raise InspectorError(f"the ETRecord has no representative inputs for method '{method}': call "
                             "etrecord.update_representative_inputs(samples) before saving it")
    out = []
    index = 0
    blocks = [b for b in inspector.event_blocks if b.method == method and b.name != ed.LOAD_BLOCK
              and any(e.instruction_id is not None for e in b.events)]
    for b in blocks:
        for r in range(max(1, b.num_runs)):
            i = b.bundled_input_index if b.bundled_input_index is not None else index
            index += 1
            if i < len(reps) and (runs is None or i in runs):
                out.append((i, reps[i], runtime_entries(b.events, r)))
    if not out:
        raise InspectorError(f"no execution of method '{method}' matches a representative input (runs={runs}, "
                             f"{len(reps)} inputs recorded)")
    return out


def _graphs(inspector: Any, method: str) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    from edgetorch.devtools.etrecord._reference import reference_from_program

    rec = inspector.etrecord
    if rec is None:
        raise InspectorError("reference_graph='float' needs an ETRecord (pass etrecord=...)")
    key = f"{FLOAT_GRAPH}/{method}"
    if key not in rec.graph_map_names():
        raise InspectorError(f"the ETRecord holds no float program for method '{method}' (graph_map['{key}']): "
                             "export with a quantization recipe and generate_etrecord=True, or call "
                             "etrecord.add_float_reference(float_program) (see "
                             "edgetorch.export.quantizer.capture_float_program)")
    fgm = rec.graph_map_reference(key)  # compact view: no program deserialization, weights mapped
    if fgm is None:
        fgm = reference_from_program(rec.graph_map[key], method)
    qgm = rec.edge_reference_graph(method)
    if qgm is None:
        qgm = rec.edge_program(method).module()
    return fgm, qgm


class _Prepared(NamedTuple):
    """The float and quantized graphs of a method, their mapping, and how to read each row's runtime value."""

    fgm: torch.fx.GraphModule
    qgm: torch.fx.GraphModule
    groups: dict[int, Group]
    chains: dict[int, list[torch.fx.Node]]
    last: dict[int, torch.fx.Node]
    runner: JointRunner
    rows: list[RowPlan]
    inputs: list[tuple[int, tuple[Read, ...], torch.Tensor]]
    order: dict[int, int]
    static: dict[int, dict[str, Any]]  # per handle, the table columns that depend on no sample
    readings: dict[tuple, list]  # see FloatReference.readings


class FloatReference:
    """The float-model reference of one Inspector (``Inspector.float_reference``): per method, the float and
    quantized graphs with their mapping (built once), the runtime values read from the ETDump and the float values
    kept for later tables (up to ``_float_runner._FLOAT_CACHE_BYTES``). It owns that cache;
    :meth:`drop_float_values` empties it."""

    def __init__(self, inspector: Any) -> None:
        self.inspector = inspector
        self._methods: dict[str, _Prepared] = {}

    def prepared(self, method: str) -> _Prepared:
        """The float and quantized graphs of ``method`` with their mapping, built on first use."""
        if method not in self._methods:
            fgm, qgm = _graphs(self.inspector, method)
            groups = quantized_groups(qgm)
            chains, last, runner = float_ends(fgm, groups), edge_last(qgm), JointRunner(fgm)
            self._methods[method] = _Prepared(
                fgm, qgm, groups, chains, last, runner, row_plans(groups, chains, last),
                input_plans(qgm, last, runner.placeholders), {h: i for i, h in enumerate(last)}, {}, {})
        return self._methods[method]

    def drop_float_values(self) -> None:
        """Forgets the float values and the runtime readings kept for later tables (the next table reads the
        ETDump and runs the float pass again)."""
        for prep in self._methods.values():
            prep.readings.clear()
            prep.runner.floats.clear()
            prep.runner.float_bytes = 0

    def readings(self, method: str, runs: Sequence[int] | None, want_pre: bool) -> list:
        """Per recorded sample: (representative input index, flat inputs, {row node: runtime value}, {row node:
        (handle, runtime node name)}, {row node: the runtime value before the group's output quantization, where
        it has one}, {input index: the runtime's dequantized input}). Read from the ETDump once."""
        prep = self.prepared(method)
        key = (method, tuple(runs) if runs is not None else None, want_pre)
        if key not in prep.readings:
            prep.readings[key] = [_reading(prep, index, inputs, entries, want_pre)
                                  for index, inputs, entries in _samples(self.inspector, method, runs)]
        return prep.readings[key]

    def per_sample(self, method: str, runs: Sequence[int] | None, want_pre: bool = False) -> Iterator[tuple]:
        """Per recorded sample: (flat inputs, {row node: runtime value}, {row node: (handle, runtime node name)},
        the joint module's {row node: (float value, local value, sums)}, {row node: the runtime value before the
        group's output quantization, where it has one})."""
        prep = self.prepared(method)
        readings = self.readings(method, runs, want_pre)
        chunk: list[tuple] = []
        size = 0
        for at, r in enumerate(readings):  # samples run together up to _CHUNK_ELEMENTS row values (their sums
            # reduced together), the next chunk once the caller is done with these: fewer new pages for a large model
            chunk.append(r)
            size += sum(t.numel() for t in r[2].values())
            if size >= _CHUNK_ELEMENTS or at == len(readings) - 1:
                values = prep.runner.run_all([(flat, rti, rows, index) for index, flat, rows, _, _, rti in chunk])
                for (_, flat, rows, ends, pre, _), v in zip(chunk, values):
                    yield flat, rows, ends, v, pre
                chunk, size, values = [], 0, []


def _prepared(inspector: Any, method: str) -> _Prepared:
    return inspector.float_reference.prepared(method)


def _per_sample(inspector: Any, method: str, runs: Sequence[int] | None, want_pre: bool = False
                ) -> Iterator[tuple]:
    return inspector.float_reference.per_sample(method, runs, want_pre)


def float_graph(inspector: Any, method: str | None = None) -> torch.fx.GraphModule:
    """The float program's graph of ``method`` as the float-reference table runs it (built once per Inspector)."""
    return _prepared(inspector, _default_method(inspector, method)).fgm


def _default_method(inspector: Any, method: str | None) -> str:
    return method or ("forward" if "forward" in inspector.methods or not inspector.methods
                      else inspector.methods[0])


def _reading(prep: _Prepared, index: int, inputs: tuple, entries: list[RuntimeEntry], want_pre: bool) -> tuple:
    """One recorded sample's reading (see :meth:`FloatReference.readings`)."""
    rt = runtime_by_edge_handle(entries, prep.order)
    rows: dict[torch.fx.Node, torch.Tensor] = {}
    ends: dict[torch.fx.Node, tuple[int, str, str]] = {}  # row node -> (handle, runtime node name, kind)
    pre: dict[torch.fx.Node, torch.Tensor] = {}
    for plan in prep.rows:
        got = read_value(plan.reads, rt)
        if got is None or got[0].numel() != plan.shape.numel():
            continue
        rows[plan.end] = _as(got[0], plan.shape, plan.dtype)
        ends[plan.end] = (plan.handle, got[1].name, got[2])
        if want_pre and got[1] is not prep.groups[plan.handle].sources[-1].node:
            before = read_value(plan.own, rt)
            if before is not None and before[0].numel() == plan.shape.numel():
                pre[plan.end] = _as(before[0], plan.shape, plan.dtype)
    return index, pytree.tree_leaves(tuple(inputs)), rows, ends, pre, quantized_inputs(prep.inputs, rt)


def _as(t: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """``t`` reshaped to ``shape`` as ``dtype`` (itself when it already is: no call per row and sample)."""
    return t if t.dtype == dtype and t.shape == shape else t.reshape(shape).to(dtype)


_CHUNK_ELEMENTS = 1 << 22  # row values of the samples run and reduced together (a chunk ends past this many)


def float_numeric_gap(inspector: Any, distance: str = "MSE", method: str | None = None,
                      runs: Sequence[int] | None = None, local: bool = True) -> pd.DataFrame:
    """The per-float-op table of quantization errors (see the module docstring) over every recorded execution
    of ``method`` with a representative input (``runs``: only those sample indices)."""
    comparator = get_comparator(distance)
    method = _default_method(inspector, method)
    prep = _prepared(inspector, method)
    stats: dict[int, _Stats] = {}
    with torch.no_grad():
        for _, rows, ends, values, _ in _per_sample(inspector, method, runs):
            for n, (h, rt_name, kind) in ends.items():
                ref, loc, sums = values[n]
                stats.setdefault(h, _Stats(runtime_node=rt_name, kind=kind)).add(ref, loc, rows[n], sums, comparator)
    df = _table(stats, prep, comparator, local)
    df.attrs.update(reference_graph=FLOAT_GRAPH, method=method,
                    distance=getattr(comparator, "name", type(comparator).__name__),
                    float_ops=len(prep.chains), samples=max((len(s.gaps) for s in stats.values()), default=0))
    return df



def output_impact(inspector: Any, method: str | None = None, runs: Sequence[int] | None = None,
                  metric: str = "nsr") -> dict[int, float]:
    """Per float handle: what the op's own (local) quantization error alone does to the float model's outputs,
    injected into the float model (one float forward per row and sample): ``metric="nsr"``, the noise-to-signal
    ratio ``Σ‖out(float + that error) − out(float)‖² / Σ‖out(float)‖²``; ``"cosine"``, the mean cosine lost,
    ``1 − cos(out(float + that error), out(float))`` (all floating-point outputs flattened together). What
    keeping that one layer in float would win back, to first order: the ranking of the selective fallback."""
    if metric not in ("nsr", "cosine"):
        raise InspectorError(f"metric must be 'nsr' or 'cosine', got {metric!r}")
    method = _default_method(inspector, method)
    fgm = _prepared(inspector, method)[0]
    acc: dict[int, float] = {}
    signal, samples = 0.0, 0
    with torch.no_grad():
        for flat, rows, ends, values, _ in _per_sample(inspector, method, runs):
            ref_out = flat_cat(fgm(*flat))
            signal += sum_sq(ref_out)
            samples += 1
            for n, (h, *_) in ends.items():
                out = flat_cat(Inject(fgm, {n: rows[n] - values[n][1]}).run(*flat))
                if metric == "nsr":
                    acc[h] = acc.get(h, 0.0) + sum_sq(out - ref_out)
                else:
                    cos = torch.nn.functional.cosine_similarity(out.double(), ref_out.double(), dim=0).item()
                    acc[h] = acc.get(h, 0.0) + (1.0 - cos)
    norm = signal if metric == "nsr" else float(samples)
    return {h: v / norm if norm > 0 else math.inf for h, v in acc.items()}


def annotated_consumers(n: torch.fx.Node, depth: int = 4) -> list[torch.fx.Node]:
    """The ops the quantizer annotates among ``n``'s consumers, looking through up to ``depth`` other ops (each
    path stops at the first annotated one): the ops that quantize ``n``'s value again."""
    out: list[torch.fx.Node] = []
    todo, seen = [(u, 1) for u in n.users], set()
    while todo:
        u, d = todo.pop(0)
        if u in seen or u.op != "call_function":
            continue
        seen.add(u)
        if u.target in ANNOTATED_OPS:
            out.append(u)
        elif d < depth:
            todo += [(v, d + 1) for v in u.users]
    return out


def _removable(head: torch.fx.Node, end: torch.fx.Node, full: torch.Tensor, pre: torch.Tensor | None,
               local: torch.Tensor, output_quantized: bool) -> torch.Tensor | None:
    """The part of a row's local error that keeping it in float removes (``quant_fallback`` keeps an op the
    quantizer does not annotate float through its consumers: all of it; an annotated op whose output a consumer
    re-quantizes anyway: only what precedes the output quantization, e.g. the weight error)."""
    if head.target not in ANNOTATED_OPS or not output_quantized or not annotated_consumers(end):
        return full
    return None if pre is None else pre - local


def simulate_fallback(inspector: Any, steps: int = 3, method: str | None = None,
                      runs: Sequence[int] | None = None) -> list[tuple[int, float]]:
    """Greedy choice of the rows to keep in float, simulated on the float model with every row's local error
    injected (which reproduces the runtime's outputs): at each step, the row whose removable error, once
    removed, brings the outputs closest to the float model's (mean cosine over the samples). Returns
    ``[(float handle, simulated cosine after the step)]``; interactions between layers' errors are accounted
    for, the errors of the other layers are assumed unchanged."""
    method = _default_method(inspector, method)
    prep = _prepared(inspector, method)
    fgm, groups, chains = prep.fgm, prep.groups, prep.chains
    heads = {chain[-1]: chain[0] for chain in chains.values()}
    data = []
    with torch.no_grad():
        for flat, rows, ends, values, pre in _per_sample(inspector, method, runs, want_pre=True):
            noise = {n: rows[n] - values[n][1] for n in ends}
            fix = {n: _removable(heads[n], n, noise[n], pre.get(n), values[n][1],
                                 ends[n][1] != groups[h].sources[-1].node.name) for n, (h, *_) in ends.items()}
            data.append((flat, flat_cat(fgm(*flat)), noise, {n: f for n, f in fix.items() if f is not None}, ends))
        handles = data[0][4] if data else {}
        candidates = set.intersection(*(set(d[3]) for d in data)) if data else set()
        chosen: list[torch.fx.Node] = []
        out: list[tuple[int, float]] = []
        for _ in range(min(steps, len(candidates))):
            scores = {c: _simulated_cosine(fgm, data, [*chosen, c]) for c in candidates - set(chosen)}
            best = max(scores, key=scores.__getitem__)
            chosen.append(best)
            out.append((handles[best][0], scores[best]))
    return out


def _simulated_cosine(fgm: torch.fx.GraphModule, data: list, removed: list[torch.fx.Node]) -> float:
    cos = []
    for flat, ref, noise, fix, _ in data:
        injected = {n: (e - fix[n]) if n in removed else e for n, e in noise.items()}
        out = flat_cat(Inject(fgm, injected).run(*flat))
        cos.append(torch.nn.functional.cosine_similarity(out.double(), ref.double(), dim=0).item())
    return sum(cos) / len(cos)



def _weight_error(fgm: torch.fx.GraphModule, qgm: torch.fx.GraphModule, chain: list[torch.fx.Node],
                  g: Group) -> tuple[float | None, float | None]:
    if g.weight_dequant is None:
        return None, None
    w = float_weight(fgm, chain)
    if w is None:
        return None, None
    wq = const_eval(qgm, g.weight_dequant)
    if not isinstance(wq, torch.Tensor) or wq.shape != w.shape:
        return None, None
    w, wq = w.detach().float(), wq.detach().float()
    noise = sum_sq(w - wq)
    return _sqnr(sum_sq(w), noise), noise / max(1, w.numel())


_COLUMNS = ["float_debug_handle", "aot_debug_handle", "aot_ops", "float_op", "runtime_ops", "kind", "gap", "local_gap",
            "metric", "sqnr_db", "local_sqnr_db", "rmse_over_scale", "output_scale", "weight_sqnr_db", "weight_mse",
            "quantized", "samples", "aot_intermediate_output", "runtime_intermediate_output", "module", "source",
            "shape"]


def _static_columns(prep: _Prepared, h: int) -> dict[str, Any]:
    """The columns of handle ``h``'s row that depend on no sample (computed once per Inspector)."""
    if h not in prep.static:
        chain, g = prep.chains[h], prep.groups[h]
        w_sqnr, w_mse = _weight_error(prep.fgm, prep.qgm, chain, g)
        paths = module_paths(chain[0])
        prep.static[h] = {
            "float_debug_handle": h, "aot_debug_handle": (h,), "aot_ops": [n.name for n in chain],
            "float_op": str(chain[0].target), "output_scale": g.output_scale, "weight_sqnr_db": w_sqnr,
            "weight_mse": w_mse, "quantized": bool(g.output_scale is not None or g.weight_dequant is not None),
            "module": paths[-1] if paths else "", "source": source_location(chain[0].meta.get("stack_trace"))}
    return prep.static[h]


def _table(stats: dict[int, _Stats], prep: _Prepared, comparator: Any, local: bool) -> pd.DataFrame:
    rows = []
    metric = getattr(comparator, "name", type(comparator).__name__)
    for h in prep.chains:
        s = stats.get(h)
        if s is None or s.first is None:
            continue
        g = prep.groups[h]
        local_rmse = math.sqrt(s.local_noise / max(1, s.elements))
        names = [n.name for n in g.nodes]
        rows.append({
            **(static := _static_columns(prep, h)), "aot_ops": list(static["aot_ops"]),
            "runtime_ops": names + ([s.runtime_node] if s.runtime_node not in names else []), "kind": s.kind,
            "gap": [sum(s.gaps) / len(s.gaps)],
            "local_gap": [sum(s.local_gaps) / len(s.local_gaps)] if local else [None],
            "metric": metric,
            "sqnr_db": _sqnr(s.signal, s.noise),
            "local_sqnr_db": _sqnr(s.local_signal, s.local_noise) if local else None,
            "rmse_over_scale": local_rmse / g.output_scale if g.output_scale else None,
            "samples": len(s.gaps),
            "aot_intermediate_output": s.first[0],
            "runtime_intermediate_output": s.first[1],
            "shape": tuple(s.first[0].shape),
        })
    df = pd.DataFrame(rows, columns=_COLUMNS)
    df["kind"] = pd.Categorical([r["kind"] for r in rows], categories=KINDS)  # typed, as in numeric_gap
    return df


def with_output_impact(inspector: Any, df: pd.DataFrame, method: str | None = None) -> pd.DataFrame:
    """``df`` (a float-reference table of ``inspector``) with an ``output_impact`` column: :func:`output_impact`
    (noise-to-signal ratio of the outputs) of each row's float op, None where the op logged no value."""
    impact = output_impact(inspector, method)
    out = df.assign(output_impact=[impact.get(h) for h in df["float_debug_handle"]])
    out.attrs.update(df.attrs)
    return out


def rank_quantization_culprits(df: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """The ``top`` rows of a float-reference gap table whose own quantization adds the most error: lowest local
    SQNR first (ties: lowest accumulated SQNR). Rows whose op is not quantized (no weight, no output quantizer)
    and rows without a float signal (local SQNR ``-inf``: ``culprits.float_culprits`` ranks them apart) are
    left out."""
    if df.empty:
        return df
    cand = df[df["quantized"]] if "quantized" in df else df
    cand = cand[cand["local_sqnr_db"].astype(float) != -math.inf]
    key = cand["local_sqnr_db"].astype(float).fillna(math.inf)
    ranked = cand.assign(_k=key, _a=cand["sqnr_db"].astype(float)).sort_values(["_k", "_a"], kind="stable")
    return ranked.drop(columns=["_k", "_a"]).head(top)
