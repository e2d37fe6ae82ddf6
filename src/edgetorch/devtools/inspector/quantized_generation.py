"""A low-bit (torchao 8da4w / int4 / int8 weight) LLM generation debugged against the float model, token by layer.

The program's quantized layers are its ``edgetorch::linear_q4`` / ``linear_q8`` ops (``export.lowbit``), each
named by the module path of the Linear it replaced (``layers.1.feed_forward.w2``). For every execution recorded
in the ETDump (``prefill``, then one ``decode`` per generated token) the float model is run on the same inputs
the runtime got (teacher forcing: its own float KV cache, fed the runtime's tokens), its Linear outputs captured
with forward hooks, and each quantized layer's logged runtime output is compared with:

* the float model's output of the same Linear: ``sqnr_db``, the accumulated error (every earlier layer's and
  every earlier token's quantization);
* the float Linear applied to the runtime's own input of the layer (the layer's logged input, float weights):
  ``local_sqnr_db``, the error this layer's quantization adds on the input the runtime gave it;
* the program's own low-bit op (its packed weights and scales) applied to the float model's input of the layer:
  ``own_sqnr_db``, the error the layer's quantization adds by itself, none inherited (an upstream fault that
  fills a layer's input with outliers ruins that layer's 8-bit activation quantization on the runtime's input,
  not on the float one).

``impact=True`` adds ``logit_share``: the logit noise power of the float model with only this layer's own local
error added to its output (one more float forward per layer), over the runtime's logit noise power against the
float model: the layer's share of the logit error (shares need not add up to 1: errors interact).

``attrs["tokens"]`` has one row per execution: the runtime's greedy token, the float model's on the same inputs
and the logits SQNR; ``attrs["first_divergence"]`` is the first execution whose greedy choice differs from the
float model's (None when none does). ``attrs["ranking"]`` is each layer's mean own SQNR over the executions, worst
first (one decode token is a small sample: rank on the mean); ``attrs["abnormal"]`` the layers whose mean own
SQNR is out of line with the others' (``abnormal_layers``: a robust outlier test; clean int4 layers lie within a
few dB of each other). ``attrs["responsible_layer"]`` is the most abnormal layer, or, when none is, the layer with
the lowest local SQNR in the first diverging execution (the worst of the ranking when none diverges). ``pivot``
turns the long table into token x layer.

The float model is the one passed, or (``float_model=None``) the float programs the ETRecord of a torchao-recipe
export holds (``graph_map["float/<method>"]``, run by ``_float_programs.RecordedFloat``): the same table.

Used through ``Inspector.quantized_generation_table(float_model=None)``.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import torch
import torch.fx
import torch.utils._pytree as pytree

from edgetorch.devtools.inspector.numeric_gap import (
    module_path,
    reference_handles,
    resolve_entry,
    runtime_entries,
    runtime_values,
)
from edgetorch.errors import InspectorError

__all__ = ["ABNORMAL_DB", "COLUMNS", "abnormal_layers", "has_low_bit_layers", "layer_ranking", "lowbit_layers",
           "pivot", "quantized_generation_table", "sqnr_db"]

COLUMNS = ["execution", "method", "run", "layer", "sqnr_db", "local_sqnr_db", "own_sqnr_db"]
_LOWBIT_OPS = ("linear_q4", "linear_q8")
#: ops the runtime may not log (views, layout changes): replayed on their source's runtime value
_VIEW_OPS = {"view", "reshape", "_unsafe_view", "view_copy", "squeeze", "unsqueeze", "alias", "permute",
             "permute_copy", "transpose", "t", "clone", "contiguous", "expand", "alias_copy"}


def sqnr_db(ref: torch.Tensor, got: torch.Tensor) -> float:
    """10 log10(|ref|^2 / |ref - got|^2) in float64 (inf when equal, NaN when the shapes cannot be paired)."""
    if ref.numel() != got.numel():
        return math.nan
    r = ref.detach().double().reshape(-1)
    noise = float((r - got.detach().double().reshape(-1)).pow(2).sum())
    signal = float(r.pow(2).sum())
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def _op_name(n: torch.fx.Node) -> str:
    t = n.target
    return str(getattr(t, "__name__", t)).split(".")[0] if n.op == "call_function" else ""


def lowbit_layers(gm: torch.fx.GraphModule) -> list[tuple[str, torch.fx.Node]]:
    """(module path, node) of every low-bit linear op of the graph, in graph order."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and any(f"edgetorch.{op}" in str(n.target) for op in _LOWBIT_OPS):
            out.append((module_path(n) or n.name, n))
    return out


