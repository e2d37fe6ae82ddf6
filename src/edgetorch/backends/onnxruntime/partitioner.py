"""``OrtPartitioner``: tags maximal convex groups of edge nodes that ONNX Runtime can run.

A node is a candidate when its op is in the backend's whitelist (``ops.py``) or ``extra_ops``, its tensors
have supported dtypes and static or input-dependent (bounded dynamic) shapes, and it is not excluded by op,
node name or module path. With ``fallback_unsupported=True`` each candidate is also checked against
torch.onnx's translation registry, and nodes without a translation stay on the portable backend (see
``rejected``). Candidates are grouped by torch's ``CapabilityBasedPartitioner`` (partitions are convex); groups
made only of view-like ops are dropped.

Dynamic shapes: a node computing a size (``aten.sym_size.int`` and integer math on it, ``ops.SYM_OPS``) is
copied into every partition that reads it, and once more for readers outside (``localize_sizes`` rewrites the
graph it is given: ``to_backend`` hands the partitioner a private copy), so a delegate takes and returns
tensors only (ONNX computes the size with ``Shape``).

Mutable buffers (``buffers_to_mutate``, e.g. a KV cache updated with ``index_copy_``): the node computing a
buffer's (or a mutated user input's) new value is never delegated; a partition reading the buffer gets it as
a runtime input from lowering (``lowering._partition_program`` never bakes a mutated buffer into a partition).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from edgetorch.backends.onnxruntime import ops as _ops
from edgetorch.backends.onnxruntime.preprocess import BACKEND_ID, COMPILE_SPEC_DEFAULTS, export_problem
from edgetorch.exir.backend.partitioner import (
    DELEGATION_TAG,
    CompileSpec,
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from edgetorch.exir.quant_annotations import module_paths

__all__ = ["Rejection", "localize_sizes", "OrtPartitioner"]

log = logging.getLogger(__name__)

_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT", "ORT_ENABLE_ALL")


@dataclass(frozen=True)
class Rejection:
    """A node the partitioner left to the portable backend, and why."""

    node: str
    op: str
    reason: str


def _tensor_vals(x: object) -> list:
    if isinstance(x, torch.fx.Node):
        v = x.meta.get("val")
        return [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    if isinstance(x, (list, tuple)):
        return [t for a in x for t in _tensor_vals(a)]
    return []


#: values of scalar nodes (sizes of dynamic shapes, or scalars computed from data)
_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


def _is_size(x: object) -> bool:
    """A node computing a size (an int/SymInt) with an op of ``ops.SYM_OPS``."""
    if not isinstance(x, torch.fx.Node) or x.op != "call_function" or x.target not in _ops.SYM_OPS:
        return False
    v = x.meta.get("val")
    return isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool)


def _dims_problem(v: torch.Tensor, ranges: dict) -> str | None:
    """Why the shape of ``v`` cannot cross or live in a partition (None: static, or every dynamic dim is a
    function of the program's input sizes, whose ranges ``range_constraints`` holds)."""
    for d, size in enumerate(v.shape):
        if isinstance(size, int):
            continue
        expr = getattr(getattr(size, "node", None), "expr", None)
        if expr is None:
            return f"dynamic shape: dim {d} has no symbolic size"
        unknown = sorted(str(f) for f in expr.free_symbols if f not in ranges)
        if unknown:
            return f"dynamic shape: dim {d} ({expr}) depends on data ({', '.join(unknown)} is not an input size)"
    return None


def _may_be_empty(v: torch.Tensor, ranges: dict) -> bool:
    """True when a dim of ``v`` is 0, or can be 0 within the ranges of its symbols."""
    from torch.utils._sympy.value_ranges import bound_sympy

    for size in v.shape:
        if isinstance(size, int):
            if size == 0:
                return True
        elif bound_sympy(size.node.expr, ranges).lower <= 0:
            return True
    return False


def _mutation_producers(ep: ExportedProgram) -> dict[torch.fx.Node, str]:
    """{node: buffer or input name} for the nodes computing the new value of a mutated buffer or user input
    (the getitem feeding a mutation output and the multi-output node it reads)."""
    out_node = next(n for n in reversed(ep.graph.nodes) if n.op == "output")
    leaves = torch.utils._pytree.tree_leaves(out_node.args[0])
    found: dict[torch.fx.Node, str] = {}
    for spec, a in zip(ep.graph_signature.output_specs, leaves):
        if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION) and isinstance(a, torch.fx.Node):
            found[a] = str(spec.target)
            if a.target is operator.getitem and isinstance(a.args[0], torch.fx.Node):
                found[a.args[0]] = str(spec.target)
    return found


