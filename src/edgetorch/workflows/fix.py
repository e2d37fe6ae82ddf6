"""Fix and prove it: the smallest set of ops to keep off the delegate, or in float, that brings the final output
within a tolerance; every candidate re-exported, re-run and measured.

The loop of Polygraphy's ``debug precision`` and NNCF's accuracy-controlled quantization, on edgetorch's export
recipes::

    from edgetorch.workflows.fix import find_fix
    from edgetorch.export import PortableRecipeType

    result = find_fix(model, samples, PortableRecipeType.INT8_STATIC_PER_TENSOR, tolerance=0.05)
    print(result.summary())          # the fallback set, proven: final error before/after, re-exports used
    print(result.to_dataframe())     # one row per re-export: ops kept, final error, latency, size

1. **Baseline**: the model is exported with ``recipe_type`` (and ``recipe_options``), run on every sample, and its
   final-output error measured: ``final_error`` = the largest, over the samples, relative L2 error
   ``||runtime - float||_2 / ||float||_2`` of the program's floating-point outputs (concatenated) against the
   float model run eagerly.
2. **Candidates**, ranked: for an INT8 recipe, the layers ``find_culprits`` names on the float-reference gap table
   (``inspector.float_reference``; an abnormal own quantization where the accumulated SQNR falls first, then the
   steepest accumulated drops), each with the ops of its quantized pattern; each layer is offered twice, the
   smaller fix first: its activations kept float (the values its ops read and write,
   ``quant_exclude_activations``; named ``activation:<node>`` in the fix: the ops and their weights stay INT8,
   e.g. an activation with one outlier channel), then its ops kept in float through the recipe's
   ``quant_exclude_nodes``; a layer with an abnormal own quantization a third time, with the values its output
   travels through before a conv/linear mixes it (a residual stream that carries the float model's outlier to
   the end, which no per-tensor INT8 scale holds). For a float recipe of a delegating
   backend (``OrtRecipeType.FP32``), the culprits of the gap table against the ATen program
   (``Inspector.find_culprits``: ops adding error beyond rounding noise), kept off the delegate through the
   recipe's ``exclude_nodes``. Or ``candidates`` given by the caller (groups of node names, best first).
3. **Search**, at most ``max_reexports`` exports: the first ``k`` candidates are kept for ``k`` = 1, 2, 4, ...
   until the final error is within ``tolerance``, then a binary search between the last failing and the first
   passing ``k`` (the error is taken as non-increasing in ``k``). The smallest passing prefix is the fix; each
   step reports its cost (median latency of one run on the edgetorch runtime, program size).
4. **Proof**: the fix's own program was exported and run on every evaluation sample; ``proven`` says its final
   error is within the tolerance.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import torch.utils._pytree as pytree

from edgetorch.errors import InspectorError, RecipeError

log = logging.getLogger(__name__)

__all__ = ["ACTIVATION", "FixResult", "FixStep", "final_error", "find_fix"]


@dataclass
class FixStep:
    """One export: the ops kept (off the delegate / in float), its final error and cost."""

    reexport: int  # 0 = the baseline program
    kept: list[str]
    final_error: float
    within: bool
    latency_ms: float
    size_bytes: int
    candidates_used: int = 0


@dataclass
class FixResult:
    """The search: baseline, ranked candidates, one step per export, and the fix (None when none passed)."""

    mode: str  # "quantization" or "delegate"
    tolerance: float
    candidates: list[list[str]]
    steps: list[FixStep] = field(default_factory=list)
    fix: list[str] | None = None

    @property
    def baseline(self) -> FixStep:
        return self.steps[0]

    @property
    def reexports(self) -> int:
        return len(self.steps) - 1

    @property
    def proven(self) -> bool:
        return self.fix is not None

    @property
    def fix_step(self) -> FixStep | None:
        if self.fix is None:
            return None
        return next(s for s in self.steps if s.within and s.kept == self.fix)

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame([vars(s) for s in self.steps])

    def summary(self) -> str:
        b = self.baseline
        head = (f"baseline final error {b.final_error:.3e} (tolerance {self.tolerance:.3e}), "
                f"{len(self.candidates)} candidate(s), {self.reexports} re-export(s)")
        if b.within:
            return head + ": already within tolerance, nothing to fix"
        s = self.fix_step
        if s is None:
            return head + ": no fix found within the re-export budget"
        verb = "off the delegate" if self.mode == "delegate" else "in float"
        acts = [k.removeprefix(ACTIVATION) for k in self.fix if k.startswith(ACTIVATION)]
        ops = [k for k in self.fix if not k.startswith(ACTIVATION)]
        what = f"{len(ops)} op(s) {verb}: {', '.join(ops)}" if ops else f"{len(acts)} activation(s) {verb}: "
        what += (f" and {len(acts)} activation(s): " if ops and acts else "") + (", ".join(acts) if acts else "")
        return (f"{head}: keep {what} -> final error "
                f"{s.final_error:.3e} (proven), latency {s.latency_ms:.2f} ms vs {b.latency_ms:.2f} ms, size "
                f"{s.size_bytes} vs {b.size_bytes} bytes")


# -- measuring ------------------------------------------------------------------------------------------------
def _flat_float(tree: Any) -> torch.Tensor:
    leaves = [t.detach().reshape(-1).double() for t in pytree.tree_leaves(tree)
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return torch.cat(leaves) if leaves else torch.zeros(0, dtype=torch.float64)


def final_error(reference: Sequence[Any], outputs: Sequence[Any]) -> float:
    """The largest relative L2 error, over samples, of the floating-point outputs against the reference's."""
    worst = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        a, b = _flat_float(ref), _flat_float(out)
        if a.numel() != b.numel():
            raise InspectorError(f"final_error: the program returns {b.numel()} float elements, the model "
                                 f"{a.numel()}")
        den = max(torch.linalg.vector_norm(a).item(), 1e-30)
        err = torch.linalg.vector_norm(a - b).item() / den
        worst = max(worst, err if math.isfinite(err) else math.inf)
    return worst


