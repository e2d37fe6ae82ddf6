"""Per-op numeric gaps between a reference graph run eagerly and the runtime's logged intermediates.

Steps: (1) run the reference program (the ATen program from the ETRecord, whose nodes carry the same debug
handles as the edge ops decomposed from them) on the representative inputs, keeping each op's output;
(2) collect the runtime outputs per handle group (a kernel's handle, a delegate call's handle list, or the
handles one op inside a delegate computes); (3) pair each runtime group with the output of the last reference op
of the group and compare them. Besides this *accumulated* gap, a second pass re-runs every reference op on the
runtime's own intermediate values and compares again: the *local* gap, which isolates the error each op adds.

Pairing rules. A row never pairs tensors of different dtypes, and never guesses between runtime outputs that
could both fit. A kernel's outputs follow its ATen outputs, so its first output of the reference's dtype and
element count is taken. A DELEGATE_CALL is compared on the output computed by its latest reference op, located
through the ETRecord's ``delegate_outputs`` table (the edge op behind each delegate output); without that table
(older records) a delegate value must fit unambiguously. A group that cannot be paired is listed in
``coverage.unmatched`` with the reason.

Columns. ``gap`` / ``local_gap`` hold one value each (in a list). ``metric`` names what they measure:
floating-point rows use the requested distance (``MSE``, ``SNR``, ... or the custom comparator's ``name``);
integer and bool rows are compared exactly and report ``MISMATCH_FRACTION`` (``comparators.EXACT_METRIC``): the
fraction of elements that differ (0.0 = identical, larger is worse, whatever the distance), with the count of
differing elements in ``mismatches`` (None on floating-point rows). ``dtype`` is the dtype both sides share.
``kind`` is the row's ``HandleGroup.kind`` (``formats.handles``: ``kernel``, ``delegate_call`` or ``in_delegate``; a
categorical of ``KINDS``): test it, never the display string in ``runtime_ops``.
``df.attrs["distance"]`` is the requested metric and ``df.attrs["exact_metric"]`` the one of exact rows.

Scale-aware columns (``inspector.noise``): ``rel_error`` (accumulated ``||runtime - ref||_2 / ||ref||_2``),
``local_rel_error`` (the same on the local comparison), ``noise_floor`` (the relative error rounding in the row's
dtype explains for the ops the local comparison re-runs; delegate rows allow for reassociation) and ``verdict``
(``"exact"``, ``"noise"`` or ``"real"``, on the local error); None on integer/bool rows except ``verdict``.
``ref_handle`` is the handle whose reference output the row is compared with. ``df.attrs["noise_model"]``
describes the model and its constants.

Multi-output ops. Every output the runtime logged replaces the reference's in the local walk (a kernel's outputs
by position; a delegate's, logged in no known order, each paired with the closest output of its dtype and size);
an output it did not log takes the op's value re-run on the runtime's inputs, so the error upstream of it is
not charged to the ops downstream.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import torch.fx

from edgetorch.devtools.inspector import noise as _noise
from edgetorch.devtools.inspector._control_flow import inline_taken_branches
from edgetorch.devtools.inspector._frame import GapFrame
from edgetorch.devtools.inspector._graph_writes import is_uninitialised, is_view, written_in_place
from edgetorch.devtools.inspector._recording_check import check_node_value
from edgetorch.devtools.inspector.comparators import (
    EXACT_METRIC,
    NumericalComparatorBase,
    is_exact_dtype,
    mismatch_count,
)
from edgetorch.devtools.inspector.noise import floor_from_units, noise_model_attrs, op_noise, rel_error, verdict
from edgetorch.errors import ETRecordFormatError, InspectorError
from edgetorch.exir.debug_handles import nodes_by_handle, source_location
from edgetorch.formats.handles import DELEGATE_CALL, IN_DELEGATE, KERNEL, KINDS, HandleGroup, OutputSource

__all__ = ["RuntimeEntry", "runtime_entries", "Coverage", "reference_handles", "compare_values", "SCALE_COLUMNS",
           "compute_numeric_gap", "module_path", "resolve_entry", "runtime_values"]

log = logging.getLogger(__name__)


@dataclass
class RuntimeEntry:
    """The runtime outputs of one handle group (``formats.handles.HandleGroup``, as the ETRecord stores it)."""

    group: HandleGroup
    ops: list[str]
    value: Any  # tensor, or list of tensors for multi-output instructions

    @property
    def handles(self) -> tuple[int, ...]:
        return self.group.handles

    @property
    def instruction_id(self) -> int:
        return self.group.instruction_id

    @property
    def delegate_backend(self) -> str | None:
        return self.group.backend

    @property
    def in_delegate_call(self) -> int | None:
        """The instruction id of the enclosing delegate call, for an op inside a delegate."""
        return self.group.instruction_id if self.group.kind == IN_DELEGATE else None

    @property
    def is_delegate_call(self) -> bool:
        return self.group.kind == DELEGATE_CALL

    @property
    def output_sources(self) -> tuple[OutputSource, ...] | None:
        """For a delegate call: per output, (debug handle, output index) of the edge op computing it."""
        return self.group.outputs

    @property
    def tensors(self) -> list[torch.Tensor]:
        v = self.value
        return [v] if isinstance(v, torch.Tensor) else [t for t in (v or []) if isinstance(t, torch.Tensor)]


def runtime_entries(events: list[Any], run: int) -> list[RuntimeEntry]:
    """The entries of one run of a block, in instruction order (a delegate call before the ops inside it): one
    per handle group that logged a value, kernels of one handle (an ATen op decomposed into several) merged
    into one entry that keeps the last logged value. ``events`` carry their group (``Event.handle_group``)."""
    entries: list[RuntimeEntry] = []
    kernels: dict[tuple[int, ...], RuntimeEntry] = {}
    for ev in events:
        g = ev.handle_group
        data = ev.run_debug_data[run] if g is not None and run < len(ev.run_debug_data) else []
        value = data if len(data) > 1 or (data and g.kind == DELEGATE_CALL) else (data[0] if data else None)
        if g is not None and g.kind == KERNEL:
            e = kernels.get(g.handles) or kernels.setdefault(g.handles, RuntimeEntry(g, [], None))
            entries += [e] if not e.ops else []
            e.ops.append(ev.name)
            e.group, e.value = (g, value) if data else (e.group, e.value)
        elif data:
            entries.append(RuntimeEntry(g, ["DELEGATE_CALL"] if g.kind == DELEGATE_CALL else [ev.name], value))
    return sorted((e for e in entries if e.value is not None),
                  key=lambda e: (e.instruction_id, 0 if e.is_delegate_call else 1))


@dataclass
class Coverage:
    """What the gap table covers: matched / total runtime groups and reference ops, and why others are missing."""

    runtime_total: int = 0
    runtime_matched: int = 0
    aot_total: int = 0
    aot_matched: int = 0
    unmatched: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        return (f"matched {self.runtime_matched}/{self.runtime_total} runtime op groups and "
                f"{self.aot_matched}/{self.aot_total} reference ops; {len(self.unmatched)} unmatched "
                "(see coverage.unmatched for the reasons)")


def _first_tensor(v: Any) -> torch.Tensor | None:
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, (list, tuple)):
        for x in v:
            if isinstance(x, torch.Tensor):
                return x
    return None


def _describe(ts: list[torch.Tensor]) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in ts[:6]) or "none"


def _pick_runtime(e: RuntimeEntry, like: Any) -> torch.Tensor | str:
    """The runtime tensor of entry ``e`` that corresponds to the reference value ``like`` (a tensor or a fake
    tensor of the same dtype and shape): one of the same dtype and element count, never another dtype. A kernel
    lists its outputs in the order of its ATen outputs, so the first fitting one is taken; a value logged by
    or inside a delegate whose outputs are not known one by one must fit unambiguously (several fitting
    outputs that differ give no pair). Returns the reason as a string when nothing fits."""
    ts = e.tensors
    fit = [t for t in ts if t.dtype == like.dtype and t.numel() == like.numel()]
    if not fit:
        return (f"no runtime output has the dtype and element count of the reference output "
                f"({str(like.dtype).removeprefix('torch.')}{list(like.shape)}; runtime: {_describe(ts)})")
    fit = [t for t in fit if tuple(t.shape) == tuple(like.shape)] or fit
    delegated = e.is_delegate_call or e.in_delegate_call is not None
    if delegated and len(fit) > 1 and not all(torch.equal(fit[0], t) for t in fit[1:]):
        return (f"{len(fit)} outputs of the delegate have the reference's dtype and shape and the record does not "
                "say which op computes which")
    return fit[0]


def resolve_entry(e: RuntimeEntry, last: dict[int, torch.fx.Node], order: dict[int, int]
                  ) -> tuple[int, int | None] | str:
    """(handle whose reference output the entry is compared with, index of the runtime tensor or None to pick
    by dtype/shape). A delegate call whose output sources are known is compared on the output that the latest
    reference op computes, never on another output that merely has the same dtype and shape."""
    if e.is_delegate_call and e.output_sources and len(e.output_sources) == len(e.tensors):
        outs = [(order[src[0]], -src[1], i, src[0]) for i, src in enumerate(e.output_sources)
                if src is not None and src[0] in last]
        if outs:
            _, _, i, h = max(outs)
            return h, i
    cands = [h for h in e.handles if h in last]
    if not cands:
        return "no reference op carries these debug handles"
    return max(cands, key=order.__getitem__), None


def _runtime_tensor(e: RuntimeEntry, index: int | None, like: Any) -> torch.Tensor | str:
    if index is None:
        return _pick_runtime(e, like)
    t = e.tensors[index]
    if t.dtype != like.dtype or t.numel() != like.numel():
        return (f"delegate output {index} ({_describe([t])}) is computed by the reference op, whose output is "
                f"{_describe([like])}")
    return t


class _JointWalk(torch.fx.Interpreter):
    """One pass over the reference module computing, per handle, the reference output (on reference inputs)
    and, with ``runtime`` (handle -> runtime tensor), the *local* reference: the op re-run on the runtime's
    own values of its inputs. Only ops downstream of a runtime value that differs from the reference are
    computed twice, so an exact runtime costs one forward pass.

    ``rt_env`` holds the runtime-side value of a node where it differs from the reference value; ``exact``
    marks nodes whose runtime-side value is the runtime's own (inputs, constants, substituted outputs, and
    views/getitems of exact values), which gives view-only ops a runtime value. ``state`` (attribute name ->
    tensor) is the runtime's own value of a buffer (a KV cache an earlier call filled) where it may differ from
    the reference's: the local re-runs read it."""

    def __init__(self, gm: torch.fx.GraphModule, last_node: dict[int, torch.fx.Node],
                 runtime: dict[int, torch.Tensor] | None, state: dict[str, torch.Tensor] | None = None,
                 fill: dict[int, torch.Tensor] | None = None) -> None:
        super().__init__(gm)
        self.by_node = {n: h for h, n in last_node.items()}
        self.runtime = runtime
        self.state = state or {}
        self.fill = fill or {}  # handle of an uninitialised allocation -> the runtime's bytes, used on both sides
        self.outputs: dict[int, Any] = {}
        self.local: dict[int, Any] = {}
        self.rt_env: dict[torch.fx.Node, Any] = {}
        self.exact: set[torch.fx.Node] = set()
        self.derived: set[int] = set()
        self.same: dict[int, bool] = {}  # handle -> the runtime value equals the reference bit for bit
        #: handle -> {output index: runtime tensor} substituted for the reference op's outputs
        self.assigned: dict[int, dict[int, torch.Tensor]] = {}
        #: node -> rounding-noise units (``noise.op_noise`` at u=1) of the ops the runtime computed between the
        #: last values it logged and this node (the ops a local comparison of this node re-runs)
        self.carry: dict[torch.fx.Node, float] = {}
        # values later mutated in place (e.g. relu_ in a training-IR ATen graph) are recorded as copies
        self.mutated = written_in_place(gm)

    def _keep(self, n: torch.fx.Node, v: Any) -> Any:
        if n in self.mutated:
            return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, v)
        return v

    def _run_on_runtime_values(self, n: torch.fx.Node) -> Any:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        env = self.rt_env

        def sub(a: Any) -> Any:
            return env[a] if isinstance(a, torch.fx.Node) and a in env else (
                self.env[a] if isinstance(a, torch.fx.Node) else a)

        args = torch.fx.node.map_aggregate(n.args, sub)
        kwargs = torch.fx.node.map_aggregate(n.kwargs, sub)
        if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
            # an in-place op (index_put_ into a cache buffer) re-run on runtime values must not write into the
            # reference's own tensors, which later reference ops still read
            args, kwargs = torch.utils._pytree.tree_map(
                lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, kwargs))
        return getattr(self, n.op)(n.target, args, kwargs)

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_function":
            try:
                out = super().run_node(n)
            except (RuntimeError, TypeError, ValueError, IndexError) as e:  # a hostile or corrupted reference graph
                raise ETRecordFormatError(
                    f"the ETRecord's reference graph is inconsistent: node '{n.name}' ({n.target}) fails on the "
                    f"values its arguments name ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
                    field=f"reference graph node {n.name}") from None
            check_node_value(n, out)
        else:
            out = super().run_node(n)
        h = self.by_node.get(n)
        if h in self.fill and _fits(self.fill[h], out):
            out = self.fill[h].reshape(out.shape).clone()
        if self.runtime is None:
            if h is not None:
                self.outputs[h] = self._keep(n, out)
            return out
        if n.op in ("placeholder", "get_attr"):
            self.exact.add(n)
            rt = self.state.get(str(n.target)) if n.op == "get_attr" else None
            if _fits(rt, out) and not torch.equal(rt.reshape(out.shape), out):
                self.rt_env[n] = rt.reshape(out.shape)
            return out
        if n.op != "call_function":
            return out
        inputs = n.all_input_nodes
        upstream = (self.carry.get(a, 0.0) for a in inputs if a not in self.exact)
        self.carry[n] = op_noise(n, 1.0, self.fetch_args_kwargs_from_env(n)[0]) + max(upstream, default=0.0)
        differs = any(a in self.rt_env for a in inputs)
        local = self._run_on_runtime_values(n) if differs else out
        if (n.target is operator.getitem or is_view(n)) and (h is None or h not in self.runtime):
            if differs:
                self.rt_env[n] = local
            if h is not None:
                self.outputs[h] = self._keep(n, out)
                self.local[h] = self._keep(n, local)
            if inputs and all(a in self.exact for a in inputs):
                self.exact.add(n)
                if h is not None:
                    self.derived.add(h)
            return out
        if h is None:
            if differs:
                self.rt_env[n] = local
            return out
        self.outputs[h] = self._keep(n, out)
        self.local[h] = self._keep(n, local)
        got = self.runtime.get(h)
        assigned = _assign(got, out) if got is not None else {}
        if not assigned:
            if differs:
                self.rt_env[n] = local
            return out
        self._substitute(n, h, out, local, assigned)
        return out

    def _substitute(self, n: torch.fx.Node, h: int, out: Any, local: Any,
                    assigned: dict[int, torch.Tensor]) -> None:
        """Gives node ``n`` the runtime's values of the outputs it logged; an output it did not log takes the
        op's value re-run on the runtime's inputs (its local value), so that the error upstream of it is not
        charged to the ops downstream (a reference value there would make them look wrong)."""
        multi = isinstance(out, (list, tuple))
        outs = list(out) if multi else [out]
        locs = list(local) if multi else [local]
        vals = [self._keep(n, assigned[i].reshape(o.shape)) if i in assigned else locs[i]
                for i, o in enumerate(outs)]
        self.assigned[h] = {i: vals[i] for i in assigned}
        if 0 in assigned:
            self.same[h] = torch.equal(vals[0], outs[0])
        if all(i in assigned for i, o in enumerate(outs) if isinstance(o, torch.Tensor)):
            self.exact.add(n)
        known = self.same.get(h) if 0 in assigned else None  # output 0 compared just above
        if all(v is o or (isinstance(v, torch.Tensor) and (known if i == 0 and known is not None
                                                             else torch.equal(v, o)))
               for i, (v, o) in enumerate(zip(vals, outs))):
            self.rt_env.pop(n, None)
        else:
            self.rt_env[n] = type(out)(vals) if multi else vals[0]