def _tag(n: torch.fx.Node) -> str | None:
    return n.meta.get(DELEGATION_TAG) if n.op == "call_function" else None


def localize_sizes(gm: torch.fx.GraphModule) -> int:
    """Gives every reader of a size node (``_is_size``) a copy with the reader's tag (or no tag for readers
    outside partitions), so that no partition takes or returns a size. Returns the number of copies made."""
    graph = gm.graph
    copies: dict[tuple[torch.fx.Node, str | None], torch.fx.Node] = {}

    def local(s: torch.fx.Node, tag: str | None) -> torch.fx.Node:
        if _tag(s) == tag:
            return s
        if (s, tag) not in copies:
            args = torch.fx.map_arg(s.args, lambda a: local(a, tag) if _is_size(a) else a)
            with graph.inserting_after(s):
                c = graph.call_function(s.target, args, dict(s.kwargs))
            c.meta = {k: v for k, v in s.meta.items() if k != DELEGATION_TAG}
            if tag is not None:
                c.meta[DELEGATION_TAG] = tag
            copies[(s, tag)] = c
        return copies[(s, tag)]

    touched = set()
    for u in list(graph.nodes):
        for a in list(u.all_input_nodes):
            if _is_size(a) and _tag(a) != _tag(u):
                u.replace_input_with(a, local(a, _tag(u)))
                touched.add(a)
    for s in reversed(list(graph.nodes)):  # originals nobody reads any more
        if s in touched and not s.users:
            graph.erase_node(s)
    return len(copies)


class _Support(OperatorSupportBase):
    def __init__(self, ok: set[torch.fx.Node]) -> None:
        super().__init__()
        self.ok = ok

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:  # noqa: ARG002
        return node in self.ok