def _measure(pte: bytes, samples: list[tuple], reference: list[Any], tolerance: float, reexport: int,
             kept: list[str], used: int, repeats: int) -> FixStep:
    from edgetorch.runtime import Runtime
    from edgetorch.workflows.quant_fallback import run_latency_ms

    method = Runtime.get().load_program(pte).load_method("forward")
    outs = [method.execute(*s) for s in samples]
    err = final_error(reference, outs)
    return FixStep(reexport, list(kept), err, err <= tolerance, run_latency_ms(pte, samples, repeats), len(pte),
                   used)


# -- candidates ---------------------------------------------------------------------------------------------
def _is_quantized(recipe_type: Any) -> bool:
    return "int8" in str(getattr(recipe_type, "value", recipe_type)).lower()


#: the prefix of a kept name that is a value kept float (``quant_exclude_activations``), not an op
ACTIVATION = "activation:"


def _quant_candidates(et: Any, samples: list[tuple], top: int) -> list[list[str]]:
    """Per ranked layer (``find_culprits`` on the float-reference table), the smaller first: its activations kept
    float (the values its ops read and write: the ops, their weights included, stay INT8), then its ops kept float;
    for a layer whose own quantization is abnormal (``local_excess_db``), then also the values its output travels
    through (:func:`_stream`: a float model with an outlier there carries it down the residual stream, which no
    per-tensor INT8 scale then holds)."""
    from edgetorch.devtools.inspector.culprits import EXCESS_DB, float_culprits
    from edgetorch.devtools.inspector.float_reference import float_graph
    from edgetorch.workflows.quant_fallback import inspect_quantized, layer_nodes

    run = inspect_quantized(et, samples)
    ranked = float_culprits(run.table, top=top)
    fgm = float_graph(run.inspector, run.table.attrs.get("method", "forward"))
    out: list[list[str]] = []
    for _, row in ranked.iterrows():
        ops = layer_nodes(run, row)
        acts = [ACTIVATION + a for a in _activations(fgm, ops)]
        out += [acts, ops] if acts else [ops]
        if (row.get("local_excess_db") or 0.0) >= EXCESS_DB:
            stream = [ACTIVATION + a for a in _stream(fgm, ops)]
            if stream:
                out.append(stream)
    return out


