"""The ahead-of-time side of the onnxruntime backend: a partition (an ExportedProgram whose parameters are
buffers) becomes an ONNX model, packed with its weights and debug tables into the delegate blob.

Export goes through torch's dynamo ONNX exporter. By default (``exporter="fast"``) it calls the exporter's
translation step directly with a registry built once per process and skips the exporter's re-decomposition
when every op of the partition already has an ONNX translation (edge programs are core ATen already); that
keeps node names exactly those of the program held here, which the debug tables rely on. ``exporter=
"torch.onnx"`` runs the public ``torch.onnx.export(program, dynamo=True)`` instead (slower, same result).

Debug tables: the exporter names every ONNX value after the FX node that computes it (``name`` or
``name__i`` for the i-th output of a multi-output node) and records the FX node of every ONNX node in its
``pkg.torch.onnx.fx_node`` metadata. Through the program held here (never a renamed sub-GraphModule) each
ONNX value and node is mapped to the edge debug handles in ``node.meta["custom"]``.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import re
import time
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram

from edgetorch.backends.onnxruntime import _blob
from edgetorch.backends.onnxruntime._fusions import fuse_gelu, strip_node_metadata
from edgetorch.backends.onnxruntime._lowbit import lower_lowbit_nodes, register_lowbit_ops
from edgetorch.backends.onnxruntime.ops import REWRITTEN, op_name, quantize_ops
from edgetorch.errors import ExportError
from edgetorch.exir.backend.backend_details import (
    BackendDetails,
    NamedDataStore,
    PreprocessResult,
    register_backend_details,
)
from edgetorch.exir.backend.partitioner import CompileSpec
from edgetorch.exir.clone import clone_program
from edgetorch.exir.debug_handles import get_debug_handle, source_location
from edgetorch.formats import alignment

__all__ = ["BACKEND_ID", "EXTERNAL_MIN_BYTES", "COMPILE_SPEC_DEFAULTS", "compile_spec_dict", "onnx_registry",
           "export_problem", "export_to_onnx", "dim_spec", "symbol_bounds", "build_debug_tables", "lower_partition",
           "OrtBackend"]

log = logging.getLogger(__name__)

BACKEND_ID = "onnxruntime"
#: initializers of at least this many bytes are stored outside the ModelProto (zero-copy at load time)
EXTERNAL_MIN_BYTES = 1024
_FX_NODE_RE = re.compile(r"%([^\s:]+)\s*:")
_TRANSLATE_RE = re.compile(r"translating node %([^\s:]+)")
_MULTI_OUT_RE = re.compile(r"(.+)__(\d+)")

COMPILE_SPEC_DEFAULTS: dict[str, str] = {
    # weights of at least this many bytes go to the program's named data, stored once per program and shared by
    # every delegate and method holding the same bytes (prefill and decode); smaller ones and "-1": in the blob
    "named_data_min_bytes": "65536",
    "graph_optimization_level": "ORT_ENABLE_ALL",  # ORT_DISABLE_ALL / ORT_ENABLE_BASIC / _EXTENDED / _ALL
    "intra_op_num_threads": "0",  # 0: torch.get_num_threads() when the program is loaded
    "exporter": "fast",  # or "torch.onnx"
    "onnx_optimize": "0",  # run the onnxscript optimizer on the exported model
    "profile_ops": "first",  # per-op ORT profile events in traced runs: off / first / every
    # debug runs that also run the plain session to compare (a plain run more each): auto / off / first / every;
    # auto: first for a quantized model (exposing its Q/DQ values changes the kernels ORT runs), else off
    "observer_effect": "auto",
    # ORT intra-op threads spin-wait after each op: costs nothing measurable when fully delegated, but steals
    # the cores torch kernels between partitions need (ResNet-18 with 17 partitions: 556 ms vs 50 ms, 2 cores)
    "allow_spinning": "0",
    # 8da4w linears (MatMulNBits) of dynamic-length partitions (a prefill): int8 compute as the recipe says, or
    # float (faster for many rows on x86; see backends/onnxruntime/_lowbit.py)
    "lowbit_dynamic_compute": "int8",
}


def compile_spec_dict(specs: list[CompileSpec] | dict[str, bytes]) -> dict[str, str]:
    """Compile specs as strings, defaults filled in."""
    got = specs if isinstance(specs, dict) else {c.key: c.value for c in specs}
    out = dict(COMPILE_SPEC_DEFAULTS)
    for k, v in got.items():
        out[k] = v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
    return out


# ----------------------------------------------------------------------------------------------
# torch.onnx internals (one registry per process)
# ----------------------------------------------------------------------------------------------

def onnx_registry() -> Any:
    """The torchlib ONNX registry (building it costs 1-3 s; done once per process, and once more if torchao
    registers the ``quantized_decomposed`` ops after it was built: torchlib only translates ops that exist)."""
    return _registry(bool(quantize_ops()))


@functools.cache
def _registry(with_quantize_ops: bool) -> Any:
    from torch.onnx._internal.exporter import _registration

    t0 = time.perf_counter()
    reg = _registration.ONNXRegistry.from_torchlib()
    register_lowbit_ops(reg)
    log.info("onnxruntime backend: built the torchlib ONNX registry in %.2fs (quantize ops: %s)",
             time.perf_counter() - t0, with_quantize_ops)
    return reg


def _implemented() -> frozenset:
    return _implemented_in(bool(quantize_ops()))


@functools.cache
def _implemented_in(with_quantize_ops: bool) -> frozenset:
    from torch.onnx._internal.exporter import _decomp

    return frozenset(_decomp.get_onnx_implemented_overloads(_registry(with_quantize_ops)))


def export_problem(node: torch.fx.Node) -> str | None:
    """Why ``node`` has no ONNX translation (None when it has one). Cheap: a registry dispatch, no export."""
    if node.target in REWRITTEN:
        return None
    from torch.onnx._internal.exporter import _dispatching

    try:
        fn, message = _dispatching.dispatch(node, onnx_registry())
    except Exception as e:  # noqa: BLE001 - any dispatch failure means "cannot export"
        return f"{type(e).__name__}: {e}"
    return None if fn is not None else message


def _rewrite_for_export(gm: torch.fx.GraphModule) -> None:
    """Replaces ops without an ONNX translation by static equivalents (names and metadata kept)."""
    changed = False
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is torch.ops.aten.squeeze.dims:
            _rewrite_squeeze(gm.graph, n)
            changed = True
        elif n.target is sdpa and n.kwargs.get("scale") is None and len(n.args) < 7 \
                and isinstance(n.args[0].meta["val"].shape[-1], int):
            # a constant scale: torchlib otherwise computes 1/sqrt(E) from Shape at run time
            q = n.args[0].meta["val"]
            n.kwargs = {**n.kwargs, "scale": 1.0 / math.sqrt(q.shape[-1])}
            changed = True
        elif n.target is torch.ops.aten.max_pool2d_with_indices.default and _unused_outputs(n) == {1}:
            # indices nobody reads: plain max_pool2d (torchlib computes indices with a second MaxPool)
            n.target = torch.ops.aten.max_pool2d.default
            n.meta["val"] = n.meta["val"][0]
            for u in list(n.users):
                if u.args[1] == 0:
                    u.target, u.args = torch.ops.aten.alias.default, (n,)  # keeps the getitem's name
                else:
                    gm.graph.erase_node(u)
            changed = True
    if changed:
        gm.recompile()


def _rewrite_squeeze(graph: torch.fx.Graph, n: torch.fx.Node) -> None:
    """``squeeze.dims`` -> a static ``view``, or with a dynamic shape one ``squeeze.dim`` per squeezed dim
    (highest first; the last keeps the node, its name and metadata)."""
    val = n.meta["val"]
    if all(isinstance(d, int) for d in val.shape):
        n.target, n.args, n.kwargs = torch.ops.aten.view.default, (n.args[0], list(val.shape)), {}
        return
    src = n.args[0]
    rank = src.meta["val"].dim()
    sizes = src.meta["val"].shape
    dims = sorted({d % rank for d in n.args[1] if isinstance(sizes[d % rank], int) and sizes[d % rank] == 1},
                  reverse=True)
    if not dims:  # nothing to squeeze
        n.target, n.args, n.kwargs = torch.ops.aten.alias.default, (src,), {}
        return
    for d in dims[:-1]:
        with graph.inserting_before(n):
            step = graph.call_function(torch.ops.aten.squeeze.dim, (src, d))
        step.meta = {k: v for k, v in n.meta.items() if k != "val"}
        step.meta["val"] = torch.ops.aten.squeeze.dim(src.meta["val"], d)
        src = step
    n.target, n.args, n.kwargs = torch.ops.aten.squeeze.dim, (src, dims[-1]), {}


def _unused_outputs(n: torch.fx.Node) -> set[int] | None:
    """Outputs of a multi-output node that no getitem with users reads (None: the node is read otherwise)."""
    if not all(u.target is operator.getitem for u in n.users):
        return None
    return set(range(len(n.meta["val"]))) - {u.args[1] for u in n.users if u.users}


def _copy_program(ep: ExportedProgram) -> ExportedProgram:
    work = clone_program(ep)
    if [n.name for n in work.graph.nodes] != [n.name for n in ep.graph.nodes]:  # pragma: no cover - torch change
        raise ExportError("onnxruntime: copying the partition renamed its nodes; debug tables would be wrong")
    return work


def _hint(size: Any) -> int:
    """A dim's example value (a dynamic dim's hint)."""
    return size if isinstance(size, int) else int(size.node.hint)


def _example_args(ep: ExportedProgram) -> tuple:
    user = set(ep.graph_signature.user_inputs)
    out = []
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name in user:
            v = n.meta["val"]
            out.append(torch.zeros(tuple(_hint(d) for d in v.shape), dtype=v.dtype))
    return tuple(out)


def export_to_onnx(ep: ExportedProgram, *, exporter: str = "fast", optimize: bool = False
                   ) -> tuple[Any, ExportedProgram]:
    """Exports ``ep`` (not modified) to an ``onnx_ir.Model``; returns it and the program whose node names the
    ONNX values carry (a copy of ``ep``, possibly decomposed further by the exporter)."""
    from torch.onnx._internal.exporter import _core, _flags, _fx_passes

    work = _copy_program(ep)
    _rewrite_for_export(work.graph_module)
    if exporter == "torch.onnx":
        prog = torch.onnx.export(work, _example_args(work), dynamo=True, optimize=False, verbose=False)
        work = prog.exported_program
    elif exporter == "fast":
        reg = onnx_registry()
        impl = _implemented()

        @_flags.set_onnx_exporting_flag
        def translate(work: ExportedProgram) -> tuple[Any, ExportedProgram]:
            missing = {n.target for n in work.graph.nodes if n.op == "call_function"
                       and n.target is not operator.getitem and n.target not in impl}
            if missing:
                log.info("onnxruntime: decomposing %s before export", sorted(map(str, missing)))
                work = _core._prepare_exported_program_for_export(work, registry=reg)
            else:
                _fx_passes.insert_type_promotion_nodes(work.graph_module)
                work._graph_module = _fx_passes.remove_assertion_nodes(work.graph_module)
            return _core._exported_program_to_onnx_program(work, registry=reg), work

        prog, work = translate(work)
    else:
        raise ExportError(f"onnxruntime: unknown exporter '{exporter}' (expected 'fast' or 'torch.onnx')")
    if optimize:
        prog.optimize()
    return prog.model, work


def _export_error(ep: ExportedProgram, work: ExportedProgram | None, e: BaseException) -> ExportError:
    """An ExportError naming the FX node (op, debug handle, source line) the exporter failed on."""
    chain, cur = [], e
    while cur is not None and len(chain) < 20:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    name = None
    for c in chain:
        m = _TRANSLATE_RE.search(str(c))
        if m:
            name = m.group(1)
            break
    root = chain[-1]
    reason = f"{type(root).__name__}: {str(root).strip().splitlines()[0] if str(root).strip() else ''}"
    nodes = {n.name: n for g in (ep, work) if g is not None for n in g.graph.nodes}
    node = nodes.get(name) if name else None
    if node is None:
        return ExportError(f"onnxruntime: the partition ({sum(n.op == 'call_function' for n in ep.graph.nodes)} "
                           f"ops) could not be exported to ONNX: {reason}")
    loc = source_location(node.meta.get("stack_trace"))
    return ExportError(f"onnxruntime: cannot export op {op_name(node.target)} (node '{node.name}', debug handle "
                       f"{get_debug_handle(node)}) to ONNX: {reason}"
                       + (f"\n  source: {loc}" if loc else "")
                       + "\n  (OrtPartitioner(fallback_unsupported=True) or exclude_ops=[...] leaves it to the "
                         "portable backend)")


# ----------------------------------------------------------------------------------------------
# Debug tables
# ----------------------------------------------------------------------------------------------

def _fx_of_value(name: str, fx: dict[str, torch.fx.Node]) -> torch.fx.Node | None:
    n = fx.get(name)
    if n is not None:
        return n
    m = _MULTI_OUT_RE.fullmatch(name)
    return fx.get(m.group(1)) if m else None


def _fx_of_onnx_node(node: Any, fx: dict[str, torch.fx.Node]) -> torch.fx.Node | None:
    meta = node.metadata_props.get("pkg.torch.onnx.fx_node")
    if meta:
        m = _FX_NODE_RE.match(meta)
        if m and m.group(1) in fx:
            return fx[m.group(1)]
    for v in node.outputs:
        n = _fx_of_value(v.name, fx) if v.name else None
        if n is not None:
            return n
    return None


def _handles(n: torch.fx.Node | None) -> list[int]:
    if n is None:
        return []
    h = get_debug_handle(n)
    return [h] if h is not None else []


def _value_name(n: torch.fx.Node, produced: dict[str, int]) -> str | None:
    """The ONNX value holding the output of FX node ``n`` (None when no ONNX node produces it)."""
    cands = [n.name]
    if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node):
        cands.append(f"{n.args[0].name}__{n.args[1]}")
    elif isinstance(n.meta.get("val"), (list, tuple)):
        cands.append(f"{n.name}__0")
    return next((c for c in cands if c in produced), None)


def _fx_val(name: str, fx: dict[str, torch.fx.Node]) -> Any:
    """The FX value (meta ``val``) behind ONNX value ``name`` (None when unknown)."""
    n = fx.get(name)
    if n is not None:
        return n.meta.get("val")
    m = _MULTI_OUT_RE.fullmatch(name)
    n = fx.get(m.group(1)) if m else None
    val = n.meta.get("val") if n is not None else None
    return val[int(m.group(2))] if isinstance(val, (list, tuple)) and int(m.group(2)) < len(val) else None


def dim_spec(size: Any) -> int | str:
    """A dim as the blob records it: the int, or the symbolic size as sympy prints it (``"s27"``, ``"2*s27"``)."""
    return size if isinstance(size, int) else str(size.node.expr)


def _upper(size: Any, ranges: dict) -> int | None:
    """The largest value of a dim within ``ranges`` (the program's ``range_constraints``); None: unbounded."""
    if isinstance(size, int):
        return size
    from torch.utils._sympy.value_ranges import bound_sympy

    return _finite(bound_sympy(size.node.expr, ranges).upper)


def _finite(x: Any) -> int | None:
    """``x`` as an int; None for (torch's or sympy's) infinities."""
    import sympy
    from torch.utils._sympy.numbers import int_oo

    if x in (int_oo, -int_oo, sympy.oo, -sympy.oo):
        return None
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def symbol_bounds(ep: ExportedProgram) -> dict[str, list[int | None]]:
    """``{symbol: [min, max]}`` of every dynamic dim symbol of ``ep`` (None: unbounded)."""
    return {str(k): [_finite(v.lower), _finite(v.upper)] for k, v in ep.range_constraints.items()}


def _debug_value_info(model: Any, work: ExportedProgram, names: set[str]) -> tuple[dict[str, Any], int | None]:
    """``{name: {dtype, shape}}`` of the exposed values (dims as ``dim_spec``, from the FX values the ONNX
    values are named after) and the debug-buffer bytes they take in the largest run (every dynamic dim at its
    upper bound, sized by ``formats.alignment.debug_bytes``; None when a shape or a bound is unknown)."""
    fx = {n.name: n for n in work.graph.nodes}
    ranges = dict(work.range_constraints)
    info: dict[str, Any] = {}
    total: int | None = 0
    for node in model.graph:
        for v in node.outputs:
            if v.name not in names or v.name in info:
                continue
            val = _fx_val(v.name, fx)
            dtype = np.dtype(v.dtype.numpy()) if v.dtype is not None else None
            if dtype is None and isinstance(val, torch.Tensor):
                dtype = torch.empty(0, dtype=val.dtype).numpy().dtype
            shape = list(val.shape) if isinstance(val, torch.Tensor) else None
            if shape is None and v.shape is not None and all(isinstance(d, int) for d in v.shape):
                shape = [int(d) for d in v.shape]
            info[v.name] = {"dtype": dtype.str if dtype is not None else None,
                            "shape": [dim_spec(d) for d in shape] if shape is not None else None}
            uppers = [_upper(d, ranges) for d in shape] if shape is not None else [None]
            if total is not None and dtype is not None and None not in uppers:
                total += alignment.debug_bytes([math.prod(uppers) * dtype.itemsize])
            else:
                total = None
    return info, total


def build_debug_tables(model: Any, work: ExportedProgram) -> dict[str, Any]:
    """Value/node name -> edge handle tables and the values to expose in debug runs.

    An edge op group (the edge nodes sharing a debug handle, all decomposed from one source op) is logged
    through its *terminal* nodes: those whose output leaves the group (read by another group or returned by
    the partition), e.g. the three outputs of ``unbind`` or the ``getitem`` of ``native_layer_norm``. Each
    group is one entry of ``groups``: ``[delegate debug id, [ONNX value names]]`` (the id is its first value's
    name), in ONNX execution order; ``values`` maps each id to the group's handle and ``intermediates`` lists
    every value to expose; ``shapes`` gives their dtypes and (symbolic) shapes, ``debug_bytes`` the bytes they
    take in the debug buffer in the largest run. Sizes (SymInt nodes of dynamic shapes) are never logged.
    """
    fx = {n.name: n for n in work.graph.nodes}
    graph = model.graph
    produced: dict[str, int] = {}
    for i, node in enumerate(graph):
        for v in node.outputs:
            if v.name:
                produced.setdefault(v.name, i)
    terminals: dict[int, list[str]] = {}
    for n in work.graph.nodes:
        h = get_debug_handle(n) if n.op == "call_function" and _has_tensor(n) else None
        if h is None or not any(u.op == "output" or get_debug_handle(u) != h for u in n.users):
            continue
        name = _value_name(n, produced)
        if name is not None and name not in terminals.setdefault(h, []):
            terminals[h].append(name)
    groups = sorted(((names[0], names, h) for h, names in terminals.items() if names),
                    key=lambda g: max(produced[v] for v in g[1]))
    node_handles: dict[str, list[int]] = {}
    n_values = by_name = by_meta = 0
    for node in graph:
        hs = _handles(_fx_of_onnx_node(node, fx))
        if node.name and hs:
            node_handles[node.name] = hs
        for v in node.outputs:
            if not v.name:
                continue
            n_values += 1
            if _fx_of_value(v.name, fx) is not None:
                by_name += 1
            elif hs:
                by_meta += 1
    exposed = {v for _, names, _ in groups for v in names}
    shapes, debug_bytes = _debug_value_info(model, work, exposed)
    handles = {get_debug_handle(n) for n in work.graph.nodes if n.op == "call_function"} - {None}
    stats = {"onnx_nodes": len(graph), "onnx_values": n_values, "values_named_after_fx_nodes": by_name,
             "values_mapped_by_node_metadata": by_meta, "nodes_mapped": len(node_handles),
             "edge_handles": len(handles), "edge_handles_logged": len(groups)}
    return {"values": {gid: [h] for gid, _, h in groups}, "groups": [[gid, names] for gid, names, _ in groups],
            "intermediates": [v for _, names, _ in groups for v in names], "nodes": node_handles, "stats": stats,
            "shapes": shapes, "debug_bytes": debug_bytes}


def _has_tensor(n: torch.fx.Node) -> bool:
    v = n.meta.get("val")
    return isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple))
                                           and any(isinstance(t, torch.Tensor) for t in v))


