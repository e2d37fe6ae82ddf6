"""``to_backend``: replaces each tagged partition of an edge program with one delegate call.

The input program is never mutated (the ETRecord holds it): the graph is copied first. For every partition the
subgraph is re-exported as its own ExportedProgram (parameters it reads become buffers, so backends see them as
constants), handed to the backend's ``preprocess``, and replaced by a delegate call
``executorch_call_delegate(lowered_module_<i>, *inputs)`` whose first argument is a ``get_attr`` of the
``LoweredBackendModule``, a submodule of the lowered program's graph module (``exir.backend.lowered``);
parameters that only the partition read leave the owning program (they live in the delegate blob).
"""

from __future__ import annotations

import copy
import logging
import operator
import time

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule, legalize_graph, validate_partition

from edgetorch import _progress as progress
from edgetorch.errors import ExportError
from edgetorch.exir.backend.backend_details import get_backend_details, named_data_of
from edgetorch.exir.backend.lowered import CALL_DELEGATE, LoweredBackendModule, attach_lowered_module
from edgetorch.exir.backend.partitioner import DELEGATION_TAG, Partitioner
from edgetorch.exir.clone import clone_program
from edgetorch.exir.debug_handles import get_debug_handle, set_debug_handle, source_location

__all__ = ["to_backend_program"]

log = logging.getLogger(__name__)

_META_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node")


def _hint(s) -> int:
    if isinstance(s, torch.SymInt):
        h = s.node.hint
        if h is None:
            raise ExportError(f"size {s} has no example value to re-export a partition with")
        return int(h)
    return int(s)


def _example(val) -> torch.Tensor | int:
    if isinstance(val, (torch.SymInt, int)):
        return _hint(val)
    shape = tuple(_hint(s) for s in val.shape)
    strides = tuple(_hint(s) for s in val.stride())  # the layout the partition sees (a permuted SDPA output)
    t = torch.empty_strided(shape, strides, dtype=val.dtype)
    return t.normal_() if val.dtype.is_floating_point else t.zero_()


def _dynamic_shapes(ep: ExportedProgram, vals: list) -> tuple | None:
    """``dynamic_shapes`` re-exporting a partition keeps its inputs' bounded dynamic dims (one Dim per symbol)."""
    dims: dict = {}

    def dim(sym):
        if sym not in dims:
            vr = ep.range_constraints[sym]
            dims[sym] = torch.export.Dim(str(sym), min=int(vr.lower), max=int(vr.upper))
        return dims[sym]

    specs = []
    for v in vals:
        if isinstance(v, torch.SymInt):
            specs.append(dim(v.node.expr) if v.node.expr in ep.range_constraints else None)
        elif isinstance(v, torch.Tensor):
            specs.append({d: dim(s.node.expr) for d, s in enumerate(v.shape)
                          if isinstance(s, torch.SymInt) and s.node.expr in ep.range_constraints} or None)
        else:
            specs.append(None)
    return tuple(specs) if dims else None


def _partition_program(ep: ExportedProgram, nodes: list[torch.fx.Node], name: str
                       ) -> tuple[ExportedProgram, list[torch.fx.Node], list[torch.fx.Node]]:
    """Re-exports ``nodes`` as a standalone program; returns it, its activation inputs and its outputs."""
    gm = ep.graph_module
    sub_gm, orig_inputs, orig_outputs = fuse_as_graphmodule(gm, nodes, name, always_return_tuple=True)
    sig = ep.graph_signature
    mutated = set(sig.buffers_to_mutate.values())  # state: passed to the delegate at run time, never baked in
    const_targets = {k: v for k, v in {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
                                       **getattr(sig, "inputs_to_lifted_tensor_constants", {})}.items()
                     if v not in mutated}
    placeholders = [n for n in sub_gm.graph.nodes if n.op == "placeholder"]
    act_inputs: list[torch.fx.Node] = []
    for ph, orig in zip(placeholders, orig_inputs):
        if orig.op == "placeholder" and orig.name in const_targets:
            target = const_targets[orig.name]
            tensor = ep.state_dict.get(target, ep.constants.get(target))
            attr = "c_" + target.replace(".", "_")
            sub_gm.register_buffer(attr, tensor.detach())
            with sub_gm.graph.inserting_before(ph):
                ga = sub_gm.graph.get_attr(attr)
            ga.meta = dict(ph.meta)
            ph.replace_all_uses_with(ga)
            sub_gm.graph.erase_node(ph)
        else:
            act_inputs.append(orig)
    sub_gm.recompile()
    examples = tuple(_example(n.meta["val"]) for n in act_inputs)
    try:
        sub_ep = torch.export.export(sub_gm, examples, strict=False,
                                     dynamic_shapes=_dynamic_shapes(ep, [n.meta["val"] for n in act_inputs]))
    except Exception as e:
        first = nodes[0]
        raise ExportError(f"partition '{name}' ({len(nodes)} ops from node '{first.name}') could not be re-exported "
                          f"for its backend: {type(e).__name__}: {e}\n  source: "
                          f"{source_location(first.meta.get('stack_trace'))}") from e
    # restore source metadata lost by retracing, keyed by debug handle
    by_handle = {}
    for n in nodes:
        h = get_debug_handle(n)
        if h is not None and h not in by_handle:
            by_handle[h] = n.meta
    for n in sub_ep.graph.nodes:
        h = get_debug_handle(n) if n.op == "call_function" else None
        if h in by_handle:
            for k in _META_KEYS:
                if k in by_handle[h] and not n.meta.get(k):
                    n.meta[k] = by_handle[h][k]
    return sub_ep, act_inputs, list(orig_outputs)