def _stream(fgm: torch.fx.GraphModule, ops: list[str]) -> list[str]:
    """The values a layer's output travels through before a weighted op (conv/linear/addmm) mixes it: its outputs,
    then every op reading one of these values that is not a weighted op (adds, layer norms, views, a residual stream
    to the end), as node names of the float graph."""
    from edgetorch.exir.quant_annotations import weight_arg

    by_name = {n.name: n for n in fgm.graph.nodes}
    group = {by_name[o] for o in ops if o in by_name}
    todo = [n for n in group if any(u not in group for u in n.users)]
    seen: list[torch.fx.Node] = []
    while todo:
        n = todo.pop(0)
        if n in seen or n.op != "call_function":
            continue
        seen.append(n)
        todo += [u for u in n.users if u not in group and weight_arg(u) is None]
    return [n.name for n in seen]


def _activations(fgm: torch.fx.GraphModule, ops: list[str]) -> list[str]:
    """The activations of a layer (node names of the float graph): the data inputs of its ops from outside the
    layer (not weights or biases: ``get_attr`` and parameter placeholders) and its outputs read outside it."""
    from edgetorch.exir.quant_annotations import data_arg, weight_arg

    by_name = {n.name: n for n in fgm.graph.nodes}
    group = [by_name[o] for o in ops if o in by_name]
    params = {n for n in fgm.graph.nodes if n.op == "get_attr"}
    out: list[str] = []
    for n in group:
        data = n.args[data_arg(n):data_arg(n) + 1] if weight_arg(n) is not None else n.args
        for a in data:
            if isinstance(a, torch.fx.Node) and a not in group and a not in params and not _is_parameter(a):
                out.append(a.name)
        if any(u not in group for u in n.users) and n.op == "call_function":
            out.append(n.name)
    return list(dict.fromkeys(out))


def _is_parameter(n: torch.fx.Node) -> bool:
    v = n.meta.get("val")
    return n.op == "placeholder" and isinstance(v, torch.nn.Parameter)


def _recipe_exclusions(option: str, kept: list[str]) -> dict[str, tuple[str, ...]]:
    """The recipe options that keep ``kept`` (op names, and ``ACTIVATION``-prefixed value names) float."""
    acts = tuple(k.removeprefix(ACTIVATION) for k in kept if k.startswith(ACTIVATION))
    out = {option: tuple(k for k in kept if not k.startswith(ACTIVATION))}
    return {**out, "quant_exclude_activations": acts} if acts else out


def _delegate_candidates(et: Any, samples: list[tuple], top: int) -> list[list[str]]:
    """Edge node names of the culprits of a float delegated program (gaps against the ATen program)."""
    import os
    import tempfile

    from edgetorch.devtools.inspector import Inspector
    from edgetorch.runtime import Runtime

    record = et.get_etrecord()
    record.update_representative_inputs([tuple(samples[0])])
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    program.load_method("forward").execute(*samples[0])
    with tempfile.TemporaryDirectory() as d:
        dump, dbg = os.path.join(d, "f.etdp"), os.path.join(d, "f_debug.bin")
        program.write_etdump_result_to_file(dump, dbg)
        insp = Inspector(etdump_path=dump, etrecord=record, debug_buffer_path=dbg)
        df = insp.calculate_numeric_gap("MSE")
        culprits = insp.find_culprits(df, top=top)
        by_handle = insp.nodes_by_handle(df.attrs.get("method", "forward"))
        groups = []
        for _, row in culprits.iterrows():
            names = [n.name for n in by_handle.get(int(row["ref_handle"]), [])]
            if names and names not in groups:
                groups.append(names)
    return groups


