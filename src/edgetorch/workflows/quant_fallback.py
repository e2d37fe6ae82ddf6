"""Selective fallback: keep the layers whose INT8 costs the most in float, re-export, re-measure.

The quantization-debugging loop of TFLite's QuantizationDebugger (its denylist) and ONNX Runtime's qdq_loss_debug,
on edgetorch's export recipes::

    from edgetorch.workflows.quant_fallback import selective_fallback
    from edgetorch.export import PortableRecipeType

    report = selective_fallback(model, calibration_samples, PortableRecipeType.INT8_STATIC_PER_CHANNEL)
    print(report.table[["aot_ops", "local_sqnr_db", "weight_sqnr_db"]])   # each layer's INT8 error
    print(report.culprits)           # the layers chosen: nodes and values kept float, simulated cosine
    print(report.steps)              # per step: layers kept float, cosine to float, accuracy recovered, latency

Step 0 is the INT8 program; step ``s`` keeps the first ``s`` chosen layers in float through the recipe's
quantization exclusions and is exported and measured again. By default (``ranking="block"``) a layer is kept float
as a *block*: the op (``quant_exclude_nodes``), its output and each input no other quantized op reads
(``quant_exclude_activations``), chosen greedily by :func:`simulate_blocks` on the fake-quantized model (no
re-export; its cosine is what the re-exported program measures). The other rankings order the rows of the
float-reference gap table (:mod:`edgetorch.devtools.inspector.float_reference`) and keep only the op float.
``accuracy_recovered`` is the share of the cosine to the float model that INT8 lost and the step won back;
``latency_ms`` the median wall time of one run on the edgetorch runtime (no ETDump), next to the float program's
on the same backend.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import torch.utils._pytree as pytree

from edgetorch.devtools.inspector.float_reference import annotated_consumers, float_graph
from edgetorch.errors import InspectorError
from edgetorch.exir.quant_annotations import ANNOTATED_OPS, FUSED_ACTIVATION_OPS, WEIGHTED_OPS
from edgetorch.export import ExportRecipe, export
from edgetorch.export.quantizer import _BIAS_CORRECTIONS_KEY
from edgetorch.export.recipe import RecipeType

__all__ = ["FallbackReport", "QuantizedRun", "annotated_layer_nodes", "coarsen_weight", "cosine_to_float",
           "fp32_recipe_of", "inspect_quantized", "layer_nodes", "quantize_pt2e_program", "rank_layers",
           "run_latency_ms", "selective_fallback", "Block", "simulate_blocks",
           "record_debug_runs"]

_BATCH_NORMS = {torch.ops.aten.batch_norm.default, torch.ops.aten._native_batch_norm_legit_no_training.default}
_BLOCK_OPS = WEIGHTED_OPS | {torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor}


@dataclass
class QuantizedRun:
    """A quantized program run on every sample with ETDump and debug buffer, and its float-reference table."""

    et: Any  # ExecutorchProgramManager
    table: pd.DataFrame
    outputs: list[list[Any]]  # the runtime's flat outputs per sample
    inspector: Any


@dataclass
class FallbackReport:
    """``steps``: one row per step (0 = INT8); ``culprits``: the ranked float-reference rows; ``table``: the
    INT8 program's full float-reference gap table."""

    steps: pd.DataFrame
    culprits: pd.DataFrame
    table: pd.DataFrame
    float_latency_ms: float | None = None
    runs: list[QuantizedRun] = field(default_factory=list)