def _fits(t: Any, like: Any) -> bool:
    return (isinstance(t, torch.Tensor) and isinstance(like, torch.Tensor) and t.dtype == like.dtype
            and t.numel() == like.numel())


def _assign(got: dict[int, torch.Tensor] | list[torch.Tensor], out: Any) -> dict[int, torch.Tensor]:
    """Which output of a reference op each runtime tensor is: ``got`` is either known positions (output index
    -> tensor) or a list of tensors in unknown order (a delegate that logs a multi-output op's outputs, maybe
    only some of them). A list as long as the op's tensor outputs that fits position by position is taken in
    order; otherwise each runtime tensor goes to the closest unassigned output of its dtype and size."""
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if isinstance(got, dict):
        return {i: t for i, t in got.items() if i < len(outs) and _fits(t, outs[i])}
    tensor_idx = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor)]
    if len(got) == len(tensor_idx) and all(_fits(t, outs[i]) for t, i in zip(got, tensor_idx)):
        if len(got) == 1 or _positional_is_closest(got, outs, tensor_idx):
            return dict(zip(tensor_idx, got))
    assigned: dict[int, torch.Tensor] = {}
    for t in got:
        free = [i for i in tensor_idx if i not in assigned and _fits(t, outs[i])]
        if not free:
            continue
        best = min(free, key=lambda i: _distance(outs[i], t)) if len(free) > 1 else free[0]
        assigned[best] = t
    return assigned