# -- search -------------------------------------------------------------------------------------------------
def _export(model: torch.nn.Module, samples: list[tuple], recipe_type: Any, options: dict[str, Any],
            etrecord: bool) -> Any:
    from edgetorch.export import ExportRecipe, export

    session = export(model, list(samples), ExportRecipe.get_recipe(recipe_type, **options),
                     generate_etrecord=etrecord)
    return session.get_executorch_program_manager()


def _prefix(candidates: list[list[str]], k: int, base: list[str]) -> list[str]:
    out = list(base)
    for group in candidates[:k]:
        out += [n for n in group if n not in out]
    return out


def _search_order(n: int) -> Callable[[dict[int, bool]], int | None]:
    """Next k to try given the results so far: 1, 2, 4, ... up to n until one passes, then bisection."""
    def nxt(done: dict[int, bool]) -> int | None:
        ok = [k for k, v in done.items() if v]
        bad = [k for k, v in done.items() if not v] + [0]
        if not ok:
            k = 1 if not done else min(2 * max(done), n)
            return None if k in done else k
        hi, lo = min(ok), max(k for k in bad if k < min(ok))
        return None if hi - lo <= 1 else (lo + hi) // 2
    return nxt


def find_fix(model: torch.nn.Module, samples: Sequence[tuple], recipe_type: Any, tolerance: float,
             max_reexports: int = 5, candidates: Sequence[Sequence[str]] | None = None, top: int = 8,
             eval_samples: Sequence[tuple] | None = None, latency_repeats: int = 3,
             progress: Callable[[str], None] | None = None, **recipe_options: Any) -> FixResult:
    """Finds and proves the smallest prefix of the ranked candidates whose ops, kept off the delegate (float
    recipes) or in float (INT8 recipes), bring the final output within ``tolerance`` (see the module
    docstring). ``samples`` calibrate (INT8) and rank; ``eval_samples`` (default ``samples``) measure."""
    if not isinstance(tolerance, (int, float)) or not tolerance > 0:
        raise InspectorError(f"find_fix: tolerance must be a positive number, got {tolerance!r}")
    if not isinstance(max_reexports, int) or max_reexports < 1:
        raise InspectorError(f"find_fix: max_reexports must be a positive int, got {max_reexports!r}")
    samples = [tuple(s) for s in samples]
    if not samples:
        raise InspectorError("find_fix: samples is empty: give at least one input tuple")
    evals = [tuple(s) for s in (eval_samples or samples)]
    say = progress or (lambda msg: log.info("%s", msg))
    mode = "quantization" if _is_quantized(recipe_type) else "delegate"
    option = "quant_exclude_nodes" if mode == "quantization" else "exclude_nodes"
    base_kept = list(recipe_options.pop(option, ()))
    if mode == "quantization":  # values the caller already keeps float stay float, as ours
        base_kept += [ACTIVATION + a for a in recipe_options.pop("quant_exclude_activations", ())]
    with torch.no_grad():
        reference = [model(*s) for s in evals]
    et = _export(model, samples, recipe_type, {**recipe_options, **_recipe_exclusions(option, base_kept)},
                 etrecord=candidates is None)
    base = _measure(et.buffer, evals, reference, tolerance, 0, base_kept, 0, latency_repeats)
    say(f"baseline: final error {base.final_error:.3e} (tolerance {tolerance:.3e}), latency "
        f"{base.latency_ms:.2f} ms, {base.size_bytes} bytes")
    if candidates is None:
        if mode == "delegate" and not _delegates(recipe_type):
            raise RecipeError(f"find_fix: recipe {recipe_type!r} neither quantizes nor delegates: nothing to fix")
        candidates = (_quant_candidates(et, samples, top) if mode == "quantization"
                      else _delegate_candidates(et, samples, top))
    cands = _top_layers(_merge_overlapping([list(c) for c in candidates]), top)
    say(f"{len(cands)} candidate(s): " + "; ".join("+".join(c) for c in cands))
    result = FixResult(mode, float(tolerance), cands, [base])
    if base.within or not cands:
        return result
    _search(model, samples, evals, reference, recipe_type, recipe_options, option, base_kept, result,
            max_reexports, latency_repeats, say)
    return result