# ----------------------------------------------------------------------------------------------
# Packing
# ----------------------------------------------------------------------------------------------

def _value_info(v: Any) -> dict[str, Any]:
    """Name, dtype and shape of a graph input/output: int dims, the ``dim_param`` of dynamic ones (-1: none)."""
    dims = None
    if v.shape is not None:
        dims = [int(d) if isinstance(d, int) else (str(d.value) if getattr(d, "value", None) else -1)
                for d in v.shape]
    return {"name": v.name, "dtype": np.dtype(v.dtype.numpy()).str, "shape": dims}


def _externalize(model: Any) -> list[tuple[str, np.ndarray]]:
    """Moves every large initializer's data out of the model (marked external); returns name -> array."""
    import onnx_ir as ir

    out = []
    for name, value in model.graph.initializers.items():
        t = value.const_value
        if t is None or t.nbytes < EXTERNAL_MIN_BYTES:
            continue
        try:
            arr = t.numpy()
        except Exception:  # noqa: BLE001 - a dtype numpy cannot hold stays inline
            continue
        if arr.dtype.kind not in "biuf" or arr.dtype.itemsize != t.dtype.itemsize:
            continue
        value.const_value = ir.ExternalTensor(_blob.EXTERNAL_LOCATION, 0, arr.nbytes, t.dtype,
                                              shape=ir.Shape(list(arr.shape)), name=name)
        out.append((name, arr))
    return out