def _distance(ref: torch.Tensor, t: torch.Tensor) -> float:
    if not ref.dtype.is_floating_point:
        return float(mismatch_count(ref, t))
    d = rel_error(ref, t)
    return math.inf if d is None or math.isnan(d) else d


def _positional_is_closest(got: list[torch.Tensor], outs: list[Any], idx: list[int]) -> bool:
    """A positional pairing is trusted unless some runtime tensor is closer to another output than to its own."""
    for t, i in zip(got, idx):
        own = _distance(outs[i], t)
        if any(_fits(t, outs[j]) and _distance(outs[j], t) < own for j in idx if j != i):
            return False
    return True


def reference_handles(gm: torch.fx.GraphModule) -> tuple[dict[int, torch.fx.Node], dict[int, list[torch.fx.Node]]]:
    """Per handle: the last op node (its output is what gets compared) and all op nodes, in graph order."""
    nodes = nodes_by_handle(gm.graph)
    return {h: ns[-1] for h, ns in nodes.items()}, nodes


@contextlib.contextmanager
def _restored_state(gm: torch.fx.GraphModule, mutated: set[torch.fx.Node],
                    after: dict[str, torch.Tensor] | None = None) -> Iterator[None]:
    """Runs the reference on copies of the attributes (cache buffers) its in-place ops write, so every run starts
    from the state recorded in the ETRecord, like the program's first execution, and the values recorded
    during the run (aliases of those copies) stay as they were computed. ``after`` receives the copies as the
    run left them (the state after it), by attribute name."""
    saved: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
    for n in mutated:
        if n.op != "get_attr":
            continue
        *path, name = str(n.target).split(".")
        owner = gm.get_submodule(".".join(path)) if path else gm
        t = getattr(owner, name, None)
        if not isinstance(t, torch.Tensor):
            continue
        copy = t.detach().clone()
        setattr(owner, name, torch.nn.Parameter(copy, t.requires_grad) if isinstance(t, torch.nn.Parameter)
                else copy)
        saved.append((owner, name, t))
    try:
        yield
        if after is not None:
            for n in mutated:
                if n.op == "get_attr":
                    *path, name = str(n.target).split(".")
                    owner = gm.get_submodule(".".join(path)) if path else gm
                    after[str(n.target)] = getattr(owner, name)
    finally:
        for owner, name, t in saved:
            setattr(owner, name, t)