def _top_layers(groups: list[list[str]], top: int) -> list[list[str]]:
    """The groups of the first ``top`` layers: op groups count, a layer's activation group goes with it."""
    out: list[list[str]] = []
    ops = 0
    for g in groups:
        is_ops = not all(n.startswith(ACTIVATION) for n in g)
        if is_ops and ops == top or not is_ops and ops == top:
            break
        out.append(g)
        ops += is_ops
    return out


def _merge_overlapping(groups: list[list[str]]) -> list[list[str]]:
    """Groups sharing an op are one layer (a conv's row and its fused relu's row): merged into the first. A group
    of activations (values a layer reads and writes) keeps those no earlier group keeps (the output of one layer is
    the input of the next: the groups are not merged into one)."""
    out: list[list[str]] = []
    for g in groups:
        if g and all(n.startswith(ACTIVATION) for n in g):  # values: each kept once, in its first group
            seen = {n for o in out for n in o}
            g = [n for n in dict.fromkeys(g) if n not in seen]
            if g:
                out.append(g)
            continue
        home = next((o for o in out if set(o) & set(g)), None)
        if home is None:
            out.append(list(dict.fromkeys(g)))
        else:
            home += [n for n in g if n not in home]
    return out


def _delegates(recipe_type: Any) -> bool:
    return "onnxruntime" in str(getattr(recipe_type, "value", recipe_type)).lower()


def _search(model: torch.nn.Module, samples: list[tuple], evals: list[tuple], reference: list[Any],
            recipe_type: Any, options: dict[str, Any], option: str, base_kept: list[str], result: FixResult,
            budget: int, repeats: int, say: Callable[[str], None]) -> None:
    nxt = _search_order(len(result.candidates))
    done: dict[int, bool] = {}
    while len(result.steps) - 1 < budget:
        k = nxt(done)
        if k is None:
            break
        kept = _prefix(result.candidates, k, base_kept)
        et = _export(model, samples, recipe_type, {**options, **_recipe_exclusions(option, kept)}, etrecord=False)
        step = _measure(et.buffer, evals, reference, result.tolerance, len(result.steps), kept, k, repeats)
        result.steps.append(step)
        done[k] = step.within
        say(f"re-export {step.reexport}: keep {k} candidate(s) ({len(kept)} ops) -> final error "
            f"{step.final_error:.3e} {'within' if step.within else 'above'} tolerance, latency "
            f"{step.latency_ms:.2f} ms, {step.size_bytes} bytes")
    passing = [s for s in result.steps[1:] if s.within]
    best = min(passing, key=lambda s: (s.candidates_used, s.reexport)) if passing else None
    acts = [k for k in best.kept if k.startswith(ACTIVATION) or k in base_kept] if best is not None else []
    tried = [sorted(s.kept) for s in result.steps]
    if best is not None and len(result.steps) - 1 < budget and len(base_kept) < len(acts) < len(best.kept) \
            and sorted(acts) not in tried:
        # the smaller fix: the prefix's activations alone (its ops, weights included, INT8 again)
        et = _export(model, samples, recipe_type, {**options, **_recipe_exclusions(option, acts)}, etrecord=False)
        step = _measure(et.buffer, evals, reference, result.tolerance, len(result.steps), acts, 0, repeats)
        result.steps.append(step)
        say(f"re-export {step.reexport}: keep the activations of the fix alone ({len(acts)}) -> final error "
            f"{step.final_error:.3e} {'within' if step.within else 'above'} tolerance, {step.size_bytes} bytes")
        if step.within:
            result.fix = acts
            return
    if passing:
        result.fix = min(passing, key=lambda s: (s.candidates_used, s.reexport)).kept
