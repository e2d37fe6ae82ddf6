"""The edge verifier: rejects, naming node, op and source line, anything the runtime cannot execute."""

from __future__ import annotations

import operator

import torch
from torch.export import ExportedProgram

from edgetorch.errors import UnsupportedOpError
from edgetorch.exir.debug_handles import source_location

_IGNORED_TARGETS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten._assert_async.msg,
}


def _is_static_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape)


def _fail(node: torch.fx.Node, what: str, reason: str, method: str) -> None:
    where = source_location(node.meta.get("stack_trace"))
    raise UnsupportedOpError(
        f"method '{method}': node '{node.name}' ({what}) cannot run on the edgetorch runtime: {reason}"
        + (f"\n  source: {where}" if where else ""))


def _check_val(node: torch.fx.Node, what: str, method: str) -> None:
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    for v in vals:
        if v is None:
            continue
        if isinstance(v, torch.Tensor):
            if not _is_static_tensor(v):
                _fail(node, what, f"its output has a dynamic shape {tuple(v.shape)}; "
                      "edgetorch plans memory for static shapes only", method)
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            _fail(node, what, "it produces a symbolic scalar (dynamic shapes are not supported)", method)


def verify_edge_program(ep: ExportedProgram, method: str = "forward") -> None:
    """Raises ``UnsupportedOpError`` for the first node the runtime cannot execute."""
    sig = ep.graph_signature
    if getattr(sig, "buffers_to_mutate", None):
        names = ", ".join(sorted(sig.buffers_to_mutate.values()))
        raise UnsupportedOpError(f"method '{method}': the program mutates buffers ({names}); "
                                 "in-place buffer updates are not supported by the edgetorch runtime yet")
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            v = node.meta.get("val")
            if not isinstance(v, torch.Tensor):
                _fail(node, "input", f"non-tensor input of type {type(v).__name__} (only tensor inputs are "
                      "supported)", method)
            _check_val(node, "input", method)
        elif node.op == "get_attr":
            _fail(node, f"get_attr {node.target}", "submodules (control flow) are not supported", method)
        elif node.op == "call_function":
            t = node.target
            if t is operator.getitem:
                continue
            if not isinstance(t, torch._ops.OpOverload):
                _fail(node, str(t), "only ATen operators (OpOverload) can be executed; "
                      f"got {type(t).__name__}", method)
            if t in _IGNORED_TARGETS:
                continue
            if t._schema.is_mutable:
                _fail(node, str(t), "the op mutates its inputs in place", method)
            for r in t._schema.returns:
                if not isinstance(r.type, (torch.TensorType, torch.ListType)) and "Tensor" not in str(r.type):
                    _fail(node, str(t), f"it returns a non-tensor value ({r.type})", method)
            _check_val(node, str(t), method)