def _unmatched(e: RuntimeEntry, reason: str) -> dict[str, Any]:
    return {"side": "runtime", "ops": e.ops, "handles": e.handles, "instruction_id": e.instruction_id,
            "reason": reason}


def compare_values(comparator: NumericalComparatorBase, ref: torch.Tensor, rt: torch.Tensor,
                   identical: bool = False) -> tuple[float, str, int | None]:
    """(gap, metric name, mismatching elements) of one pair of same-dtype tensors: integer and bool tensors are
    compared exactly (``EXACT_METRIC``: the fraction of elements that differ, and their count), floating-point
    ones with ``comparator`` (``identical``: known bit-identical, its ``identical_value`` is used if it has one)."""
    if ref.dtype != rt.dtype:
        raise ValueError(f"cannot compare a {ref.dtype} tensor with a {rt.dtype} tensor")
    if is_exact_dtype(ref.dtype):
        n = mismatch_count(ref, rt)
        return (n / ref.numel() if ref.numel() else 0.0), EXACT_METRIC, n
    name = getattr(comparator, "name", type(comparator).__name__)
    ident = getattr(comparator, "identical_value", None)
    if identical and ident is not None:
        return ident, name, None
    return comparator.compare(ref, rt), name, None


def module_path(node: torch.fx.Node) -> str:
    """The dotted module path of a node (its innermost ``nn_module_stack`` entry), or ""."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _cls = list(stack.values())[-1]
    return str(path)


#: scale-aware columns of the gap table (see ``inspector.noise``)
SCALE_COLUMNS = ["rel_error", "local_rel_error", "noise_floor", "verdict"]


def _delegated(e: RuntimeEntry) -> bool:
    return e.is_delegate_call or e.in_delegate_call is not None or e.delegate_backend is not None


def _scale_columns(ref: torch.Tensor, rt: torch.Tensor, lref: torch.Tensor | None, metric: str,
                   mismatches: int | None, lgap: float | None, units: float, delegated: bool,
                   same: bool | None = None, step: float | None = None) -> dict[str, Any]:
    """rel_error, local_rel_error, noise_floor and verdict of one row (``same``: whether ``ref`` and ``rt`` are
    bit-identical, when the walk already compared them; ``step``: the row's quantization step, ``noise.step_floor``)."""
    exact_row = metric == EXACT_METRIC
    rel = None if exact_row else rel_error(ref, rt, equal=same)
    lrel = None if exact_row or lref is None else (rel if lref is ref else rel_error(lref, rt))
    floor = None if exact_row else floor_from_units(units, ref.dtype, delegated)
    extra, within = _noise.step_floor(step, ref if lref is None else lref, rt) if step and delegated else (0.0, 0)
    floor = floor + extra if floor is not None else None
    v = verdict(lrel, floor, exact_row, lgap if lgap is not None else mismatches, rel)
    return {"rel_error": rel, "local_rel_error": lrel, "noise_floor": floor,
            "verdict": "noise" if within and v == "real" else v}


def _delegate_boundaries(rows: list[dict[str, Any]]) -> None:
    """A DELEGATE_CALL row whose compared output an op inside the delegate also logged shows the same tensor:
    it takes that inner row's noise floor and verdict, and is ``"real"`` when the delegate handed out something
    else than its op computed (an error at the delegate's boundary): the two differ beyond the op's noise floor
    (a delegate may compute its plain outputs and its observed intermediates in differently fused runs)."""
    inner = {(r["in_delegate_call"], r["ref_handle"]): r for r in rows if r["in_delegate_call"] is not None}
    for r in rows:
        if r["kind"] != DELEGATE_CALL:
            continue
        i = inner.get((r["instruction_id"], r["ref_handle"]))
        if i is None:
            continue
        a, b = i["runtime_intermediate_output"], r["runtime_intermediate_output"]
        if a.dtype != b.dtype or a.numel() != b.numel():
            continue
        boundary = rel_error(a, b)
        r["noise_floor"] = floor = i["noise_floor"]
        beyond = boundary is not None and floor is not None and boundary > floor
        r["verdict"] = "real" if beyond or (boundary is None and mismatch_count(a, b)) else i["verdict"]


def runtime_values(e: RuntimeEntry, h: int, index: int | None, want: Any
                   ) -> dict[int, torch.Tensor] | list[torch.Tensor] | None:
    """The runtime values entry ``e`` gives for the outputs of reference op ``h`` (whose value is ``want``, a
    fake tensor or a list of them): known positions for a kernel or a delegate call whose output sources are
    recorded, or the entry's tensors in unknown order for a multi-output op logged inside a delegate."""
    if e.is_delegate_call and e.output_sources and len(e.output_sources) == len(e.tensors):
        known = {src[1]: e.tensors[i] for i, src in enumerate(e.output_sources)
                 if src is not None and src[0] == h}
        if known:
            return known
    multi = isinstance(want, (list, tuple)) and sum(isinstance(w, torch.Tensor) for w in want) > 1
    if multi and not e.is_delegate_call:
        return list(e.tensors) if (e.in_delegate_call is not None or len(e.tensors) != len(want)) else dict(
            enumerate(e.tensors))
    first = _first_tensor(want)
    if first is None:
        return None
    val = _runtime_tensor(e, index, first)
    return {0: val} if isinstance(val, torch.Tensor) else None


@dataclass
class _Join:
    """One gap computation: the reference's handles (last op, all ops, execution order) and, after the walk,
    which runtime entry gave each handle's substituted values."""

    last: dict[int, torch.fx.Node]
    nodes: dict[int, list[torch.fx.Node]]
    order: dict[int, int]
    walk: _JointWalk | None = None
    provider: dict[int, RuntimeEntry] = field(default_factory=dict)

    def mine(self, e: RuntimeEntry, h: int) -> torch.Tensor | None:
        """The runtime tensor the walk substituted for ``h``'s first output, when ``e`` provided it."""
        return self.walk.assigned.get(h, {}).get(0) if self.provider.get(h) is e else None


def _walk(j: _Join, reference: torch.fx.GraphModule, inputs: tuple, picked: list[tuple[RuntimeEntry, int, int | None]],
          local: bool, capture: dict[str, Any] | None, state: dict[str, torch.Tensor] | None = None) -> None:
    """Runs the reference once (``_JointWalk``), with the runtime values per handle for the local gaps: the
    finest first (an op logged inside a delegate over its DELEGATE_CALL)."""
    runtime: dict[int, dict[int, torch.Tensor] | list[torch.Tensor]] = {}
    for e, h, index in picked if local else ():
        if e.is_delegate_call and h in runtime:
            continue
        vals = runtime_values(e, h, index, j.last[h].meta.get("val"))
        if vals:
            runtime[h] = vals
            j.provider[h] = e
    fill = {}  # what the runtime's uninitialised allocations held: the reference starts from the same bytes
    for e, h, index in picked:
        vals = runtime_values(e, h, index, j.last[h].meta.get("val")) if is_uninitialised(j.last[h]) else None
        if isinstance(vals, dict) and 0 in vals:
            fill[h] = vals[0]
    j.walk = _JointWalk(reference, j.last, runtime if local else None, state, fill)
    after: dict[str, torch.Tensor] | None = {} if capture is not None else None
    with torch.no_grad(), _restored_state(reference, j.walk.mutated, after):
        try:
            result = j.walk.run(*inputs)
        except RuntimeError as e:
            if "Expected positional argument" not in str(e):
                raise
            names = [str(n.target) for n in reference.graph.nodes if n.op == "placeholder"]
            raise InspectorError(f"the reference program takes {len(names)} inputs ({', '.join(names)}), the "
                                 f"input given has {len(inputs)}: record every argument the program was exported "
                                 "with, flags such as use_cache included (etrecord.update_representative_inputs)"
                                 ) from None
    if capture is not None:
        capture.update(output=result, state=after)


def _pairs(j: _Join, picked: list[tuple[RuntimeEntry, int, int | None]], cov: Coverage
           ) -> list[tuple[RuntimeEntry, int, torch.Tensor, torch.Tensor]]:
    """(entry, reference handle, reference tensor, runtime tensor) of every row, in the reference's execution
    order; view-only reference ops get a row from the view of the runtime's value of their input."""
    aot, matched = j.walk.outputs, []
    for e, h, index in picked:
        ref = _first_tensor(aot.get(h))
        if ref is None:
            cov.unmatched.append(_unmatched(e, "the reference op of this group produced no tensor"))
            continue
        rt = _runtime_tensor(e, index, ref)
        if isinstance(rt, str) and j.mine(e, h) is not None:
            rt = j.mine(e, h)  # a multi-output op whose outputs the walk paired one by one
        if isinstance(rt, str):
            cov.unmatched.append(_unmatched(e, rt))
            continue
        matched.append((e, h, ref, rt))
    cov.runtime_matched = len(matched)
    for h in sorted(j.walk.derived, key=j.order.__getitem__):
        rt, ref = _first_tensor(j.walk.local.get(h)), _first_tensor(aot.get(h))
        if rt is not None and ref is not None and rt.numel() == ref.numel() and rt.dtype == ref.dtype:
            alias = RuntimeEntry(HandleGroup(KERNEL, -1, (h,)), ["(alias of a runtime value)"], rt)
            matched.append((alias, h, ref, rt))
    matched.sort(key=lambda m: j.order[m[1]])  # stable
    return matched


def _row(j: _Join, e: RuntimeEntry, h: int, ref: torch.Tensor, rt: torch.Tensor,
         comparator: NumericalComparatorBase) -> dict[str, Any]:
    group = sorted((x for x in e.handles if x in j.last), key=j.order.__getitem__)
    mine = j.mine(e, h)
    same = j.walk.same.get(h) if e.instruction_id >= 0 and mine is not None and mine.data_ptr() == rt.data_ptr() \
        else None
    gap, metric, mismatches = compare_values(comparator, ref, rt, identical=bool(same))
    lref = _first_tensor(j.walk.local.get(h)) if j.walk.local else None
    if lref is None or lref.numel() != rt.numel() or lref.dtype != rt.dtype:
        lgap = None
    elif lref is ref:  # the op saw the reference's own inputs: its local gap is its gap
        lgap = gap
    else:
        lgap = compare_values(comparator, lref, rt)[0]
    node = j.last[h]
    scale = _scale_columns(ref, rt, lref if lgap is not None else None, metric, mismatches, lgap,
                           j.walk.carry.get(node, 0.0), _delegated(e), same, _noise.quant_step(node))
    return {
        "aot_debug_handle": tuple(group), "aot_ops": [n.name for x in group for n in j.nodes.get(x, [])],
        "aot_intermediate_output": ref, "runtime_ops": list(e.ops), "kind": e.group.kind,
        "runtime_debug_handle": tuple(e.handles),
        "runtime_intermediate_output": rt, "gap": [gap], "local_gap": [lgap], "metric": metric,
        "mismatches": mismatches, "dtype": str(ref.dtype).removeprefix("torch."),
        "stacktraces": {n.name: n.meta.get("stack_trace") for x in group for n in j.nodes.get(x, [])},
        "source": source_location(node.meta.get("stack_trace")), "module": module_path(node),
        "instruction_id": e.instruction_id, "delegate": e.delegate_backend, "in_delegate_call": e.in_delegate_call,
        "shape": tuple(ref.shape), "ref_handle": h, **scale,
    }


def _unmatched_reference(j: _Join, covered: set[int], view_only: set[int], cov: Coverage) -> None:
    for h in j.last:
        if h in covered:
            continue
        reason = ("view-only op: it runs as an alias of its input, no kernel output to log" if h in view_only
                  else "no runtime op logged an output for this handle")
        cov.unmatched.append({"side": "reference", "ops": [x.name for x in j.nodes[h]], "handles": (h,),
                              "instruction_id": None, "reason": reason})


_COLUMNS = ["aot_debug_handle", "aot_ops", "aot_intermediate_output", "runtime_ops", "kind", "runtime_debug_handle",
            "runtime_intermediate_output", "gap", "local_gap", "metric", "mismatches", "dtype", "stacktraces",
            "source", "module", "instruction_id", "delegate", "in_delegate_call", "shape", "ref_handle",
            *SCALE_COLUMNS]


def _frame(rows: list[dict[str, Any]], cov: Coverage) -> pd.DataFrame:
    df = GapFrame(rows, columns=_COLUMNS)  # prints one-value gaps as numbers (inspector._frame)
    df["kind"] = pd.Categorical([r["kind"] for r in rows], categories=KINDS)  # typed: the schema's codes only
    df["mismatches"] = pd.Series([r["mismatches"] for r in rows], index=df.index, dtype=object)  # int | None
    for c in SCALE_COLUMNS[:3]:
        df[c] = pd.Series([r[c] for r in rows], index=df.index, dtype=object)  # float | None
    df.attrs["coverage"] = cov
    df.attrs["exact_metric"] = EXACT_METRIC
    df.attrs["noise_model"] = noise_model_attrs()
    return df


def compute_numeric_gap(reference: torch.fx.GraphModule, inputs: tuple, entries: list[RuntimeEntry],
                        comparator: NumericalComparatorBase, view_only: set[int] | None = None, local: bool = True,
                        capture: dict[str, Any] | None = None, runtime_state: dict[str, torch.Tensor] | None = None,
                        ) -> tuple[pd.DataFrame, Coverage]:
    """Builds the gap table (one row per matched runtime group, in execution order) and its coverage.
    ``capture`` (optional) receives the reference run's ``"output"`` and its ``"state"`` after the run (the
    attributes its in-place ops wrote), so a replay across calls needs no second forward pass.
    ``runtime_state``: the runtime's values of those attributes before this run, which the local re-runs read
    (by default the reference's own)."""
    reference = inline_taken_branches(reference, inputs)  # torch.cond: the ops of the branch taken, by handle
    last, nodes = reference_handles(reference)
    j = _Join(last, nodes, {h: i for i, h in enumerate(last)})
    cov = Coverage(runtime_total=len(entries), aot_total=len(last))
    picked: list[tuple[RuntimeEntry, int, int | None]] = []
    for e in entries:  # the reference op each entry is compared with: its group's latest one
        res = resolve_entry(e, last, j.order)
        if isinstance(res, str):
            cov.unmatched.append(_unmatched(e, res))
        else:
            picked.append((e, *res))
    _walk(j, reference, inputs, picked, local, capture, runtime_state)
    matched = _pairs(j, picked, cov)
    empty = [m for m in matched if is_uninitialised(j.last[m[1]])]
    for e, _, _, _ in empty:
        cov.unmatched.append(_unmatched(e, "an uninitialised allocation (empty*): its contents are no result"))
    cov.runtime_matched -= sum(e.instruction_id >= 0 for e, _, _, _ in empty)
    rows = [_row(j, *m, comparator) for m in matched if not any(m is x for x in empty)]
    _delegate_boundaries(rows)
    covered = {x for e, _, _, _ in matched for x in e.handles if x in last}
    cov.aot_matched = len(covered)
    _unmatched_reference(j, covered, view_only or set(), cov)
    log.info("numeric gap: %s", cov.summary())
    df = _frame(rows, cov)
    df.attrs["larger_is_worse"] = bool(getattr(comparator, "larger_is_worse", True))  # the comparator's own
    return df, cov
