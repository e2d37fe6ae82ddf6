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
* ``samples``: how many (sample, run) pairs the row aggregates: every recorded execution of ``method`` that has
  a representative input (record the calibration set with ``etrecord.update_representative_inputs(samples)``).

:func:`rank_quantization_culprits` orders the rows worst first (lowest local SQNR).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pandas as pd
import torch
import torch.fx
import torch.utils._pytree as pytree

from edgetorch.devtools.inspector.comparators import get_comparator
from edgetorch.devtools.inspector.numeric_gap import RuntimeEntry, runtime_entries
from edgetorch.errors import InspectorError
from edgetorch.exir.debug_handles import get_debug_handle, source_location
from edgetorch.exir.quant_annotations import ANNOTATED_OPS, float_handle, module_paths

__all__ = ["FLOAT_GRAPH", "float_graph", "float_numeric_gap", "output_impact", "rank_quantization_culprits",
           "simulate_fallback", "with_output_impact"]

#: the ``reference_graph`` name of the float model
FLOAT_GRAPH = "float"

import torch.ao.quantization.fx._decomposed  # noqa: E402, F401  (registers torch.ops.quantized_decomposed)

qd = torch.ops.quantized_decomposed
_QUANTIZE = {qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor}
_DEQUANTIZE = {qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor,
               qd.dequantize_per_channel.default}
_BATCH_NORMS = {torch.ops.aten.batch_norm.default, torch.ops.aten._native_batch_norm_legit_no_training.default}


# ---------------------------------------------------------------------------------------------------------------
# the quantized program: per float handle, the edge nodes of its group and where its runtime value comes from
@dataclass
class _Source:
    node: torch.fx.Node
    scale: float | None = None  # set for a quantize node: its int8 output is dequantized with these
    zero_point: int = 0


@dataclass
class _Group:
    handle: int
    nodes: list[torch.fx.Node]
    sources: list[_Source] = field(default_factory=list)
    output_scale: float | None = None
    weight_dequant: torch.fx.Node | None = None


def _users(n: torch.fx.Node, targets: set) -> list[torch.fx.Node]:
    return [u for u in n.users if u.op == "call_function" and u.target in targets]


def _static_qparams(q: torch.fx.Node) -> tuple[float, int] | None:
    scale, zp = (q.args[1:3] + (0,))[:2] if len(q.args) >= 3 else (None, 0)
    if isinstance(scale, float) and isinstance(zp, int):
        return scale, zp
    return None


def _output_sources(end: torch.fx.Node) -> tuple[list[_Source], float | None]:
    """Where the group ending at ``end`` hands its value downstream, preferred first: dequantize(quantize(end)),
    quantize(end) (int8, dequantized here), ``end`` itself."""
    sources: list[_Source] = []
    scale = None
    for q in _users(end, _QUANTIZE):
        params = _static_qparams(q)
        scale = params[0] if params else None
        sources += [_Source(dq) for dq in _users(q, _DEQUANTIZE)]
        if params:
            sources.append(_Source(q, *params))
        break
    sources.append(_Source(end))
    return sources, scale


def _weight_dequant(nodes: list[torch.fx.Node]) -> torch.fx.Node | None:
    """The dequantize of a constant (int8 weight) feeding the group, through view-like ops (permute, t)."""
    for n in nodes:
        todo = [a for a in n.all_input_nodes]
        while todo:
            a = todo.pop()
            if a.op != "call_function":
                continue
            if a.target in _DEQUANTIZE and a.args and isinstance(a.args[0], torch.fx.Node) \
                    and a.args[0].op == "get_attr":
                return a
            if float_handle(a) is None and len(a.all_input_nodes) == 1 and a.target not in _DEQUANTIZE:
                todo.append(a.all_input_nodes[0])
    return None


def quantized_groups(qgm: torch.fx.GraphModule) -> dict[int, _Group]:
    """Per float handle, the edge nodes that carry it (graph order) and where its runtime value comes from."""
    groups: dict[int, _Group] = {}
    for n in qgm.graph.nodes:
        h = float_handle(n) if n.op == "call_function" else None
        if h is not None:
            groups.setdefault(h, _Group(h, [])).nodes.append(n)
    for g in groups.values():
        g.sources, g.output_scale = _output_sources(g.nodes[-1])
        g.weight_dequant = _weight_dequant(g.nodes)
    return groups


