"""Per-op numeric gaps between a reference graph run eagerly and the runtime's logged intermediates.

Steps: (1) run the reference program (the ATen program from the ETRecord, whose nodes carry the same debug
handles as the edge ops decomposed from them) on the representative inputs, keeping each op's output;
(2) collect the runtime outputs per handle group (a kernel's handle, a delegate call's handle list, or the
handles one op inside a delegate computes); (3) pair each runtime group with the output of the last reference op
of the group and compare them. Besides this *accumulated* gap, a second pass re-runs every reference op on the
runtime's own intermediate values and compares again: the *local* gap, which isolates the error each op adds.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import torch.fx

from edgetorch.devtools.inspector.comparators import NumericalComparatorBase
from edgetorch.exir.debug_handles import get_debug_handle, source_location

log = logging.getLogger(__name__)


@dataclass
class RuntimeEntry:
    """Runtime outputs for one handle group."""

    handles: tuple[int, ...]
    ops: list[str]
    value: Any  # tensor, or list of tensors for multi-output instructions
    instruction_id: int
    delegate_backend: str | None = None
    in_delegate_call: int | None = None  # instruction id of the enclosing DELEGATE_CALL for inner ops
    is_delegate_call: bool = False
    order: tuple = ()


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


def _pick_runtime(value: Any, like: torch.Tensor) -> torch.Tensor | None:
    """The runtime tensor of an entry that corresponds to the reference tensor ``like`` (same element count)."""
    if isinstance(value, torch.Tensor):
        return value if value.numel() == like.numel() else None
    cands = [t for t in value if isinstance(t, torch.Tensor) and t.numel() == like.numel()]
    for pred in (lambda t: t.dtype == like.dtype and tuple(t.shape) == tuple(like.shape),
                 lambda t: t.dtype == like.dtype, lambda t: True):
        pool = [t for t in cands if pred(t)]
        if pool:
            return pool[0]  # the primary output of a multi-output kernel comes first
    return None


def _is_view(n: torch.fx.Node) -> bool:
    t = n.target
    if not isinstance(t, torch._ops.OpOverload):
        return False
    from edgetorch.exir.op_variants import is_view_op

    return is_view_op(t)


class _JointWalk(torch.fx.Interpreter):
    """One pass over the reference module computing, per handle, the reference output (on reference inputs)
    and, with ``runtime`` (handle -> runtime tensor), the *local* reference: the op re-run on the runtime's
    own values of its inputs. Only ops downstream of a runtime value that differs from the reference are
    computed twice, so an exact runtime costs one forward pass.

    ``rt_env`` holds the runtime-side value of a node where it differs from the reference value; ``exact``
    marks nodes whose runtime-side value is the runtime's own (inputs, constants, substituted outputs, and
    views/getitems of exact values), which gives view-only ops a runtime value."""

    def __init__(self, gm: torch.fx.GraphModule, last_node: dict[int, torch.fx.Node],
                 runtime: dict[int, torch.Tensor] | None) -> None:
        super().__init__(gm)
        self.by_node = {n: h for h, n in last_node.items()}
        self.runtime = runtime
        self.outputs: dict[int, Any] = {}
        self.local: dict[int, Any] = {}
        self.rt_env: dict[torch.fx.Node, Any] = {}
        self.exact: set[torch.fx.Node] = set()
        self.derived: set[int] = set()
        self.same: dict[int, bool] = {}  # handle -> the runtime value equals the reference bit for bit
        # values later mutated in place (e.g. relu_ in a training-IR ATen graph) are recorded as copies
        self.mutated = {n for n in gm.graph.nodes if any(
            isinstance(u.target, torch._ops.OpOverload) and u.target._schema.is_mutable for u in n.users)}

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
        return getattr(self, n.op)(n.target, args, kwargs)

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        h = self.by_node.get(n)
        if self.runtime is None:
            if h is not None:
                self.outputs[h] = self._keep(n, out)
            return out
        if n.op in ("placeholder", "get_attr"):
            self.exact.add(n)
            return out
        if n.op != "call_function":
            return out
        inputs = n.all_input_nodes
        differs = any(a in self.rt_env for a in inputs)
        local = self._run_on_runtime_values(n) if differs else out
        if (n.target is operator.getitem or _is_view(n)) and (h is None or h not in self.runtime):
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
        rt = self.runtime.get(h)
        ref = _first_tensor(out)
        if rt is not None and ref is not None and rt.numel() == ref.numel():
            sub = self._keep(n, rt.reshape(ref.shape).to(ref.dtype))
            self.exact.add(n)
            self.same[h] = same = torch.equal(sub, ref)
            if not same:
                self.rt_env[n] = sub if isinstance(out, torch.Tensor) else type(out)([sub, *list(out)[1:]])
            else:
                self.rt_env.pop(n, None)
        elif differs:
            self.rt_env[n] = local
        return out


def reference_handles(gm: torch.fx.GraphModule) -> tuple[dict[int, torch.fx.Node], dict[int, list[torch.fx.Node]]]:
    """Per handle: the last op node (its output is what gets compared) and all op nodes, in graph order."""
    last: dict[int, torch.fx.Node] = {}
    nodes: dict[int, list[torch.fx.Node]] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        h = get_debug_handle(n)
        if h is None:
            continue
        last[h] = n
        nodes.setdefault(h, []).append(n)
    return last, nodes


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _cls = list(stack.values())[-1]
    return str(path)


def compute_numeric_gap(reference: torch.fx.GraphModule, inputs: tuple, entries: list[RuntimeEntry],
                        comparator: NumericalComparatorBase, view_only: set[int] | None = None,
                        delegated_without_inner: set[int] | None = None, local: bool = True
                        ) -> tuple[pd.DataFrame, Coverage]:
    """Builds the gap table (one row per matched runtime group, in execution order) and its coverage."""
    last, nodes = reference_handles(reference)
    order = {h: i for i, h in enumerate(last)}  # execution order of each handle's last op
    # the reference tensor each runtime entry is compared with: the output of its group's last op. Entries
    # are resolved against the reference's output *shapes*, known from node metadata or a first walk.
    cov = Coverage(runtime_total=len(entries), aot_total=len(last))
    runtime: dict[int, torch.Tensor] = {}
    picked: list[tuple[RuntimeEntry, int]] = []
    for e in entries:
        cands = [h for h in e.handles if h in last]
        if not cands:
            cov.unmatched.append({"side": "runtime", "ops": e.ops, "handles": e.handles,
                                  "instruction_id": e.instruction_id,
                                  "reason": "no reference op carries these debug handles"})
            continue
        h = max(cands, key=order.__getitem__)
        picked.append((e, h))
    with torch.no_grad():
        if local:
            # runtime values per handle, finest first (inner delegate rows over their DELEGATE_CALL row)
            for e, h in picked:
                if e.is_delegate_call and h in runtime:
                    continue
                val = _first_tensor(e.value) if isinstance(e.value, torch.Tensor) else None
                if val is None:
                    vals = [t for t in (e.value or []) if isinstance(t, torch.Tensor)]
                    want = last[h].meta.get("val")
                    want = _first_tensor(want) if want is not None else None
                    val = _pick_runtime(vals, want) if want is not None else (vals[0] if vals else None)
                if val is not None:
                    runtime[h] = val
        walk = _JointWalk(reference, last, runtime if local else None)
        walk.run(*inputs)
    aot, local_ref = walk.outputs, walk.local
    matched: list[tuple[RuntimeEntry, int, torch.Tensor, torch.Tensor]] = []
    for e, h in picked:
        ref = _first_tensor(aot.get(h))
        if ref is None:
            cov.unmatched.append({"side": "runtime", "ops": e.ops, "handles": e.handles,
                                  "instruction_id": e.instruction_id,
                                  "reason": "the reference op of this group produced no tensor"})
            continue
        rt = _pick_runtime(e.value, ref)
        if rt is None:
            cov.unmatched.append({"side": "runtime", "ops": e.ops, "handles": e.handles,
                                  "instruction_id": e.instruction_id,
                                  "reason": f"no runtime output has the {ref.numel()} elements of the reference "
                                            f"output {tuple(ref.shape)}"})
            continue
        matched.append((e, h, ref, rt))
    cov.runtime_matched = len(matched)
    # view-only reference ops: their runtime value is the view of the runtime's value of their input
    for h in sorted(walk.derived, key=order.__getitem__):
        rt = _first_tensor(local_ref.get(h))
        ref = _first_tensor(aot.get(h))
        if rt is None or ref is None or rt.numel() != ref.numel():
            continue
        matched.append((RuntimeEntry((h,), ["(alias of a runtime value)"], rt, -1), h, ref, rt))
    matched.sort(key=lambda m: order[m[1]])  # execution order of the reference (stable)
    covered: set[int] = set()
    rows = []
    for e, h, ref, rt in matched:
        group = [x for x in e.handles if x in last]
        covered.update(group)
        aot_names = [n.name for x in sorted(group, key=order.__getitem__) for n in nodes.get(x, [])]
        same = walk.same.get(h) if (e.instruction_id >= 0 and rt is runtime.get(h)) else None
        ident = getattr(comparator, "identical_value", None)
        gap = ident if (same and ident is not None) else comparator.compare(ref, rt)
        lref = _first_tensor(local_ref.get(h)) if local_ref else None
        if lref is None or lref.numel() != rt.numel():
            lgap = None
        elif lref is ref:  # the op saw the reference's own inputs: its local gap is its gap
            lgap = gap
        else:
            lgap = comparator.compare(lref, rt)
        node = last[h]
        rows.append({
            "aot_debug_handle": tuple(sorted(group, key=order.__getitem__)),
            "aot_ops": aot_names,
            "aot_intermediate_output": ref,
            "runtime_ops": list(e.ops),
            "runtime_debug_handle": tuple(e.handles),
            "runtime_intermediate_output": rt,
            "gap": [gap],
            "local_gap": [lgap] if lgap is not None else [None],
            "stacktraces": {n.name: n.meta.get("stack_trace") for x in group for n in nodes.get(x, [])},
            "source": source_location(node.meta.get("stack_trace")),
            "module": _module_path(node),
            "instruction_id": e.instruction_id,
            "delegate": e.delegate_backend,
            "in_delegate_call": e.in_delegate_call,
            "shape": tuple(ref.shape),
        })
    cov.aot_matched = len(covered)
    view_only = view_only or set()
    delegated_without_inner = delegated_without_inner or set()
    for h, n in last.items():
        if h in covered:
            continue
        if h in view_only:
            reason = "view-only op: it runs as an alias of its input, no kernel output to log"
        elif h in delegated_without_inner:
            reason = "inside a delegate that logs no per-op outputs (covered by its DELEGATE_CALL row)"
        else:
            reason = "no runtime op logged an output for this handle"
        cov.unmatched.append({"side": "reference", "ops": [x.name for x in nodes[h]], "handles": (h,),
                              "instruction_id": None, "reason": reason})
    columns = ["aot_debug_handle", "aot_ops", "aot_intermediate_output", "runtime_ops", "runtime_debug_handle",
               "runtime_intermediate_output", "gap", "local_gap", "stacktraces", "source", "module",
               "instruction_id", "delegate", "in_delegate_call", "shape"]
    df = pd.DataFrame(rows, columns=columns)
    df.attrs["coverage"] = cov
    log.info("numeric gap: %s", cov.summary())
    return df, cov