#: ONNX ops whose trailing outputs are optional (MaxPool indices, LayerNormalization mean/inv-std-dev, ...)
_OPTIONAL_OUTPUT_OPS = frozenset({"MaxPool", "BatchNormalization", "LayerNormalization", "Dropout"})


def _trim_unused_outputs(proto: Any) -> None:
    """Drops trailing optional outputs nothing reads. ORT keeps them otherwise, and an extra output blocks its
    layout optimizations: ResNet-18's MaxPool with its unused indices ran in 6.3 ms instead of 0.25 ms."""
    read = {o.name for o in proto.graph.output}
    for n in proto.graph.node:
        read.update(n.input)
    for n in proto.graph.node:
        if n.op_type in _OPTIONAL_OUTPUT_OPS and n.domain in ("", "ai.onnx"):
            k = len(n.output)
            while k > 1 and n.output[k - 1] not in read:
                k -= 1
            del n.output[k:]


#: ONNX ops whose (first) output has the element type of their first input
_SAME_TYPE_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Slice", "Expand", "Concat",
                            "Flatten", "Neg", "Abs", "Relu", "Add", "Sub", "Mul", "Div", "Sqrt", "Gather", "Split"})


def _value_types(model: Any) -> dict[str, int]:
    """ONNX element type of every value whose type the exporter recorded or that a type-preserving op
    (``_SAME_TYPE_OPS``) makes from a typed input."""
    types: dict[str, int] = {}
    for v in [*model.graph.inputs, *model.graph.initializers.values()]:
        if v.dtype is not None:
            types[v.name] = int(v.dtype)
    for node in model.graph:
        for v in node.outputs:
            if v.dtype is not None:
                types[v.name] = int(v.dtype)
            elif node.op_type in _SAME_TYPE_OPS and node.inputs and node.inputs[0] is not None \
                    and node.inputs[0].name in types:
                types[v.name] = types[node.inputs[0].name]
    return types


