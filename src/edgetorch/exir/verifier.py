"""The edge verifier: rejects, naming node, op and source line, anything the runtime cannot execute.

Accepted beyond plain tensor ops: bounded dynamic shapes (every symbol an input dim with a finite max; see
``exir.symbolic``), symbolic-int nodes (``sym_size``, ``operator.*``, ``torch.sym_*``) the runtime evaluates
from the input shapes, non-tensor user inputs (specialised constants or symbolic ints) and mutated buffers.
"""

from __future__ import annotations

import operator

import torch
from torch.export import ExportedProgram

from edgetorch.errors import UnsupportedOpError
from edgetorch.exir import control_flow as cf
from edgetorch.exir.backend.lowered import is_delegate_call
from edgetorch.exir.debug_handles import source_location

__all__ = ["verify_edge_program"]

_IGNORED_TARGETS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten._assert_async.msg,
}


_SCALARS = (bool, int, float, str, type(None))


def _unbounded(v: torch.Tensor, ranges: dict) -> list[str]:
    """Free symbols of a tensor's sizes that have no finite upper bound (or are data-dependent)."""
    bad = []
    for s in v.shape:
        if isinstance(s, torch.SymInt):
            for sym in s.node.expr.free_symbols:
                vr = ranges.get(sym)
                try:
                    ok = vr is not None and int(vr.upper) < (1 << 40)
                except Exception:  # sympy's infinities raise all sorts
                    ok = False
                if not ok:
                    bad.append(str(sym))
    return bad


def _fail(node: torch.fx.Node, what: str, reason: str, method: str) -> None:
    where = source_location(node.meta.get("stack_trace"))
    raise UnsupportedOpError(
        f"method '{method}': node '{node.name}' ({what}) cannot run on the edgetorch runtime: {reason}"
        + (f"\n  source: {where}" if where else ""))


def _check_val(node: torch.fx.Node, what: str, method: str, ranges: dict) -> None:
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    for v in vals:
        if isinstance(v, torch.Tensor):
            bad = _unbounded(v, ranges)
            if bad:
                _fail(node, what, f"its output has the dynamic shape {tuple(v.shape)} and {', '.join(bad)} has no "
                      "upper bound (a data-dependent size, or a torch.export.Dim without max); edgetorch plans "
                      "memory at the upper bounds", method)
        elif isinstance(v, (torch.SymFloat, torch.SymBool)):
            _fail(node, what, f"it produces a symbolic {type(v).__name__} (only symbolic ints are supported)",
                  method)


def verify_edge_program(ep: ExportedProgram, method: str = "forward") -> None:
    """Raises ``UnsupportedOpError`` for the first node the runtime cannot execute."""
    ranges = ep.range_constraints
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            v = node.meta.get("val")
            if not isinstance(v, (torch.Tensor, torch.SymInt, *_SCALARS)):
                _fail(node, "input", f"non-tensor input of type {type(v).__name__} (tensors, bool, int, float, "
                      "str and None are supported)", method)
            _check_val(node, "input", method, ranges)
        else:
            _check_node(node, method, ranges)


def _check_node(node: torch.fx.Node, method: str, ranges: dict) -> None:
    if node.op == "get_attr" and node.users and all(is_delegate_call(u) for u in node.users):
        return  # a lowered module (exir.backend.lowered), called by its delegate calls
    if node.op == "get_attr" and cf.is_branch_attr(node):
        return  # a cond's branch, checked with its cond
    if node.op == "get_attr":
        _fail(node, f"get_attr {node.target}", "only torch.cond branches and lowered modules may be submodules",
              method)
    elif node.op == "call_function" and cf.is_cond(node):
        _check_cond(node, method, ranges)
    elif node.op == "call_function":
        _check_call(node, method, ranges)


def _check_cond(node: torch.fx.Node, method: str, ranges: dict) -> None:
    """A cond: its predicate, operands and outputs, then each branch's nodes."""
    pred, _, _, operands = node.args[:4]
    pv = pred.meta.get("val") if isinstance(pred, torch.fx.Node) else pred
    if isinstance(pv, torch.Tensor) and (pv.dtype != torch.bool or pv.numel() != 1):
        _fail(node, "cond", f"its predicate is a {pv.dtype} tensor of shape {tuple(pv.shape)} (expected one bool)",
              method)
    if not isinstance(pv, (torch.Tensor, torch.SymBool, bool)):
        _fail(node, "cond", f"its predicate is a {type(pv).__name__} (expected a bool tensor or a SymBool)", method)
    for a in operands:
        if not isinstance(a, torch.fx.Node) or not isinstance(a.meta.get("val"), torch.Tensor):
            _fail(node, "cond", f"operand {a} is not a tensor (tensor operands only)", method)
    vals = node.meta.get("val")
    if not all(isinstance(v, torch.Tensor) for v in (vals if isinstance(vals, (list, tuple)) else [vals])):
        _fail(node, "cond", "it returns a non-tensor value", method)
    _check_val(node, "cond", method, ranges)
    for sub in cf.branches_of(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                _check_val(n, "branch input", method, ranges)
            elif n.op != "output":
                _check_node(n, method, ranges)


def _is_sym_bool(node: torch.fx.Node) -> bool:
    """A SymBool size comparison that only feeds cond predicates (or other such comparisons)."""
    return (isinstance(node.meta.get("val"), torch.SymBool) and node.target in cf.SYM_BOOL_TARGETS
            and all((cf.is_cond(u) and u.args[0] is node) or _is_sym_bool(u) for u in node.users))


def _check_call(node: torch.fx.Node, method: str, ranges: dict) -> None:
    t = node.target
    if t is operator.getitem or t in _IGNORED_TARGETS or is_delegate_call(node) or _is_sym_bool(node):
        return
    if isinstance(t, torch._ops.HigherOrderOperator):
        _fail(node, str(t), f"control flow other than torch.cond ({t.__name__}) is not supported", method)
    val = node.meta.get("val")
    if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
        return  # a size computation (sym_size, operator.mul, ...): evaluated by the runtime from input shapes
    if not isinstance(t, torch._ops.OpOverload):
        _fail(node, str(t), "only ATen operators (OpOverload) and size computations can be executed; "
              f"got {type(t).__name__} producing {type(val).__name__}", method)
    if t._schema.is_mutable:
        _fail(node, str(t), "the op mutates its inputs in place", method)
    for r in t._schema.returns:
        if not isinstance(r.type, (torch.TensorType, torch.ListType)) and "Tensor" not in str(r.type):
            _fail(node, str(t), f"it returns a non-tensor value ({r.type})", method)
    _check_val(node, str(t), method, ranges)