def _flat_float(tree: Any) -> torch.Tensor:
    leaves = [t.detach().reshape(-1).double() for t in pytree.tree_leaves(tree)
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return torch.cat(leaves) if leaves else torch.zeros(0, dtype=torch.float64)


def cosine_to_float(model: torch.nn.Module, samples: Sequence[tuple], outputs: Sequence[Any]) -> float:
    """Mean over samples of the cosine similarity between the float model's outputs and ``outputs`` (every
    floating-point output of a sample, flattened and concatenated)."""
    cos = []
    with torch.no_grad():
        for s, out in zip(samples, outputs, strict=True):
            a, b = _flat_float(model(*s)), _flat_float(out)
            if a.numel() != b.numel():
                raise InspectorError(f"the program's outputs ({b.numel()} float elements) do not match the model's "
                                     f"({a.numel()}): pass the model the program was exported from")
            cos.append(torch.nn.functional.cosine_similarity(a, b, dim=0).item())
    return sum(cos) / len(cos)


def run_latency_ms(pte: bytes, samples: Sequence[tuple], repeats: int = 3) -> float:
    """Median wall time in ms of one ``execute`` of ``forward`` on the edgetorch runtime (no ETDump), over
    ``repeats`` passes over ``samples`` after one warm-up pass."""
    from edgetorch.runtime import Runtime

    method = Runtime.get().load_program(pte).load_method("forward")
    for s in samples:
        method.execute(*s)
    times = []
    for _ in range(max(1, repeats)):
        for s in samples:
            t0 = time.perf_counter()
            method.execute(*s)
            times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def record_debug_runs(et: Any, samples: Sequence[tuple], directory: str) -> tuple[list[str], list[Any]]:
    """Saves ``et``'s ETRecord (with ``samples`` as representative inputs) and one debug run per sample into
    ``directory``; returns the paths ``[etrecord, etdump, debug buffer]`` and the runs' outputs."""
    from edgetorch.runtime import Runtime

    record = et.get_etrecord()
    record.update_representative_inputs([tuple(s) for s in samples])
    paths = [os.path.join(directory, n) for n in ("q.etrecord", "q.etdp", "q_debug.bin")]
    record.save(paths[0])
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    method = program.load_method("forward")
    outputs = [method.execute(*s) for s in samples]
    program.write_etdump_result_to_file(paths[1], paths[2])
    return paths, outputs


def inspect_quantized(et: Any, samples: Sequence[tuple], distance: str = "MSE",
                      workdir: str | None = None) -> QuantizedRun:
    """Runs ``et`` (an ExecutorchProgramManager whose ETRecord holds the float program) on every sample with an
    ETDump and debug buffer, and builds the float-reference gap table over all of them."""
    from edgetorch.devtools.inspector import Inspector

    with tempfile.TemporaryDirectory(dir=workdir) as d:
        paths, outputs = record_debug_runs(et, samples, d)
        inspector = Inspector(etdump_path=paths[1], etrecord=paths[0], debug_buffer_path=paths[2])
        table = inspector.calculate_numeric_gap(distance, reference_graph="float")
    return QuantizedRun(et, table, outputs, inspector)


def quantize_pt2e_program(model: torch.nn.Module, samples: Sequence[tuple], quantizer: Any,
                          partitioner: Sequence[Any] | None = None,
                          edit: Callable[[torch.fx.GraphModule], None] | None = None) -> Any:
    """The lower-level PT2E path with the float reference: ``capture_float_program`` -> ``prepare_pt2e`` ->
    calibrate on ``samples`` -> ``convert_pt2e`` (``convert_calibrated``: with the quantizer's bias correction)
    -> ``edit(converted)`` (optional, e.g. :func:`coarsen_weight`)
    -> ``to_edge_transform_and_lower(..., generate_etrecord=True, float_program=...)`` -> ``to_executorch``: the
    ETRecord holds the float program. Returns the ExecutorchProgramManager."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.export.quantizer import capture_float_program, convert_calibrated
    from edgetorch.export.stages import _drop_unused_attributes

    samples = [tuple(s) for s in samples]
    float_ep = capture_float_program(model, samples[0])
    prepared = prepare_pt2e(float_ep.module(), quantizer)
    with torch.no_grad():
        for s in samples:
            prepared(*s)
    # no dead float weights in the .pte; the bias correction the quantizer asks for, as the export recipes
    converted = _drop_unused_attributes(convert_calibrated(prepared, quantizer, samples))
    if edit is not None:
        edit(converted)
    ep = torch.export.export(converted, samples[0])
    return to_edge_transform_and_lower(ep, partitioner=list(partitioner or []) or None, generate_etrecord=True,
                                       float_program=float_ep).to_executorch()


def coarsen_weight(converted: torch.fx.GraphModule, node_name: str, factor: float = 8.0) -> None:
    """Re-quantizes the int8 weight of the op ``node_name`` of a ``convert_pt2e`` module with a ``factor`` times
    larger scale (a badly quantized layer: ``log2(factor)`` bits of weight precision lost), in place."""
    node = next((n for n in converted.graph.nodes if n.name == node_name), None)
    dq = node.args[1] if node is not None and len(node.args) > 1 else None
    if not isinstance(dq, torch.fx.Node) or "dequantize" not in str(dq.target) or dq.args[0].op != "get_attr":
        raise InspectorError(f"node_name {node_name!r}: no op of the converted module reads a dequantized "
                             "int8 weight under that name")
    w = getattr(converted, dq.args[0].target)
    setattr(converted, dq.args[0].target, torch.round(w.float() / factor).clamp(-127, 127).to(w.dtype))
    scale = dq.args[1]
    if isinstance(scale, torch.fx.Node):
        setattr(converted, scale.target, getattr(converted, scale.target) * factor)
    else:
        dq.args = (dq.args[0], float(scale) * factor, *dq.args[2:])
    converted.recompile()


def fp32_recipe_of(recipe_type: RecipeType) -> RecipeType:
    """The FP32 recipe of ``recipe_type``'s backend (``PortableRecipeType.FP32``, ``OrtRecipeType.FP32``)."""
    fp32 = getattr(type(recipe_type), "FP32", None)
    if fp32 is None:
        raise InspectorError(f"recipe_type {recipe_type!r}: its backend has no FP32 recipe to compare with")
    return fp32


def layer_nodes(run: QuantizedRun, row: pd.Series) -> list[str]:
    """The float node names to keep in float for one culprit row: its op when the quantizer annotates it (with
    the conv/linear whose output a fused relu/hardtanh row quantizes); for an op the quantizer leaves alone
    (layer norm, view, dropout, ...), whose output is quantized as the input of its consumers, those consumers."""
    fgm = float_graph(run.inspector, run.table.attrs.get("method", "forward"))
    node = next((n for n in fgm.graph.nodes if n.name == row["aot_ops"][0]), None)
    if node is None:
        return [row["aot_ops"][0]]
    names = annotated_layer_nodes(node)
    return names if names is not None else [u.name for u in annotated_consumers(node)]


def annotated_layer_nodes(node: torch.fx.Node) -> list[str] | None:
    """The node names that keep an op the quantizer annotates in float (``quant_exclude_nodes``): the op, and for
    a fused relu/hardtanh also the conv/linear it is fused into (a batch norm between them was folded into the
    conv at prepare time): excluding the activation alone leaves the pattern's output quantized. None when the
    quantizer does not annotate ``node``."""
    if node.target in FUSED_ACTIVATION_OPS:
        producer = node.args[0] if node.args else None
        while isinstance(producer, torch.fx.Node) and producer.target in _BATCH_NORMS \
                and len(producer.users) == 1:
            producer = producer.args[0]
        if isinstance(producer, torch.fx.Node) and producer.target in WEIGHTED_OPS and len(producer.users) == 1:
            return [producer.name, node.name]
        return [node.name]
    return [node.name] if node.target in ANNOTATED_OPS else None


def rank_layers(run: QuantizedRun, ranking: str = "simulate", steps: int = 3) -> pd.DataFrame:
    """The quantized rows of ``run``'s float-reference table, worst first: "simulate" (the default: the ``steps``
    rows :func:`~edgetorch.devtools.inspector.float_reference.simulate_fallback` picks greedily, in its order,
    with a ``simulated_cosine`` column), "impact" (the ``output_impact`` column: the cosine to the float outputs
    each row's own error costs alone, largest first) or "local_sqnr" (lowest first)."""
    from edgetorch.devtools.inspector.float_reference import (
        output_impact,
        rank_quantization_culprits,
        simulate_fallback,
    )

    ranked = rank_quantization_culprits(run.table, top=len(run.table))
    if ranking == "local_sqnr":
        return ranked
    if ranking == "simulate":
        order = simulate_fallback(run.inspector, steps, run.table.attrs.get("method"))
        by_handle = {h: i for i, (h, _) in enumerate(order)}
        picked = ranked[ranked["float_debug_handle"].isin(by_handle)]
        picked = picked.assign(simulated_cosine=[order[by_handle[h]][1] for h in picked["float_debug_handle"]])
        return picked.iloc[sorted(range(len(picked)), key=lambda i: by_handle[picked["float_debug_handle"].iloc[i]])]
    impact = output_impact(run.inspector, run.table.attrs.get("method"), metric="cosine")
    ranked = ranked.assign(output_impact=[impact.get(h, 0.0) for h in ranked["float_debug_handle"]])
    return ranked.sort_values("output_impact", ascending=False, kind="stable")


def _export_run(model: torch.nn.Module, samples: Sequence[tuple], recipe_type: RecipeType,
                options: dict[str, Any]) -> QuantizedRun:
    session = export(model, list(samples), ExportRecipe.get_recipe(recipe_type, **options), generate_etrecord=True)
    return inspect_quantized(session.get_executorch_program_manager(), samples)


_RANKINGS = ("block", "simulate", "impact", "local_sqnr")


def selective_fallback(model: torch.nn.Module, samples: Sequence[tuple], recipe_type: RecipeType,
                       max_layers: int = 3, eval_samples: Sequence[tuple] | None = None,
                       latency_repeats: int = 3, ranking: str = "block",
                       select_samples: Sequence[tuple] | None = None, shortlist: int = 12,
                       **recipe_options: Any) -> FallbackReport:
    """Quantizes ``model`` with ``recipe_type`` (calibrated on ``samples``), chooses up to ``max_layers`` layers
    to keep in float, then keeps the first 1..``max_layers`` float, one export per step. Accuracy (cosine to the
    float model) is measured on ``eval_samples`` (default: ``samples``). ``ranking``: "block" (the default:
    :func:`simulate_blocks`, each layer kept float with the activation quantizers only it needs, chosen on the
    fake-quantized model) or a ranking of the float-reference table rows (:func:`rank_layers`: "simulate",
    "impact", "local_sqnr"; the op alone kept float). ``select_samples``: the samples the "block" ranking
    chooses on (default: ``samples``; other samples than the calibration ones and ``eval_samples`` generalize
    better, see :func:`simulate_blocks`); ``shortlist``: how many of the best single blocks the greedy choice
    considers (:func:`simulate_blocks`). ``recipe_options`` go to the recipe (e.g. ``activation_observer``,
    ``bias_correction``, or exclusions already decided)."""
    if not isinstance(max_layers, int) or max_layers < 1:
        raise InspectorError(f"max_layers must be a positive int, got {max_layers!r}")
    if ranking not in _RANKINGS:
        raise InspectorError(f"ranking must be one of {', '.join(map(repr, _RANKINGS))}, got {ranking!r}")
    samples = [tuple(s) for s in samples]
    evals = [tuple(s) for s in (eval_samples or samples)]
    base = _export_run(model, samples, recipe_type, recipe_options)
    culprits, plan = _plan(model, samples, recipe_type, recipe_options, base, ranking, max_layers, select_samples,
                           shortlist)
    fp32 = export(model, evals[:1], ExportRecipe.get_recipe(fp32_recipe_of(recipe_type)))
    float_ms = run_latency_ms(fp32.get_pte_buffer(), evals, latency_repeats)
    nodes = list(recipe_options.pop("quant_exclude_nodes", ()))
    acts = list(recipe_options.pop("quant_exclude_activations", ()))
    rows = [_measure(model, base.et, evals, 0, nodes, acts, latency_repeats)]
    for new_nodes, new_acts in plan:
        new_nodes = [n for n in new_nodes if n not in nodes]
        new_acts = [n for n in new_acts if n not in acts]
        if not new_nodes and not new_acts:  # an earlier step already keeps this culprit float
            continue
        nodes, acts = nodes + new_nodes, acts + new_acts
        opts = {**recipe_options, "quant_exclude_nodes": tuple(nodes), "quant_exclude_activations": tuple(acts)}
        et = export(model, samples, ExportRecipe.get_recipe(recipe_type, **opts)).get_executorch_program_manager()
        rows.append(_measure(model, et, evals, len(rows), nodes, acts, latency_repeats))
    steps = pd.DataFrame(rows)
    lost = 1.0 - steps["cosine"].iloc[0]
    steps["accuracy_recovered"] = [(c - steps["cosine"].iloc[0]) / lost if lost > 0 else 0.0
                                   for c in steps["cosine"]]
    steps["latency_vs_float"] = steps["latency_ms"] / float_ms
    steps["latency_vs_int8"] = steps["latency_ms"] / steps["latency_ms"].iloc[0]
    return FallbackReport(steps, culprits, base.table, float_ms, [base])


def _plan(model: torch.nn.Module, samples: list[tuple], recipe_type: RecipeType, options: dict[str, Any],
          base: QuantizedRun, ranking: str, steps: int, select_samples: Sequence[tuple] | None = None,
          shortlist: int = 12) -> tuple[pd.DataFrame, list[tuple[list[str], list[str]]]]:
    """The culprits and, per step, the (nodes, activations) it adds to the float ones."""
    if ranking != "block":
        culprits = rank_layers(base, ranking, steps).head(steps)
        return culprits, [(layer_nodes(base, culprits.iloc[k]), []) for k in range(len(culprits))]
    quantizers = ExportRecipe.get_recipe(recipe_type, **options).quantization_recipe.quantizers
    chosen = simulate_blocks(model, samples, quantizers[0], steps, shortlist, select_samples=select_samples)
    culprits = pd.DataFrame([{"layer": b.layer, "kept_float": list(b.nodes), "float_activations": list(b.activations),
                              "simulated_cosine": cos} for b, cos in chosen],
                            columns=["layer", "kept_float", "float_activations", "simulated_cosine"])
    return culprits, [(list(b.nodes), list(b.activations)) for b, _ in chosen]


def _measure(model: torch.nn.Module, et: Any, samples: list[tuple], step: int, excluded: list[str],
             activations: list[str], repeats: int) -> dict[str, Any]:
    from edgetorch.runtime import Runtime

    method = Runtime.get().load_program(et.buffer).load_method("forward")
    outputs = [method.execute(*s) for s in samples]
    return {"step": step, "kept_float": list(excluded), "float_activations": list(activations),
            "cosine": cosine_to_float(model, samples, outputs),
            "latency_ms": run_latency_ms(et.buffer, samples, repeats)}


# ---------------------------------------------------------------------------------------------------------------
# block fallback: a layer kept float with the activation quantizers only it needs, chosen by fake-quant simulation
@dataclass(frozen=True)
class Block:
    """One layer kept in float as a block: ``nodes`` (the op, with the relu/hardtanh fused into it) stay
    unannotated, ``activations`` (its output, and each input no other quantized op reads) stay float."""

    layer: str
    nodes: tuple[str, ...]
    activations: tuple[str, ...]


_DQ = "dequantize"


def _is_q(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and "quantize_per" in str(n.target) and _DQ not in str(n.target)


def _q_of(arg: Any) -> torch.fx.Node | None:
    """The quantize node behind ``arg`` when it is ``dequantize(quantize(...))``."""
    if not isinstance(arg, torch.fx.Node) or _DQ not in str(arg.target) or not arg.args:
        return None
    q = arg.args[0]
    return q if isinstance(q, torch.fx.Node) and _is_q(q) else None


def _readers(q: torch.fx.Node) -> set[torch.fx.Node]:
    return {u for dq in q.users for u in dq.users}


def _block(x: torch.fx.Node, by_value: dict[torch.fx.Node, list[torch.fx.Node]]
           ) -> tuple[Block, set[torch.fx.Node]]:
    """The block fallback of op ``x`` of a ``convert_pt2e(..., fold_quantize=False)`` module and the quantize
    nodes it removes."""
    users = list(x.users)
    act = users[0] if len(users) == 1 and users[0].target in FUSED_ACTIVATION_OPS else None
    out = act or x
    removed = set(by_value.get(out, ()))
    floats = [out.name] if removed else []
    w = _q_of(x.args[1]) if x.target in WEIGHTED_OPS and len(x.args) > 1 else None
    if w is not None:
        removed.add(w)
    for a in x.args[:2] if x.target not in WEIGHTED_OPS else x.args[:1]:
        q = _q_of(a)
        if q is not None and q.args[0].op != "get_attr" and _readers(q) <= {x}:
            removed.add(q)
            floats.append(q.args[0].name)
    nodes = (x.name, act.name) if act is not None else (x.name,)
    return Block(x.name, nodes, tuple(dict.fromkeys(floats))), removed


class _FakeQuant:
    """A ``convert_pt2e(..., fold_quantize=False)`` module run with chosen quantize/dequantize pairs taken out
    (the value passed through float): what keeping layers float does, without re-export (the observers of a
    post-training calibration see float values, so the other quantizers do not change)."""

    def __init__(self, converted: torch.fx.GraphModule, samples: list[tuple], refs: list[torch.Tensor]) -> None:
        self.gm, self.samples, self.refs = converted, samples, refs
        nodes = {n.name: n for n in converted.graph.nodes}
        # bias correction: an op whose weight quantizer is taken out gets its own bias back (as a re-export
        # that keeps it float: the correction is per op, from float inputs, so the other ops' do not change)
        self.biases = {nodes[op]: nodes.get(bias) if bias is not None else None
                       for op, bias in converted.meta.get(_BIAS_CORRECTIONS_KEY, {}).items()}

    def cosine(self, removed: set[torch.fx.Node]) -> float:
        saved = {}
        for q in removed:
            for dq in list(q.users):
                for u in dq.users:
                    saved.setdefault(u, (u.args, u.kwargs))
                dq.replace_all_uses_with(q.args[0])
        for op, bias in self.biases.items():
            if op in saved and op.target in WEIGHTED_OPS and _DQ not in str(getattr(op.args[1], "target", "")):
                op.args = (*op.args[:2], bias, *op.args[3:])
        self.gm.recompile()
        try:
            with torch.no_grad():
                cos = [torch.nn.functional.cosine_similarity(_flat_float(self.gm(*s)), r, dim=0).item()
                       for s, r in zip(self.samples, self.refs)]
        finally:
            for u, (args, kwargs) in saved.items():
                u.args, u.kwargs = args, kwargs
            self.gm.recompile()
        return sum(cos) / len(cos)


def simulate_blocks(model: torch.nn.Module, samples: Sequence[tuple], quantizer: Any, steps: int = 3,
                    shortlist: int = 12, select_samples: Sequence[tuple] | None = None) -> list[tuple[Block, float]]:
    """Greedy choice of up to ``steps`` layers (conv, linear, add) to keep float as blocks, simulated on the
    fake-quantized model calibrated on ``samples`` (with the quantizer's bias correction): each candidate's block
    taken out alone first, then, among the ``shortlist`` best, at each step the block that brings the outputs
    closest to the float model's (mean cosine over ``select_samples``, default ``samples``). Returns
    ``[(block, simulated cosine after the step)]``.

    Choosing on other samples than the calibration ones generalizes better when the INT8 loss is spread over many
    tensors, and the calibration samples are the ones the quantizer (ranges, bias correction) fitted: on
    MobileNetV2 the 3 blocks chosen on its 4 calibration samples win back 2 % of the loss on 4 held-out samples,
    chosen on 16 other samples 31 %."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from edgetorch.export.quantizer import capture_float_program, convert_calibrated

    samples = [tuple(s) for s in samples]
    chooses = [tuple(s) for s in select_samples] if select_samples else samples
    prepared = prepare_pt2e(capture_float_program(model, samples[0]).module(), quantizer)
    with torch.no_grad():
        for s in samples:
            prepared(*s)
        refs = [_flat_float(model(*s)) for s in chooses]
    sim = _FakeQuant(convert_calibrated(prepared, quantizer, samples, fold_quantize=False), chooses, refs)
    by_value: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in sim.gm.graph.nodes:
        if _is_q(n):
            by_value.setdefault(n.args[0], []).append(n)
    layers = [n for n in sim.gm.graph.nodes if n.op == "call_function" and n.target in _BLOCK_OPS]
    blocks = dict(_block(x, by_value) for x in layers)
    blocks = {b: r for b, r in blocks.items() if r}
    alone = {b: sim.cosine(r) for b, r in blocks.items()}
    pool = sorted(alone, key=alone.__getitem__, reverse=True)[:shortlist]
    chosen: list[tuple[Block, float]] = []
    for _ in range(min(steps, len(pool))):
        taken = set().union(*(blocks[b] for b, _ in chosen))
        scores = {b: sim.cosine(taken | blocks[b]) for b in pool if b not in {c for c, _ in chosen}}
        best = max(scores, key=scores.__getitem__)
        chosen.append((best, scores[best]))
    return chosen
