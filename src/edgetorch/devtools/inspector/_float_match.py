"""Quantizer matching for the float reference (``inspector.float_reference``): per PT2E numeric debug handle, the
edge nodes of the quantized group (dequantize -> op -> quantize) and where its runtime value comes from
(``quantized_groups``), the float ops whose result the group computes (``float_ends``), and how to read each
row's runtime value from the ETDump's entries (``row_plans`` / ``input_plans`` / ``read_value``)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)
import torch.fx

from edgetorch.devtools.inspector.numeric_gap import RuntimeEntry
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.exir.quant_annotations import float_handle, weight_arg
from edgetorch.formats.handles import DELEGATE_CALL

__all__ = ["Group", "Logged", "Read", "RowPlan", "Source", "const_eval", "edge_last", "float_ends", "float_weight",
           "input_plans", "meta_tensor", "plan_reads", "quantized_groups", "quantized_inputs", "read_value",
           "row_plans", "runtime_by_edge_handle"]

qd = torch.ops.quantized_decomposed
_QUANTIZE = {qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor}
_DEQUANTIZE = {qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor,
               qd.dequantize_per_channel.default}
_BATCH_NORMS = {torch.ops.aten.batch_norm.default, torch.ops.aten._native_batch_norm_legit_no_training.default}


# ---------------------------------------------------------------------------------------------------------------
# the quantized program: per float handle, the edge nodes of its group and where its runtime value comes from
@dataclass
class Source:
    node: torch.fx.Node
    scale: float | None = None  # set for a quantize node: its int8 output is dequantized with these
    zero_point: int = 0


@dataclass
class Group:
    handle: int
    nodes: list[torch.fx.Node]
    sources: list[Source] = field(default_factory=list)
    output_scale: float | None = None
    weight_dequant: torch.fx.Node | None = None


def _users(n: torch.fx.Node, targets: set) -> list[torch.fx.Node]:
    return [u for u in n.users if u.op == "call_function" and u.target in targets]


def _static_qparams(q: torch.fx.Node) -> tuple[float, int] | None:
    scale, zp = (q.args[1:3] + (0,))[:2] if len(q.args) >= 3 else (None, 0)
    if isinstance(scale, float) and isinstance(zp, int):
        return scale, zp
    return None


def _output_sources(end: torch.fx.Node) -> tuple[list[Source], float | None]:
    """Where the group ending at ``end`` hands its value downstream, preferred first: dequantize(quantize(end)),
    quantize(end) (int8, dequantized here), ``end`` itself."""
    sources: list[Source] = []
    scale = None
    for q in _users(end, _QUANTIZE):
        params = _static_qparams(q)
        scale = params[0] if params else None
        sources += [Source(dq) for dq in _users(q, _DEQUANTIZE)]
        if params:
            sources.append(Source(q, *params))
        break
    sources.append(Source(end))
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


def quantized_groups(qgm: torch.fx.GraphModule) -> dict[int, Group]:
    """Per float handle, the edge nodes that carry it (graph order) and where its runtime value comes from."""
    groups: dict[int, Group] = {}
    for n in qgm.graph.nodes:
        h = float_handle(n) if n.op == "call_function" else None
        if h is not None:
            groups.setdefault(h, Group(h, [])).nodes.append(n)
    for g in groups.values():
        g.sources, g.output_scale = _output_sources(g.nodes[-1])
        g.weight_dequant = _weight_dequant(g.nodes)
    return groups


def edge_last(qgm: torch.fx.GraphModule) -> dict[int, torch.fx.Node]:
    """Per edge debug handle, its last node (the one whose output the runtime logs for that handle)."""
    last: dict[int, torch.fx.Node] = {}
    for n in qgm.graph.nodes:
        h = get_debug_handle(n) if n.op == "call_function" else None
        if h is not None:
            last[h] = n
    return last


def const_eval(gm: torch.fx.GraphModule, n: torch.fx.Node) -> Any:
    """The value of ``n``, computed from constants only (get_attr nodes and literals)."""
    if n.op == "get_attr":
        obj: Any = gm
        for part in str(n.target).split("."):
            obj = getattr(obj, part)
        return obj
    args = torch.fx.node.map_arg(n.args, lambda a: const_eval(gm, a))
    kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: const_eval(gm, a))
    return n.target(*args, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# runtime values
class Logged(NamedTuple):
    """The runtime tensors logged for an edge handle and the ``HandleGroup.kind`` of the entry that logged them."""

    kind: str
    tensors: list[torch.Tensor]


def runtime_by_edge_handle(entries: list[RuntimeEntry], order: dict[int, int]) -> dict[int, Logged]:
    """Edge debug handle -> the runtime tensors logged for its last node (inner delegate rows first, delegate
    call outputs where nothing finer was logged), with the kind of the entry that logged them."""
    out: dict[int, Logged] = {}
    for e in entries:
        if e.is_delegate_call:
            continue
        hs = [h for h in e.handles if h in order]
        if hs:
            out[max(hs, key=order.__getitem__)] = Logged(e.group.kind, e.tensors)
    for e in entries:
        if e.is_delegate_call and e.output_sources and len(e.output_sources) == len(e.tensors):
            for src, t in zip(e.output_sources, e.tensors):
                if src is not None and src[0] not in out:
                    out[src[0]] = Logged(DELEGATE_CALL, [t])
    return out


@dataclass(frozen=True)
class Read:
    """One place a runtime value may be read from: the logged tensors of an edge handle, those of the given dtype
    and size, dequantized with ``scale``/``zero_point`` when set."""

    edge_handle: int
    node: torch.fx.Node
    dtype: torch.dtype
    numel: int
    scale: float | None
    zero_point: int


@dataclass(frozen=True)
class RowPlan:
    """How to read a row's runtime value (first readable source wins), and its shape in the float graph."""

    end: torch.fx.Node  # the float node of the row (its chain's last)
    handle: int
    reads: tuple[Read, ...]
    own: tuple[Read, ...]  # the op's own output, before the group's output quantization
    shape: torch.Size
    dtype: torch.dtype