def _castlike_to_cast(proto: Any, types: dict[str, int]) -> None:
    """``CastLike(x, like)`` -> ``Cast(x, to=dtype of like)`` where that dtype is known. torchlib casts its
    constants with CastLike of an activation, which stops ORT folding them (and then fusing: Gelu, scaled
    MatMul); a Cast of a constant folds."""
    import onnx

    for n in proto.graph.node:
        if n.op_type == "CastLike" and n.domain in ("", "ai.onnx") and len(n.input) == 2 and types.get(n.input[1]):
            to = types[n.input[1]]
            n.op_type = "Cast"
            del n.input[1]
            del n.attribute[:]
            n.attribute.append(onnx.helper.make_attribute("to", to))


def _read_transposed(gemm: Any, i: int, weight: str) -> None:
    """Gemm input ``i`` (0: A, 1: B) reads ``weight`` where it read its transpose: flips transA/transB."""
    import onnx

    gemm.input[i] = weight
    flag = "transA" if i == 0 else "transB"
    attr = next((a for a in gemm.attribute if a.name == flag), None)
    if attr is None:
        gemm.attribute.append(onnx.helper.make_attribute(flag, 1))
    else:
        attr.i = 1 - attr.i


def _fold_weight_transposes(proto: Any, keep: set[str]) -> list[str]:
    """``Gemm(x, Transpose(W))`` -> ``Gemm(x, W, transB=1)`` (and likewise for A) where ``W`` is a 2-D
    initializer whose transpose only Gemms read and no debug run exposes (``keep``). ORT would constant-fold
    each such transpose into a full copy of the weight in every session (ViT-B/16: 330 MB per session).
    Returns the names of the removed Transpose nodes."""
    g = proto.graph
    rank2 = {t.name for t in g.initializer if len(t.dims) == 2}
    readers: dict[str, list[tuple[Any, int]]] = {}
    for n in g.node:
        for i, v in enumerate(n.input):
            readers.setdefault(v, []).append((n, i))
    outputs = {o.name for o in g.output} | keep
    dead: set[int] = set()
    for t in g.node:
        perm = next((list(a.ints) for a in t.attribute if a.name == "perm"), [1, 0])
        if t.op_type != "Transpose" or t.input[0] not in rank2 or perm != [1, 0] or t.output[0] in outputs:
            continue
        users = readers.get(t.output[0], [])
        if not users or any(u.op_type != "Gemm" or i > 1 for u, i in users):
            continue
        for u, i in users:
            _read_transposed(u, i, t.input[0])
        dead.add(id(t))
    removed = [n.name for n in g.node if id(n) in dead]
    if dead:
        nodes = [n for n in g.node if id(n) not in dead]
        del g.node[:]
        g.node.extend(nodes)
    return removed