def _group_partitions(gm: torch.fx.GraphModule, result, method: str) -> dict[str, list[torch.fx.Node]]:
    """Step 1, grouping: the tagged call_function nodes by partition tag, in graph order."""
    groups: dict[str, list[torch.fx.Node]] = {}
    for n in gm.graph.nodes:
        tag = n.meta.get(DELEGATION_TAG)
        if tag is None or n.op != "call_function":
            continue
        if tag not in result.partition_tags:
            raise ExportError(f"method '{method}': node '{n.name}' is tagged '{tag}', which the partitioner did not "
                              "describe in partition_tags")
        groups.setdefault(tag, []).append(n)
    return groups


def _close_partition(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node], tag: str, method: str
                     ) -> dict[torch.fx.Node, None]:
    """A partition with the getitems of its multi-output nodes, in graph order; refuses a non-convex one."""
    inside = dict.fromkeys(nodes)
    for n in list(nodes):
        for u in n.users:
            if u.target is operator.getitem and u not in inside:
                inside[u] = None
    ordered = dict.fromkeys(n for n in gm.graph.nodes if n in inside)
    if not validate_partition(list(ordered)):
        raise ExportError(f"method '{method}': partition '{tag}' is not convex (a path leaves it and comes "
                          "back); the partitioner must split it")
    return ordered


def _preprocess(spec, sub_ep: ExportedProgram, outputs: list[torch.fx.Node], tag: str,
                n_ops: int) -> LoweredBackendModule:
    """Step 3, preprocess: the backend turns the re-exported partition into its blob."""
    backend = get_backend_details(spec.backend_id)
    t1 = time.perf_counter()
    res = backend.preprocess(sub_ep, list(spec.compile_specs))
    named = {} if res.data_store_output is None else named_data_of(res.data_store_output, spec.backend_id)
    log.info("preprocess %s partition %s (%d ops) in %.2fs", spec.backend_id, tag, n_ops, time.perf_counter() - t1)
    lowered = LoweredBackendModule(
        spec.backend_id, bytes(res.processed_bytes), list(spec.compile_specs), sub_ep,
        {k: tuple(v) for k, v in (res.debug_handle_map or {}).items()}, res.debug_buffer_bytes)
    lowered.named_data = named  # {key: bytes}: stored once per program by emission (exir.emit.DelegatePool)
    return lowered


def _splice(gm: torch.fx.GraphModule, inside: dict[torch.fx.Node, None], act_inputs: list[torch.fx.Node],
            outputs: list[torch.fx.Node], lowered: LoweredBackendModule, handle: int, name: str) -> None:
    """Step 4, splice (and step 5, handles): ``lowered`` becomes a submodule of ``gm``, read by a ``get_attr``
    node; one delegate call on it (debug handle ``handle``, shared by its getitems) replaces the partition's
    nodes."""
    nodes = list(inside)
    attr = attach_lowered_module(gm, lowered)
    with gm.graph.inserting_after(nodes[-1]):
        module_node = gm.graph.get_attr(attr)
    with gm.graph.inserting_after(module_node):
        call = gm.graph.call_function(CALL_DELEGATE, (module_node, *act_inputs))
    call.meta["val"] = tuple(o.meta["val"] for o in outputs)
    call.meta["stack_trace"] = nodes[0].meta.get("stack_trace")
    call.meta["nn_module_stack"] = nodes[0].meta.get("nn_module_stack")
    set_debug_handle(call, handle)
    call.name = name
    for j, o in enumerate(outputs):
        with gm.graph.inserting_after(call):
            gi = gm.graph.call_function(operator.getitem, (call, j))
        gi.meta["val"] = o.meta["val"]
        set_debug_handle(gi, handle)
        o.replace_all_uses_with(gi, delete_user_cb=lambda u: u not in inside)
    for n in reversed(nodes):
        gm.graph.erase_node(n)