def plan_reads(sources: list[Source], last: dict[int, torch.fx.Node]) -> tuple[Read, ...]:
    out = []
    for s in sources:
        h = get_debug_handle(s.node)
        val = s.node.meta.get("val")
        val = val[0] if isinstance(val, (list, tuple)) and val else val
        if h is not None and last.get(h) is s.node and isinstance(val, torch.Tensor):
            out.append(Read(h, s.node, val.dtype, val.numel(), s.scale, s.zero_point))
    return tuple(out)


def read_value(reads: tuple[Read, ...], rt: dict[int, Logged]) -> tuple[torch.Tensor, torch.fx.Node, str] | None:
    """The first readable source's runtime value (dequantized), its node and the kind of the entry that logged
    it, or None."""
    for r in reads:
        logged = rt.get(r.edge_handle)
        t = None if logged is None else next(
            (t for t in logged.tensors if t.dtype == r.dtype and t.numel() == r.numel), None)
        if t is None:
            continue
        if r.scale is not None:  # the same float32 arithmetic as (t - zero_point) * scale, one buffer
            t = t.to(torch.float32, copy=True).sub_(r.zero_point).mul_(r.scale)
        if t.is_floating_point():
            return t, r.node, logged.kind
    return None


def row_plans(groups: dict[int, Group], chains: dict[int, list[torch.fx.Node]],
               last: dict[int, torch.fx.Node]) -> list[RowPlan]:
    plans = []
    for h, chain in chains.items():
        like = meta_tensor(chain[-1])
        if like is not None:
            plans.append(RowPlan(chain[-1], h, plan_reads(groups[h].sources, last),
                                  plan_reads(groups[h].sources[-1:], last), like.shape, like.dtype))
    return plans


def input_plans(qgm: torch.fx.GraphModule, last: dict[int, torch.fx.Node],
                 float_inputs: list[torch.fx.Node]) -> list[tuple[int, tuple[Read, ...], torch.Tensor]]:
    """Per user input the program quantizes: (index, where to read its dequantized runtime value, the float
    graph's input)."""
    out = []
    for i, p in enumerate(n for n in qgm.graph.nodes if n.op == "placeholder"):
        like = meta_tensor(float_inputs[i]) if i < len(float_inputs) else None
        reads = plan_reads(_output_sources(p)[0][:-1], last)
        if like is not None and reads:
            out.append((i, reads, like))
    return out


def quantized_inputs(plans: list[tuple[int, tuple[Read, ...], torch.Tensor]],
                      rt: dict[int, Logged]) -> dict[int, torch.Tensor]:
    """User input index -> the runtime's dequantized value of that input (where the program quantizes it),
    shaped as the float graph's input."""
    out = {}
    for i, reads, like in plans:
        got = read_value(reads, rt)
        if got is not None and got[0].numel() == like.numel():
            out[i] = got[0].reshape(like.shape).to(like.dtype)
    return out


# ---------------------------------------------------------------------------------------------------------------
# the float side
def float_ends(fgm: torch.fx.GraphModule, groups: dict[int, Group]) -> dict[int, list[torch.fx.Node]]:
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


def float_weight(fgm: torch.fx.GraphModule, chain: list[torch.fx.Node]) -> torch.Tensor | None:
    """The float weight of the op heading ``chain``, a batch norm folded into it applied per output channel."""
    head = chain[0]
    idx = weight_arg(head) or 1  # addmm (HF Conv1D): its (in, out) weight is argument 2
    w = head.args[idx] if len(head.args) > idx else None
    if not isinstance(w, torch.fx.Node) or w.op != "get_attr":
        return None
    weight = const_eval(fgm, w).detach()
    for n in chain[1:]:
        if n.target in _BATCH_NORMS:
            gamma, var = (const_eval(fgm, a) if isinstance(a, torch.fx.Node) else a for a in (n.args[1], n.args[4]))
            eps = n.args[-1] if n.target is torch.ops.aten._native_batch_norm_legit_no_training.default \
                else n.args[7]
            factor = (gamma if gamma is not None else 1.0) / torch.sqrt(var + eps)
            weight = weight * factor.reshape(-1, *([1] * (weight.dim() - 1)))
    return weight


def meta_tensor(n: torch.fx.Node) -> torch.Tensor | None:
    v = n.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None