def _runtime_by_node(gm: torch.fx.GraphModule, entries: list[Any]) -> dict[torch.fx.Node, torch.Tensor]:
    """The runtime's logged value of each graph node that is the last op of its debug handle."""
    last, _ = reference_handles(gm)
    order = {h: i for i, h in enumerate(last)}
    out: dict[torch.fx.Node, torch.Tensor] = {}
    for e in entries:
        res = resolve_entry(e, last, order)
        if isinstance(res, str):
            continue
        h, index = res
        want = last[h].meta.get("val")
        if want is None:  # a graph without fake values (a dynamic method's stored document): one output only
            got = e.tensors[0] if len(e.tensors) == 1 else None
        else:
            vals = runtime_values(e, h, index, want)
            got = vals.get(0) if isinstance(vals, dict) else None
        if isinstance(got, torch.Tensor) and last[h] not in out:
            out[last[h]] = got
    return out


def _replayed(n: torch.fx.Node, src: torch.Tensor) -> torch.Tensor | None:
    """View op ``n`` applied to its source's runtime value; a size given by a graph node (a dynamic dimension)
    becomes -1, once."""
    def arg(a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return -1 if isinstance(a, torch.fx.Node) else a

    rest = arg(tuple(n.args[1:]))
    if str(rest).count("-1") > 1:  # several dynamic sizes: a view keeping its last (static) dimension
        shape = rest[0] if rest and isinstance(rest[0], (list, tuple)) else ()
        last = shape[-1] if shape else -1
        ok = _op_name(n) in {"view", "reshape", "_unsafe_view", "view_copy"} and last > 0
        return src.reshape(-1, last) if ok and src.numel() % last == 0 else None
    try:  # a view of a non-contiguous source (after a permute the runtime materialised) is a reshape
        reshape = _op_name(n) in {"view", "_unsafe_view", "view_copy"}
        out = src.reshape(*rest) if reshape else n.target(src, *rest, **n.kwargs)
    except (RuntimeError, TypeError, ValueError):
        return None
    return out if isinstance(out, torch.Tensor) else None


def _runtime_of(n: Any, values: dict[torch.fx.Node, torch.Tensor]) -> torch.Tensor | None:
    """The runtime value of node ``n``: logged, or (through views and layout changes the runtime did not log)
    its source's, with those ops replayed."""
    chain = []
    while isinstance(n, torch.fx.Node) and n not in values:
        if _op_name(n) not in _VIEW_OPS or not n.args:
            return None
        chain.append(n)
        n = n.args[0]
    if not isinstance(n, torch.fx.Node):
        return None
    got: torch.Tensor | None = values[n]
    for v in reversed(chain):
        got = _replayed(v, got)
        if got is None:
            return None
    return got


class _EagerFloat:
    """The float reference as an eager model: forward hooks on its Linears named ``paths`` capture their last
    output per call; ``call(..., inject=(path, error))`` adds an error to one Linear's output."""

    def __init__(self, model: torch.nn.Module, paths: list[str]) -> None:
        self.model = model
        self.outputs: dict[str, torch.Tensor] = {}
        self.inputs: dict[str, torch.Tensor] = {}
        self._handles = []
        for p in paths:
            try:
                mod = model.get_submodule(p)
            except AttributeError:
                continue
            self._handles.append(mod.register_forward_hook(self._hook(p)))

    def _hook(self, path: str) -> Any:
        def hook(_m: torch.nn.Module, args: Any, out: Any) -> None:
            self.outputs[path] = out.detach()
            if args and isinstance(args[0], torch.Tensor):
                self.inputs[path] = args[0].detach()
        return hook

    def reset(self) -> None:
        if hasattr(self.model, "reset_cache"):
            self.model.reset_cache()

    def linear(self, path: str) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        try:
            mod = self.model.get_submodule(path)
        except AttributeError:
            return None
        return (mod.weight, mod.bias) if isinstance(mod, torch.nn.Linear) else None

    def call(self, method: str, inputs: list[Any], inject: tuple[str, torch.Tensor] | None = None) -> Any:
        handle = None
        if inject is not None:
            path, e = inject

            def add(_m: torch.nn.Module, _i: Any, y: torch.Tensor) -> torch.Tensor:
                return y + e.reshape(y.shape).to(y.dtype) if e.numel() == y.numel() else y

            handle = self.model.get_submodule(path).register_forward_hook(add)
        try:
            return _call(self.model, method, inputs)
        finally:
            if handle is not None:
                handle.remove()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def has_low_bit_layers(inspector: Any) -> bool:
    """Whether some recorded method's program holds a low-bit linear op (a torchao-recipe export)."""
    replay = inspector.replay(None)
    methods = dict.fromkeys(r.execution.method for r in replay.records)
    return any(lowbit_layers(replay.module(m)[0]) for m in methods)


def _recorded_float(inspector: Any, records: list[Any]) -> Any:
    from edgetorch.devtools.inspector._float_programs import RecordedFloat

    return RecordedFloat.from_inspector(inspector, list(dict.fromkeys(r.execution.method for r in records)),
                                        module_path)


def _first_tensor(v: Any) -> torch.Tensor | None:
    return next((x for x in pytree.tree_leaves(v) if isinstance(x, torch.Tensor)), None)


def _greedy(logits: torch.Tensor | None) -> int | None:
    if logits is None or logits.numel() == 0:
        return None
    return int(logits.reshape(-1, logits.shape[-1])[-1].argmax())


def _call(model: torch.nn.Module, method: str, inputs: list[Any]) -> Any:
    fn = model if method == "forward" else getattr(model, method, None)
    if fn is None:
        raise InspectorError(f"the float model has no method '{method}' (the ETDump recorded executions of it)")
    return fn(*inputs)


def _noise(ref: torch.Tensor | None, got: torch.Tensor | None) -> float:
    if ref is None or got is None or ref.numel() != got.numel():
        return math.nan
    return float((ref.detach().double().reshape(-1) - got.detach().double().reshape(-1)).pow(2).sum())


def _impacts(ref: Any, rec: Any, errors: dict[str, torch.Tensor], clean: torch.Tensor | None) -> dict[str, float]:
    """Per layer, the logit noise power (against the clean float logits) of the float model with that layer's
    own local error alone added to its output; each run writes this execution's cache slots, which the clean
    run that follows rewrites."""
    return {path: _noise(clean, _first_tensor(ref.call(rec.execution.method, list(rec.inputs), (path, err))))
            for path, err in errors.items()}


def _attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _own_output(gm: torch.fx.GraphModule, node: torch.fx.Node, x: torch.Tensor) -> torch.Tensor | None:
    """The program's low-bit op ``node`` (its packed weight and scales) applied to input ``x``: None when an
    argument is not a constant of the graph."""
    args = []
    for a in node.args[1:]:
        if isinstance(a, torch.fx.Node):
            a = _attr(gm, str(a.target)) if a.op == "get_attr" else None
            if not isinstance(a, torch.Tensor):
                return None
        args.append(a)
    try:
        out = node.target(x, *args, **node.kwargs)
    except (RuntimeError, TypeError, ValueError):
        return None
    return out if isinstance(out, torch.Tensor) else None


def _own_sqnr(gm: torch.fx.GraphModule, node: torch.fx.Node, ref: Any, path: str) -> float:
    """SQNR of the layer's quantized op against its float Linear, both fed the float model's own input of the
    layer (its last call): the error the layer's quantization adds by itself, none inherited from upstream."""
    x, lin = getattr(ref, "inputs", {}).get(path), ref.linear(path)
    if x is None or lin is None:
        return math.nan
    got = _own_output(gm, node, x.to(torch.float32))
    return math.nan if got is None else sqnr_db(torch.nn.functional.linear(x.to(lin[0].dtype), *lin), got)


def _execution_rows(inspector: Any, replay: Any, rec: Any, ref: Any,
                    impact: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    ex = rec.execution
    gm, _ = replay.module(ex.method)
    values = _runtime_by_node(gm, runtime_entries(inspector.event_blocks[rec.block].events, rec.block_run))
    rows, errors = [], {}
    for path, node in lowbit_layers(gm):
        rt, x, lin = _runtime_of(node, values), _runtime_of(node.args[0], values), ref.linear(path)
        local = math.nan
        if rt is not None and x is not None and lin is not None:
            own = torch.nn.functional.linear(x.to(lin[0].dtype), *lin)
            local = sqnr_db(own, rt)
            errors[path] = rt.reshape(own.shape).to(own.dtype) - own
        rows.append({"execution": ex.index, "method": ex.method, "run": ex.run, "layer": path, "sqnr_db": math.nan,
                     "local_sqnr_db": local, "own_sqnr_db": math.nan, "_rt": rt, "_node": node})
    rt_logits = _first_tensor(rec.outputs)
    impacts: dict[str, float] = {}
    if impact:
        clean = _first_tensor(ref.call(ex.method, list(rec.inputs)))
        impacts = _impacts(ref, rec, errors, clean)
    ref.outputs.clear()
    getattr(ref, "inputs", {}).clear()
    fl_logits = _first_tensor(ref.call(ex.method, list(rec.inputs)))  # the clean run, last
    total = _noise(fl_logits, rt_logits)
    for row in rows:
        rt, flt = row.pop("_rt"), ref.outputs.get(row["layer"])
        row["own_sqnr_db"] = _own_sqnr(gm, row.pop("_node"), ref, row["layer"])
        row["sqnr_db"] = sqnr_db(flt, rt) if rt is not None and flt is not None else math.nan
        if impact:
            share = impacts.get(row["layer"], math.nan)
            row["logit_share"] = share / total if total and total == total else math.nan
    logit_sqnr = sqnr_db(fl_logits, rt_logits) if rt_logits is not None and fl_logits is not None else math.nan
    token = {"execution": ex.index, "method": ex.method, "run": ex.run, "runtime_token": _greedy(rt_logits),
             "float_token": _greedy(fl_logits), "logits_sqnr_db": logit_sqnr}
    return rows, token


#: a layer is abnormal when its mean own SQNR lies at least this far (dB) below the median layer's, and beyond
#: ``ABNORMAL_MADS`` robust deviations of the layers' spread: clean int4 layers lie within a few dB of each other
ABNORMAL_DB = 8.0
ABNORMAL_MADS = 4.0


def layer_ranking(df: pd.DataFrame) -> pd.Series:
    """Each layer's mean own SQNR over the executions (its quantized op fed the float model's own input: the
    error it adds by itself, none inherited from upstream layers), worst (lowest) first; the mean local SQNR
    (fed the runtime's input) for a table without own SQNRs. An exact layer counts as 1e9 dB."""
    col = "own_sqnr_db" if "own_sqnr_db" in df and df["own_sqnr_db"].notna().any() else "local_sqnr_db"
    rows = df[df[col].notna()]
    means = rows.assign(s=rows[col].clip(upper=1e9)).groupby("layer", sort=False)["s"].mean()
    return means.sort_values(kind="stable").rename(f"mean_{col.removesuffix('_db')}_db")


def abnormal_layers(ranking: pd.Series) -> list[str]:
    """The layers of ``ranking`` (``layer_ranking``) whose own error is abnormal, worst first: mean SQNR below
    the median layer's by more than ``ABNORMAL_DB`` and ``ABNORMAL_MADS`` median absolute deviations (a robust
    outlier test: a layer inheriting error from an upstream one keeps a normal own SQNR)."""
    finite = ranking[ranking.map(math.isfinite) & (ranking < 1e9)]
    if len(finite) < 3:
        return []
    med = float(finite.median())
    mad = float((finite - med).abs().median())
    limit = med - max(ABNORMAL_DB, ABNORMAL_MADS * 1.4826 * mad)
    return [str(p) for p, v in ranking.items() if v < limit]


def _responsible(df: pd.DataFrame, execution: int | None, abnormal: list[str]) -> str | None:
    if abnormal:  # a layer whose own quantization is abnormal, wherever the tokens first differ
        return abnormal[0]
    if execution is None:  # no divergence: the worst layer over the whole generation
        ranking = layer_ranking(df)
        return str(ranking.index[0]) if len(ranking) else None
    rows = df[(df["execution"] == execution) & df["local_sqnr_db"].notna()]
    return None if rows.empty else str(rows.loc[rows["local_sqnr_db"].idxmin(), "layer"])


def quantized_generation_table(inspector: Any, float_model: torch.nn.Module | None = None,
                               impact: bool = False) -> pd.DataFrame:
    """One row per (execution, quantized layer) of the recorded generation against ``float_model`` (see the
    module docstring), or, when None, against the float programs the ETRecord holds (``graph_map["float/<method>"]``,
    recorded by a torchao-recipe export with ``generate_etrecord=True``). The float model runs every execution in
    order on the runtime's inputs; its KV cache is reset first (``reset_cache()`` when it has one; a recorded
    program's mutated buffers go back to their recorded values) and left as the last execution left it.
    ``impact=True`` adds ``logit_share`` (one more float forward per layer and execution)."""
    replay = inspector.replay(None)
    records = replay.records
    if not records:
        raise InspectorError("the ETDump records no execution")
    missing = [r.execution.index for r in records if r.inputs is None]
    if missing:
        raise InspectorError(f"executions {missing} logged no inputs: record the ETDump with a debug buffer "
                             "(debug_buffer_size=... or debug_buffer_path=...) to replay the float model on them")
    paths = list(dict.fromkeys(p for m in dict.fromkeys(r.execution.method for r in records)
                               for p, _ in lowbit_layers(replay.module(m)[0])))
    if not paths:
        raise InspectorError("the program has no low-bit layer (edgetorch::linear_q4 / linear_q8): export it "
                             "with a torchao recipe (e.g. portable_torchao_8da4w)")
    ref: Any = _EagerFloat(float_model, paths) if float_model is not None else _recorded_float(inspector, records)
    ref.reset()
    rows: list[dict[str, Any]] = []
    tokens = []
    try:
        with torch.no_grad():
            for rec in records:
                r, t = _execution_rows(inspector, replay, rec, ref, impact)
                rows.extend(r)
                tokens.append(t)
                inspector.release_debug_buffer_pages()  # one call's values resident at a time (llama_1b: 714 MiB)
    finally:
        ref.remove()
    df = pd.DataFrame(rows, columns=COLUMNS + (["logit_share"] if impact else []))
    tok = pd.DataFrame(tokens)
    first = next((int(t["execution"]) for t in tokens
                  if t["runtime_token"] is not None and t["runtime_token"] != t["float_token"]), None)
    ranking = layer_ranking(df)
    abnormal = abnormal_layers(ranking)
    df.attrs.update(tokens=tok, first_divergence=first, responsible_layer=_responsible(df, first, abnormal),
                    ranking=ranking, abnormal=abnormal, reference_graph="float")
    return df


def pivot(df: pd.DataFrame, value: str = "local_sqnr_db") -> pd.DataFrame:
    """The table as token (execution) x layer of one column (``local_sqnr_db`` or ``sqnr_db``)."""
    return df.pivot(index="execution", columns="layer", values=value)[list(dict.fromkeys(df["layer"]))]