def _externalize_inline(proto: Any, external: list[tuple[str, np.ndarray]]) -> None:
    """Moves the large initializers the ONNX rewrites added inline (``MatMulNBits`` scales: 0.75 MiB per llama_100m
    layer) out of the ModelProto, like ``_externalize``, so they too can be named data shared by every method."""
    from onnx import TensorProto, numpy_helper

    for t in proto.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL or len(t.raw_data) < EXTERNAL_MIN_BYTES:
            continue
        arr = numpy_helper.to_array(t)
        if arr.dtype.kind not in "biuf":
            continue
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", _blob.EXTERNAL_LOCATION), ("offset", "0"), ("length", str(arr.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        external.append((t.name, arr))


def _named_min_bytes(specs: dict[str, str]) -> int:
    raw = specs["named_data_min_bytes"]
    try:
        value = int(raw)
    except ValueError:
        raise ExportError(f"onnxruntime: compile spec named_data_min_bytes={raw!r} is not an integer") from None
    return value if value >= 0 else 1 << 62  # negative: every weight stays in the blob


def lower_partition(ep: ExportedProgram, specs: dict[str, str],
                    named: dict[str, bytes] | None = None) -> tuple[bytes, dict[str, Any]]:
    """Exports a partition and packs the blob; returns it and its header. With ``named`` (filled here), the
    weights of at least ``named_data_min_bytes`` go to the program's named data (``_blob.pack``)."""
    import onnx_ir as ir

    t0 = time.perf_counter()
    work = None
    try:
        model, work = export_to_onnx(ep, exporter=specs["exporter"], optimize=specs["onnx_optimize"] == "1")
    except ExportError:
        raise
    except Exception as e:
        raise _export_error(ep, work, e) from e
    t1 = time.perf_counter()
    user_in = list(ep.graph_signature.user_inputs)
    user_out = list(ep.graph_signature.user_outputs)
    inputs = [_value_info(v) for v in model.graph.inputs]
    outputs = [_value_info(v) for v in model.graph.outputs]
    if len(inputs) != len(user_in) or len(outputs) != len(user_out):
        raise ExportError(f"onnxruntime: the ONNX model has {len(inputs)} inputs / {len(outputs)} outputs, the "
                          f"partition {len(user_in)} / {len(user_out)}; cannot bind them")
    tables = build_debug_tables(model, work)
    external = _externalize(model)
    types = _value_types(model)
    proto = ir.serde.serialize_model(model)
    _trim_unused_outputs(proto)
    _castlike_to_cast(proto, types)
    fuse_gelu(proto)
    lower_lowbit_nodes(proto, external, specs["lowbit_dynamic_compute"])
    for name in _fold_weight_transposes(proto, set(tables["intermediates"])):
        tables["nodes"].pop(name, None)
    _externalize_inline(proto, external)
    strip_node_metadata(proto.graph)  # the debug tables above hold what the runtime needs of it
    model_bytes = proto.SerializeToString()
    header = {
        "format": "edgetorch.onnxruntime",
        "producer": {"torch": torch.__version__, "onnx_ir": getattr(ir, "__version__", "")},
        "opset": {d: v for d, v in model.opset_imports.items()},
        "inputs": inputs, "outputs": outputs,
        "values": tables["values"], "groups": tables["groups"], "nodes": tables["nodes"],
        "intermediates": tables["intermediates"], "stats": tables["stats"], "debug_bytes": tables["debug_bytes"],
        "shapes": tables["shapes"], "dims": symbol_bounds(ep),
    }
    blob = _blob.pack(header, model_bytes, external, named, _named_min_bytes(specs))
    log.info("onnxruntime: partition of %d ops exported in %.2fs, packed in %.2fs (%d bytes, %d ONNX nodes)",
             sum(n.op == "call_function" for n in ep.graph.nodes), t1 - t0, time.perf_counter() - t1, len(blob),
             tables["stats"]["onnx_nodes"])
    return blob, header


@register_backend_details
class OrtBackend(BackendDetails):
    """``preprocess``: partition -> ONNX model + weights + debug tables in one blob (see ``_blob``).

    The debug handle map has two kinds of keys (strings): ONNX value names (the delegate debug ids of the
    intermediate outputs logged in debug runs) and ONNX node names (the ids of per-op profile events).
    """

    backend_id = BACKEND_ID

    @classmethod
    def preprocess(cls, edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        specs = compile_spec_dict(compile_specs)
        named: dict[str, bytes] = {}
        blob, header = lower_partition(edge_program, specs, named)
        dmap: dict[int | str, tuple[int, ...]] = {}
        for name, hs in header["nodes"].items():
            dmap[name] = tuple(hs)
        for name, hs in header["values"].items():
            dmap[name] = tuple(sorted(set(dmap.get(name, ())) | set(hs)))
        store = NamedDataStore()
        for key, data in named.items():
            store.add_named_data(key, data)
        return PreprocessResult(blob, dmap, debug_buffer_bytes=header["debug_bytes"],
                                data_store_output=store if store.data else None)