class OrtPartitioner(Partitioner):
    """Delegates what ONNX Runtime supports to the ``onnxruntime`` backend.

    ``exclude_ops``: ops (OpOverloads or names such as ``"aten.gelu.default"`` / ``"gelu"``) never delegated.
    ``exclude_nodes``: edge node names never delegated.
    ``exclude_module_paths``: substrings of ``nn_module_stack`` paths (e.g. ``"encoder.layers.1"``) whose nodes
    stay portable.
    ``graph_optimization_level``: ORT's level in the runtime (default ``ORT_ENABLE_ALL``, what a deployment gets).
    ``fallback_unsupported``: check every candidate against torch.onnx's registry and leave nodes it cannot
    translate to the portable backend; with False such a node makes lowering fail with an ``ExportError``.
    ``extra_ops``: ops to try beyond the whitelist. ``keep_whole``: composite ops kept out of decomposition
    (names in ``ops.KEEP_WHOLE``: "linear", "layer_norm", "scaled_dot_product_attention").
    ``min_compute_ops``: partitions with fewer non-view ops are dropped.
    ``intra_op_num_threads`` (0: ``torch.get_num_threads()`` at load), ``profile_ops`` ("off" / "first" /
    "every": which traced runs get per-op ORT profiler events), ``observer_effect`` ("auto" / "off" /
    "first" / "every": which debug runs also run the plain session and compare its final outputs with the
    exposing session's, for one plain run more each; "first": the first debug run of each delegate; "auto", the
    default: "first" for a quantized model, whose exposed Q/DQ values stop ORT running integer kernels, "off"
    for a float one, whose exposed values only cost a fusion or two, so that its debug run costs about a plain
    run), ``exporter`` ("fast" / "torch.onnx"),
    ``onnx_optimize`` (onnxscript optimizer after export),
    ``allow_spinning`` (ORT threads spin-wait between runs; off by default: spinning threads starve the torch
    kernels that run between partitions) and ``compile_specs`` (raw extra specs) become the
    delegate's compile specs (only values differing from the defaults are stored).
    """

    def __init__(self, exclude_ops: Iterable[object] = (), exclude_nodes: Iterable[str] = (),
                 exclude_module_paths: Iterable[str] = (), graph_optimization_level: str = "ORT_ENABLE_ALL",
                 fallback_unsupported: bool = True, extra_ops: Iterable[object] = (),
                 keep_whole: Iterable[str] = (), min_compute_ops: int = 1, intra_op_num_threads: int = 0,
                 profile_ops: str = "first", observer_effect: str = "auto", exporter: str = "fast",
                 onnx_optimize: bool = False, allow_spinning: bool = False,
                 compile_specs: dict[str, bytes] | None = None) -> None:
        if graph_optimization_level not in _LEVELS:
            raise ValueError(f"graph_optimization_level must be one of {_LEVELS}, got {graph_optimization_level!r}")
        if profile_ops not in ("off", "first", "every"):
            raise ValueError(f"profile_ops must be 'off', 'first' or 'every', got {profile_ops!r}")
        if observer_effect not in ("auto", "every", "first", "off"):
            raise ValueError(f"observer_effect must be 'auto', 'every', 'first' or 'off', got {observer_effect!r}")
        if exporter not in ("fast", "torch.onnx"):
            raise ValueError(f"exporter must be 'fast' or 'torch.onnx', got {exporter!r}")
        self.exclude_ops = frozenset(_ops.resolve_op(o) for o in exclude_ops)
        self.exclude_nodes = frozenset(exclude_nodes)
        self.exclude_module_paths = tuple(exclude_module_paths)
        self.fallback_unsupported = fallback_unsupported
        self.extra_ops = frozenset(_ops.resolve_op(o) for o in extra_ops)
        unknown = [k for k in keep_whole if k not in _ops.KEEP_WHOLE]
        if unknown:
            raise ValueError(f"keep_whole: unknown op(s) {unknown}; known: {sorted(_ops.KEEP_WHOLE)}")
        self.keep_whole = tuple(keep_whole)
        self.min_compute_ops = min_compute_ops
        specs = {"graph_optimization_level": graph_optimization_level,
                 "intra_op_num_threads": str(int(intra_op_num_threads)), "profile_ops": profile_ops,
                 "observer_effect": observer_effect, "exporter": exporter,
                 "onnx_optimize": "1" if onnx_optimize else "0", "allow_spinning": "1" if allow_spinning else "0"}
        self.compile_specs = [CompileSpec(k, v.encode()) for k, v in specs.items()
                              if COMPILE_SPEC_DEFAULTS.get(k) != v]
        self.compile_specs += [CompileSpec(k, bytes(v)) for k, v in (compile_specs or {}).items()]
        self.rejected: list[Rejection] = []
        self._ranges: dict = {}
        self._mutations: dict[torch.fx.Node, str] = {}
        self._sizes: dict[torch.fx.Node, bool] = {}

    # -- node checks ----------------------------------------------------------------------------------
    def _reason(self, node: torch.fx.Node, allowed: frozenset) -> str | None:
        """Why ``node`` cannot be delegated (None when it can)."""
        t = node.target
        if t not in allowed:
            return "op not supported by the onnxruntime backend"
        if t in self.exclude_ops:
            return "excluded by exclude_ops"
        if node.name in self.exclude_nodes:
            return "excluded by exclude_nodes"
        if self.exclude_module_paths:
            for p in module_paths(node):
                for sub in self.exclude_module_paths:
                    if sub in p:
                        return f"excluded by exclude_module_paths ('{sub}' in '{p}')"
        outs = _tensor_vals(node)
        if not outs:
            return "produces no tensor"
        if node in self._mutations:
            return f"computes the new value of mutated '{self._mutations[node]}' (kept on the portable backend)"
        ins = _tensor_vals(list(node.args) + list(node.kwargs.values()))
        for v in ins + outs:
            if v.dtype not in _ops.TENSOR_DTYPES and not (v.dtype == torch.bfloat16 and node.target in _ops.LOWBIT_OPS):
                return f"dtype {v.dtype} is not supported"  # (bf16: a low-bit linear's scales, cast when lowered)
            problem = _dims_problem(v, self._ranges)
            if problem is not None:
                return problem
        for a in node.all_input_nodes:
            if isinstance(a.meta.get("val"), _SCALARS) and not self._size_ok(a):
                return f"reads '{a.name}' ({_ops.op_name(a.target)}), a scalar the partition cannot compute"
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)):  # only the outputs read through getitem must be non-empty
            used = {u.args[1] for u in node.users if u.target is operator.getitem}
            outs = [v for i, v in enumerate(val) if i in used and isinstance(v, torch.Tensor)]
        for v in outs:
            if _may_be_empty(v, self._ranges):
                return "empty tensor"
        if t in _ops.FLOAT_OPS:
            first = next((a for a in node.args if isinstance(a, torch.fx.Node)), None)
            fv = _tensor_vals(first)
            if fv and fv[0].dtype != torch.float32:
                return f"{_ops.op_name(t)} runs on float32 only in ORT (input is {fv[0].dtype})"
        if t is torch.ops.aten._to_copy.default:
            extra = set(node.kwargs) - {"dtype", "memory_format"}
            if extra:
                return f"_to_copy with {sorted(extra)}"
        if self.fallback_unsupported:
            problem = export_problem(node)
            if problem is not None:
                return f"no ONNX translation: {problem}"
        return None

    def _size_ok(self, node: torch.fx.Node) -> bool:
        """A size node whose whole computation (down to tensor sizes) ONNX can do."""
        if node not in self._sizes:
            self._sizes[node] = False  # no cycles in a graph, but be safe
            self._sizes[node] = _is_size(node) and all(
                self._size_ok(a) if not isinstance(a.meta.get("val"), torch.Tensor)
                else _dims_problem(a.meta["val"], self._ranges) is None for a in node.all_input_nodes)
        return self._sizes[node]

    def _candidates(self, ep: ExportedProgram) -> set[torch.fx.Node]:
        allowed = _ops.supported_ops() | self.extra_ops | frozenset(_ops.KEEP_WHOLE[k] for k in self.keep_whole)
        ok: set[torch.fx.Node] = set()
        self.rejected = []
        self._ranges = dict(ep.range_constraints)
        self._mutations = _mutation_producers(ep)
        self._sizes: dict[torch.fx.Node, bool] = {}
        for node in ep.graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in _ops.SYM_OPS and not isinstance(node.meta.get("val"), torch.Tensor):
                if self._size_ok(node):
                    ok.add(node)
                continue
            if node.target is operator.getitem:
                src = node.args[0]
                if src in ok:
                    ok.add(node)
                continue
            reason = self._reason(node, allowed)
            if reason is None:
                ok.add(node)
            else:
                self.rejected.append(Rejection(node.name, _ops.op_name(node.target), reason))
        return ok

    # -- Partitioner API ------------------------------------------------------------------------------
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        gm = exported_program.graph_module
        ok = self._candidates(exported_program)
        parts = CapabilityBasedPartitioner(gm, _Support(ok), allows_single_node_partition=True).propose_partitions()
        tags: dict[str, DelegationSpec] = {}
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        parts.sort(key=lambda p: min(order[n] for n in p.nodes))
        for p in parts:
            compute = [n for n in p.nodes if n.target not in _ops.NON_COMPUTE_OPS]
            if len(compute) < max(self.min_compute_ops, 1):
                continue
            tag = f"onnxruntime_{len(tags)}"
            tags[tag] = DelegationSpec(BACKEND_ID, list(self.compile_specs))
            for n in p.nodes:
                n.meta[DELEGATION_TAG] = tag
        if tags and localize_sizes(gm):
            gm.graph.lint()
            gm.recompile()
        log.info("OrtPartitioner: %d partitions, %d nodes delegated, %d left to the portable backend",
                 len(tags), sum(1 for n in gm.graph.nodes if n.meta.get(DELEGATION_TAG)), len(self.rejected))
        return PartitionResult(exported_program, tags)

    def ops_to_not_decompose(self, exported_program: ExportedProgram
                             ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        return [_ops.KEEP_WHOLE[k] for k in self.keep_whole], None