def _prune_signature(tagged: ExportedProgram, gm: torch.fx.GraphModule) -> tuple[ExportGraphSignature, dict, dict]:
    """Step 6, signature pruning: parameters now only read inside delegates leave the owning program; the
    output specs follow the renamed outputs. Returns (signature, state dict, constants)."""
    sig = tagged.graph_signature
    drop = {n.name for n in gm.graph.nodes if n.op == "placeholder" and not n.users}
    keep_specs = []
    state_dict, constants = dict(tagged.state_dict), dict(tagged.constants)
    for s in sig.input_specs:
        if s.arg.name in drop and s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            for n in list(gm.graph.nodes):
                if n.op == "placeholder" and n.name == s.arg.name:
                    gm.graph.erase_node(n)
            if s.target in state_dict and not any(o.target == s.target for o in sig.input_specs if o is not s):
                state_dict.pop(s.target)
            constants.pop(s.target, None)
        else:
            keep_specs.append(s)
    gm.graph.lint()
    gm.recompile()
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_args = list(torch.utils._pytree.tree_leaves(out_node.args[0]))
    out_specs = []
    for s, a in zip(sig.output_specs, out_args):
        s = copy.copy(s)
        if isinstance(a, torch.fx.Node) and hasattr(s.arg, "name"):
            s.arg = type(s.arg)(name=a.name)
        out_specs.append(s)
    return ExportGraphSignature(keep_specs, out_specs), state_dict, constants


def _output_last(gm: torch.fx.GraphModule) -> None:
    """Moves the nodes ``legalize_graph`` placed after the output (ops without users, e.g. a mask a Hugging Face
    MoE block computes and never reads) back before it: torch's verifier wants the output last."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    after, n = [], out.next
    while n.op != "root":
        after.append(n)
        n = n.next
    for n in after:
        out.prepend(n)


def to_backend_program(ep: ExportedProgram, partitioner: Partitioner, method: str = "forward") -> ExportedProgram:
    """Lowers the partitions ``partitioner`` tags; returns a new program with delegate calls. Steps: grouping,
    re-export of each partition, preprocess, splice of its delegate call with a fresh debug handle, then
    signature pruning."""
    t0 = time.perf_counter()
    work = clone_program(ep)
    progress.note(f"'{method}': partitioning ({type(partitioner).__name__})")
    result = partitioner.partition(work)
    tagged = result.tagged_exported_program
    gm = tagged.graph_module
    groups = _group_partitions(gm, result, method)
    if not groups:
        return ep
    top = max((get_debug_handle(n) or 0 for n in gm.graph.nodes), default=0)
    for i, (tag, nodes) in enumerate(groups.items()):
        spec = result.partition_tags[tag]
        inside = _close_partition(gm, nodes, tag, method)
        nodes = list(inside)
        where = f"'{method}': partition {i + 1}/{len(groups)} ({len(nodes)} ops) to {spec.backend_id}"
        progress.note(f"{where}: re-export")
        sub_ep, act_inputs, outputs = _partition_program(tagged, nodes, f"{spec.backend_id}_{i}")  # step 2
        progress.note(f"{where}: preprocess")
        lowered = _preprocess(spec, sub_ep, outputs, tag, len(nodes))
        top += 1
        _splice(gm, inside, act_inputs, outputs, lowered, top, f"lowered_{spec.backend_id}_{i}")
    legalize_graph(gm)
    _output_last(gm)
    new_sig, state_dict, constants = _prune_signature(tagged, gm)
    lowered_ep = clone_program(tagged, gm, new_sig, state_dict, constants)
    log.info("to_backend(%s): %d partitions in %.2fs", method, len(groups), time.perf_counter() - t0)
    return lowered_ep