def _edge_last(qgm: torch.fx.GraphModule) -> dict[int, torch.fx.Node]:
    """Per edge debug handle, its last node (the one whose output the runtime logs for that handle)."""
    last: dict[int, torch.fx.Node] = {}
    for n in qgm.graph.nodes:
        h = get_debug_handle(n) if n.op == "call_function" else None
        if h is not None:
            last[h] = n
    return last


def _const_eval(gm: torch.fx.GraphModule, n: torch.fx.Node) -> Any:
    """The value of ``n``, computed from constants only (get_attr nodes and literals)."""
    if n.op == "get_attr":
        obj: Any = gm
        for part in str(n.target).split("."):
            obj = getattr(obj, part)
        return obj
    args = torch.fx.node.map_arg(n.args, lambda a: _const_eval(gm, a))
    kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: _const_eval(gm, a))
    return n.target(*args, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# runtime values
def _runtime_by_edge_handle(entries: list[RuntimeEntry], order: dict[int, int]) -> dict[int, list[torch.Tensor]]:
    """Edge debug handle -> the runtime tensors logged for its last node (inner delegate rows first, delegate
    call outputs where nothing finer was logged)."""
    out: dict[int, list[torch.Tensor]] = {}
    for e in entries:
        if e.is_delegate_call:
            continue
        hs = [h for h in e.handles if h in order]
        if hs:
            out[max(hs, key=order.__getitem__)] = e.tensors
    for e in entries:
        if e.is_delegate_call and e.output_sources and len(e.output_sources) == len(e.tensors):
            for src, t in zip(e.output_sources, e.tensors):
                if src is not None and src[0] not in out:
                    out[src[0]] = [t]
    return out


@dataclass(frozen=True)
class _Read:
    """One place a runtime value may be read from: the logged tensors of an edge handle, those of the given dtype
    and size, dequantized with ``scale``/``zero_point`` when set."""

    edge_handle: int
    node: torch.fx.Node
    dtype: torch.dtype
    numel: int
    scale: float | None
    zero_point: int


@dataclass(frozen=True)
class _RowPlan:
    """How to read a row's runtime value (first readable source wins), and its shape in the float graph."""

    end: torch.fx.Node  # the float node of the row (its chain's last)
    handle: int
    reads: tuple[_Read, ...]
    own: tuple[_Read, ...]  # the op's own output, before the group's output quantization
    shape: torch.Size
    dtype: torch.dtype


def _reads(sources: list[_Source], last: dict[int, torch.fx.Node]) -> tuple[_Read, ...]:
    out = []
    for s in sources:
        h = get_debug_handle(s.node)
        val = s.node.meta.get("val")
        val = val[0] if isinstance(val, (list, tuple)) and val else val
        if h is not None and last.get(h) is s.node and isinstance(val, torch.Tensor):
            out.append(_Read(h, s.node, val.dtype, val.numel(), s.scale, s.zero_point))
    return tuple(out)


def _read(reads: tuple[_Read, ...], rt: dict[int, list[torch.Tensor]]) -> tuple[torch.Tensor, torch.fx.Node] | None:
    """The first readable source's runtime value (dequantized), or None."""
    for r in reads:
        t = next((t for t in rt.get(r.edge_handle, ()) if t.dtype == r.dtype and t.numel() == r.numel), None)
        if t is None:
            continue
        if r.scale is not None:  # the same float32 arithmetic as (t - zero_point) * scale, one buffer
            t = t.to(torch.float32, copy=True).sub_(r.zero_point).mul_(r.scale)
        if t.is_floating_point():
            return t, r.node
    return None


def _row_plans(groups: dict[int, _Group], chains: dict[int, list[torch.fx.Node]],
               last: dict[int, torch.fx.Node]) -> list[_RowPlan]:
    plans = []
    for h, chain in chains.items():
        like = _meta_tensor(chain[-1])
        if like is not None:
            plans.append(_RowPlan(chain[-1], h, _reads(groups[h].sources, last),
                                  _reads(groups[h].sources[-1:], last), like.shape, like.dtype))
    return plans


def _input_plans(qgm: torch.fx.GraphModule, last: dict[int, torch.fx.Node],
                 float_inputs: list[torch.fx.Node]) -> list[tuple[int, tuple[_Read, ...], torch.Tensor]]:
    """Per user input the program quantizes: (index, where to read its dequantized runtime value, the float
    graph's input)."""
    out = []
    for i, p in enumerate(n for n in qgm.graph.nodes if n.op == "placeholder"):
        like = _meta_tensor(float_inputs[i]) if i < len(float_inputs) else None
        reads = _reads(_output_sources(p)[0][:-1], last)
        if like is not None and reads:
            out.append((i, reads, like))
    return out


def _quantized_inputs(plans: list[tuple[int, tuple[_Read, ...], torch.Tensor]],
                      rt: dict[int, list[torch.Tensor]]) -> dict[int, torch.Tensor]:
    """User input index -> the runtime's dequantized value of that input (where the program quantizes it),
    shaped as the float graph's input."""
    out = {}
    for i, reads, like in plans:
        got = _read(reads, rt)
        if got is not None and got[0].numel() == like.numel():
            out[i] = got[0].reshape(like.shape).to(like.dtype)
    return out


# ---------------------------------------------------------------------------------------------------------------
# the float side
def _float_ends(fgm: torch.fx.GraphModule, groups: dict[int, _Group]) -> dict[int, list[torch.fx.Node]]:
    """Per float handle with a quantized group: the float nodes whose result the group computes, the op first,
    then the ops folded into it at prepare time (single-user successors with no quantized counterpart)."""
    chains: dict[int, list[torch.fx.Node]] = {}
    for n in fgm.graph.nodes:
        h = get_debug_handle(n) if n.op == "call_function" else None
        if h is None or h not in groups:
            continue
        chain = [n]
        while len(chain[-1].users) == 1:
            (u,) = chain[-1].users
            hu = get_debug_handle(u) if u.op == "call_function" else None
            if hu is None or hu in groups or u.target is operator.getitem:
                break
            chain.append(u)
        chains[h] = chain
    return chains


def _float_weight(fgm: torch.fx.GraphModule, chain: list[torch.fx.Node]) -> torch.Tensor | None:
    """The float weight of the op heading ``chain``, a batch norm folded into it applied per output channel."""
    head = chain[0]
    w = head.args[1] if len(head.args) > 1 else None
    if not isinstance(w, torch.fx.Node) or w.op != "get_attr":
        return None
    weight = _const_eval(fgm, w).detach()
    for n in chain[1:]:
        if n.target in _BATCH_NORMS:
            gamma, var = (_const_eval(fgm, a) if isinstance(a, torch.fx.Node) else a for a in (n.args[1], n.args[4]))
            eps = n.args[-1] if n.target is torch.ops.aten._native_batch_norm_legit_no_training.default \
                else n.args[7]
            factor = (gamma if gamma is not None else 1.0) / torch.sqrt(var + eps)
            weight = weight * factor.reshape(-1, *([1] * (weight.dim() - 1)))
    return weight


def _mutable(n: torch.fx.Node) -> bool:
    return isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable


def _functional(op: Any) -> Any:
    """The out-of-place twin of an in-place ATen op (``aten.hardtanh_.default`` -> ``aten.hardtanh.default``),
    or None."""
    name = getattr(op, "_schema", None) and op._schema.name
    if not name or not name.startswith("aten::") or not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(torch.ops.aten, name[len("aten::"):-1], None)
    twin = getattr(packet, op._overloadname, None) if packet is not None else None
    if twin is None or twin._schema.is_mutable or len(twin._schema.arguments) != len(op._schema.arguments):
        return None
    return twin


def _meta_tensor(n: torch.fx.Node) -> torch.Tensor | None:
    v = n.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def _joint_module(fgm: torch.fx.GraphModule, row_nodes: tuple[torch.fx.Node, ...],
                  input_index: tuple[int, ...], with_float: bool = True) -> torch.fx.GraphModule:
    """A generated module that runs the float graph twice in one call: on the float values (the accumulated
    reference) and on the runtime's values (the local reference: each op fed the runtime's values of its inputs,
    the runtime value substituted at every row). Its inputs: the user inputs, the runtime's dequantized inputs
    (``input_index``), then the runtime value of each row; it returns (float, local) per row, or only the local
    values without ``with_float`` (the float pass then computes only what the local one reads). Generated Python
    code, not an interpreter: small models pay no per-node dispatch overhead."""
    g = torch.fx.Graph()
    ref: dict[torch.fx.Node, torch.fx.Node] = {}
    rt: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = [n for n in fgm.graph.nodes if n.op == "placeholder"]
    for p in placeholders:
        ref[p] = g.placeholder(p.name)
    for i in input_index:
        rt[placeholders[i]] = g.placeholder(f"runtime_input_{i}")
    row_inputs = {n: g.placeholder(f"runtime_{n.name}") for n in row_nodes}
    outs: list[torch.fx.Node] = []

    def call(n: torch.fx.Node, env: Any) -> torch.fx.Node:
        args = torch.fx.node.map_arg(n.args, env)
        kwargs = torch.fx.node.map_arg(n.kwargs, env)
        functional = _functional(n.target) if _mutable(n) else None
        if functional is not None:  # relu_ -> relu: the same values, no write into values other rows read
            return g.call_function(functional, args, kwargs)
        if _mutable(n):  # never write into values other rows still read
            clone = torch.ops.aten.clone.default
            args = torch.fx.node.map_arg(args, lambda a: g.call_function(clone, (a,)))
            kwargs = torch.fx.node.map_arg(kwargs, lambda a: g.call_function(clone, (a,)))
        return g.call_function(n.target, args, kwargs)

    for n in fgm.graph.nodes:
        if n.op == "get_attr":
            ref[n] = g.get_attr(n.target)
        if n.op != "call_function":
            continue
        ref[n] = call(n, ref.__getitem__)
        differs = any(a in rt for a in n.all_input_nodes)
        local = call(n, lambda a: rt.get(a, ref[a])) if differs else ref[n]
        if n in row_inputs:
            outs += [ref[n], local] if with_float else [local]
            rt[n] = row_inputs[n]
        elif differs:
            rt[n] = local
    g.output(tuple(outs))
    # drop what no returned value reads (without ``with_float``, the float pass the local one does not read; with
    # it, e.g. the ops after the last row): every op is pure here (in-place ops made out-of-place or run on clones;
    # an inference dropout is the identity)
    g.eliminate_dead_code(is_impure_node=lambda n: n.op in ("placeholder", "output"))
    return torch.fx.GraphModule(fgm, g)


_STACKED = 1024  # rows up to this many elements are reduced stacked (larger ones: stacking costs more)


def _pair_sums(vals: list[torch.Tensor], rts: list[torch.Tensor]) -> list[list[float]]:
    """Per row, [Σval², Σ(val − runtime)²]. Small float32 rows of one size are stacked and reduced together (a
    handful of calls per size instead of four per row: the per-call cost dominates on small models); the others
    row by row (float32 dot products, float64 for other dtypes)."""
    out: list[list[float]] = [[] for _ in vals]
    by_size: dict[int, list[int]] = {}
    for i, t in enumerate(vals):
        if t.dtype == torch.float32 and t.numel() <= _STACKED:
            by_size.setdefault(t.numel(), []).append(i)
    for size, idx in by_size.items():
        if len(idx) < 2:
            continue
        v, x = (torch.stack([ts[i].reshape(size) for i in idx]) for ts in (vals, rts))
        sq = torch.stack([v, v - x]).square_().sum(-1).T.tolist()
        for i, row in zip(idx, sq):
            out[i] = row
    rest = [i for i, row in enumerate(out) if not row]
    dots = []  # 0-d float32 tensors, converted together at the end (one call, the same values)
    for i in rest:
        v, x = vals[i], rts[i]
        if v.dtype == x.dtype == torch.float32:
            flat, diff = v.reshape(-1), (v - x).reshape(-1)
            dots += [torch.dot(flat, flat), torch.dot(diff, diff)]
        else:
            out[i] = [_sq(v), _sq(v - x)]
    sums = iter(torch.stack(dots).tolist() if dots else [])
    for i in rest:
        if not out[i]:
            out[i] = [next(sums), next(sums)]
    return out


_FLOAT_CACHE_BYTES = 512 << 20  # the float values of the rows kept per Inspector for later tables


class _JointRunner:
    """Builds (and caches, per set of rows) the joint module and runs it on one sample. The float values of a
    recorded sample's rows depend only on the float program and that input: they are kept (up to
    ``_FLOAT_CACHE_BYTES``), and a later table of the same Inspector runs only the local pass."""

    def __init__(self, fgm: torch.fx.GraphModule) -> None:
        self.fgm = fgm
        self.cache: dict[tuple, torch.fx.GraphModule] = {}
        self.placeholders = [n for n in fgm.graph.nodes if n.op == "placeholder"]
        self.floats: dict[tuple, list[torch.Tensor]] = {}
        self.float_bytes = 0

    def _module(self, key: tuple, with_float: bool) -> torch.fx.GraphModule:
        module = self.cache.get((*key, with_float))
        if module is None:
            module = self.cache[(*key, with_float)] = _joint_module(self.fgm, *key, with_float=with_float)
        return module

    def run(self, inputs: list[Any], runtime_inputs: dict[int, torch.Tensor],
            rows: dict[torch.fx.Node, torch.Tensor], sample: Any = None
            ) -> dict[torch.fx.Node, tuple[torch.Tensor, torch.Tensor, list[float]]]:
        """Per row: (float value, local value, [Σref², Σ(ref − rt)², Σlocal², Σ(local − rt)²]). ``sample``: a key
        of the recorded input (None: nothing kept)."""
        return self.run_all([(inputs, runtime_inputs, rows, sample)])[0]

    def run_all(self, batch: list[tuple]) -> list[dict[torch.fx.Node, tuple[torch.Tensor, torch.Tensor, list[float]]]]:
        """:meth:`run` on every (inputs, runtime inputs, rows, sample) of ``batch``, the sums of all of them
        reduced together (fewer, larger calls); the float values' sums of a kept sample are kept with them."""
        done = [self._values(*item) for item in batch]
        fresh = [(j, k) for j, d in enumerate(done) if d[4] is None for k in range(len(d[0]))]
        every = [(j, k) for j, d in enumerate(done) for k in range(len(d[0]))]
        float_sums = dict(zip(fresh, _pair_sums([done[j][1][k] for j, k in fresh], [done[j][3][k] for j, k in fresh])))
        local_sums = dict(zip(every, _pair_sums([done[j][2][k] for j, k in every], [done[j][3][k] for j, k in every])))
        out = []
        for j, (row_nodes, floats, locs, _, kept, key) in enumerate(done):
            if kept is None:
                kept = [float_sums[(j, k)] for k in range(len(row_nodes))]
                if key in self.floats:
                    self.floats[key] = (floats, kept)
            out.append({n: (floats[k], locs[k], [*kept[k], *local_sums[(j, k)]]) for k, n in enumerate(row_nodes)})
        return out

    def _values(self, inputs: list[Any], runtime_inputs: dict[int, torch.Tensor],
                rows: dict[torch.fx.Node, torch.Tensor], sample: Any) -> tuple:
        """(row nodes, float values, local values, runtime values, the kept [Σref², Σ(ref − rt)²] per row or
        None, the key of the kept float values)."""
        row_nodes = tuple(n for n in self.fgm.graph.nodes if n in rows)
        index = tuple(i for i in sorted(runtime_inputs) if i < len(self.placeholders))
        args = [*inputs, *[runtime_inputs[i] for i in index], *[rows[n] for n in row_nodes]]
        key = (sample, row_nodes)
        kept = self.floats.get(key) if sample is not None else None
        if kept is not None and kept[1] is not None:  # the float values and their sums (no local value in them)
            floats, float_sums = kept
            locs = list(self._module((row_nodes, index), False)(*args))
        else:
            out = self._module((row_nodes, index), True)(*args)
            floats, locs, float_sums = list(out[0::2]), list(out[1::2]), None
            size = sum(t.numel() * t.element_size() for t in floats)
            if sample is not None and key not in self.floats and self.float_bytes + size <= _FLOAT_CACHE_BYTES:
                self.floats[key] = (floats, None)  # run_all adds their sums
                self.float_bytes += size
        return row_nodes, floats, locs, [rows[n] for n in row_nodes], float_sums, key


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


def _sq(x: torch.Tensor) -> float:
    """The sum of squares of ``x`` (a float32 dot product, accumulated in float64 for other dtypes)."""
    flat = x.reshape(-1)
    if flat.dtype != torch.float32:
        flat = flat.double()
    return float(torch.dot(flat, flat))


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
    if key not in rec._program_names("graph_map"):
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
    groups: dict[int, _Group]
    chains: dict[int, list[torch.fx.Node]]
    last: dict[int, torch.fx.Node]
    runner: _JointRunner
    rows: list[_RowPlan]
    inputs: list[tuple[int, tuple[_Read, ...], torch.Tensor]]
    order: dict[int, int]
    static: dict[int, dict[str, Any]]  # per handle, the table columns that depend on no sample
    readings: dict[tuple, list]  # see _readings


def _prepared(inspector: Any, method: str) -> _Prepared:
    """The float and quantized graphs of ``method`` with their mapping, built once per Inspector and method."""
    cache = inspector.__dict__.setdefault("_float_reference", {})
    if method not in cache:
        fgm, qgm = _graphs(inspector, method)
        groups = quantized_groups(qgm)
        chains, last, runner = _float_ends(fgm, groups), _edge_last(qgm), _JointRunner(fgm)
        cache[method] = _Prepared(fgm, qgm, groups, chains, last, runner, _row_plans(groups, chains, last),
                                  _input_plans(qgm, last, runner.placeholders), {h: i for i, h in enumerate(last)},
                                  {}, {})
    return cache[method]


def float_graph(inspector: Any, method: str | None = None) -> torch.fx.GraphModule:
    """The float program's graph of ``method`` as the float-reference table runs it (built once per Inspector)."""
    return _prepared(inspector, _default_method(inspector, method)).fgm


def _drop_float_values(inspector: Any) -> None:
    """Forgets the float values and the runtime readings kept for later tables (the next table reads the ETDump
    and runs the float pass again)."""
    for prep in inspector.__dict__.get("_float_reference", {}).values():
        prep.readings.clear()
        prep.runner.floats.clear()
        prep.runner.float_bytes = 0


def _default_method(inspector: Any, method: str | None) -> str:
    return method or ("forward" if "forward" in inspector.methods or not inspector.methods
                      else inspector.methods[0])


def _readings(inspector: Any, prep: _Prepared, method: str, runs: Sequence[int] | None, want_pre: bool) -> list:
    """Per recorded sample: (representative input index, flat inputs, {row node: runtime value}, {row node:
    (handle, runtime node name)}, {row node: the runtime value before the group's output quantization, where it
    has one}, {input index: the runtime's dequantized input}). Read from the ETDump once per Inspector."""
    key = (method, tuple(runs) if runs is not None else None, want_pre)
    if key in prep.readings:
        return prep.readings[key]
    out = []
    for index, inputs, entries in _samples(inspector, method, runs):
        rt = _runtime_by_edge_handle(entries, prep.order)
        rows: dict[torch.fx.Node, torch.Tensor] = {}
        ends: dict[torch.fx.Node, tuple[int, str]] = {}
        pre: dict[torch.fx.Node, torch.Tensor] = {}
        for plan in prep.rows:
            got = _read(plan.reads, rt)
            if got is None or got[0].numel() != plan.shape.numel():
                continue
            rows[plan.end] = _as(got[0], plan.shape, plan.dtype)
            ends[plan.end] = (plan.handle, got[1].name)
            if want_pre and got[1] is not prep.groups[plan.handle].sources[-1].node:
                before = _read(plan.own, rt)
                if before is not None and before[0].numel() == plan.shape.numel():
                    pre[plan.end] = _as(before[0], plan.shape, plan.dtype)
        out.append((index, pytree.tree_leaves(tuple(inputs)), rows, ends, pre, _quantized_inputs(prep.inputs, rt)))
    prep.readings[key] = out
    return out


def _as(t: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """``t`` reshaped to ``shape`` as ``dtype`` (itself when it already is: no call per row and sample)."""
    return t if t.dtype == dtype and t.shape == shape else t.reshape(shape).to(dtype)


def _per_sample(inspector: Any, method: str, runs: Sequence[int] | None, want_pre: bool = False
                ) -> Iterator[tuple]:
    """Per recorded sample: (flat inputs, {row node: runtime value}, {row node: (handle, runtime node name)},
    the joint module's {row node: (float value, local value, sums)}, {row node: the runtime value before the
    group's output quantization, where it has one})."""
    prep = _prepared(inspector, method)
    readings = _readings(inspector, prep, method, runs, want_pre)
    chunk: list[tuple] = []
    size = 0
    for at, r in enumerate(readings):  # samples run together up to _CHUNK_ELEMENTS row values (their sums reduced
        # together), the next chunk once the caller is done with these: fewer new pages for a large model
        chunk.append(r)
        size += sum(t.numel() for t in r[2].values())
        if size >= _CHUNK_ELEMENTS or at == len(readings) - 1:
            values = prep.runner.run_all([(flat, rti, rows, index) for index, flat, rows, _, _, rti in chunk])
            for (_, flat, rows, ends, pre, _), v in zip(chunk, values):
                yield flat, rows, ends, v, pre
            chunk, size, values = [], 0, []


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
            for n, (h, rt_name) in ends.items():
                ref, loc, sums = values[n]
                stats.setdefault(h, _Stats(runtime_node=rt_name)).add(ref, loc, rows[n], sums, comparator)
    df = _table(stats, prep, comparator, local)
    df.attrs.update(reference_graph=FLOAT_GRAPH, method=method,
                    distance=getattr(comparator, "name", type(comparator).__name__),
                    float_ops=len(prep.chains), samples=max((len(s.gaps) for s in stats.values()), default=0))
    return df


class _Inject(torch.fx.Interpreter):
    """The float graph with some ops' outputs shifted by noise tensors."""

    def __init__(self, gm: torch.fx.GraphModule, noises: dict[torch.fx.Node, torch.Tensor]) -> None:
        super().__init__(gm)
        self.noises = noises

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_function" and _mutable(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            args, kwargs = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, kwargs))
            out = self.call_function(n.target, args, kwargs)
        else:
            out = super().run_node(n)
        noise = self.noises.get(n)
        return out if noise is None else out + noise


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
            ref_out = _flat_cat(fgm(*flat))
            signal += _sq(ref_out)
            samples += 1
            for n, (h, _) in ends.items():
                out = _flat_cat(_Inject(fgm, {n: rows[n] - values[n][1]}).run(*flat))
                if metric == "nsr":
                    acc[h] = acc.get(h, 0.0) + _sq(out - ref_out)
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
                                 ends[n][1] != groups[h].sources[-1].node.name) for n, (h, _) in ends.items()}
            data.append((flat, _flat_cat(fgm(*flat)), noise, {n: f for n, f in fix.items() if f is not None}, ends))
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
        out = _flat_cat(_Inject(fgm, injected).run(*flat))
        cos.append(torch.nn.functional.cosine_similarity(out.double(), ref.double(), dim=0).item())
    return sum(cos) / len(cos)


def _flat_cat(tree: Any) -> torch.Tensor:
    leaves = [t.reshape(-1) for t in _float_leaves(tree)]
    return torch.cat(leaves) if leaves else torch.zeros(0)


def _float_leaves(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _weight_error(fgm: torch.fx.GraphModule, qgm: torch.fx.GraphModule, chain: list[torch.fx.Node],
                  g: _Group) -> tuple[float | None, float | None]:
    if g.weight_dequant is None:
        return None, None
    w = _float_weight(fgm, chain)
    if w is None:
        return None, None
    wq = _const_eval(qgm, g.weight_dequant)
    if not isinstance(wq, torch.Tensor) or wq.shape != w.shape:
        return None, None
    w, wq = w.detach().float(), wq.detach().float()
    noise = _sq(w - wq)
    return _sqnr(_sq(w), noise), noise / max(1, w.numel())


_COLUMNS = ["float_debug_handle", "aot_debug_handle", "aot_ops", "float_op", "runtime_ops", "gap", "local_gap",
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
            "runtime_ops": names + ([s.runtime_node] if s.runtime_node not in names else []),
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
    return pd.DataFrame(rows, columns=_COLUMNS)


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
