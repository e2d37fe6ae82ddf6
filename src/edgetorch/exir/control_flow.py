"""``torch.cond`` on the compiler side: finding the branches, checking them and emitting them inline.

A ``torch.cond(pred, true_fn, false_fn, operands)`` exports as a ``higher_order.cond`` node whose branches are
``GraphModule`` attributes of the graph that holds it (read by ``get_attr`` nodes). Nothing here rewrites the
graph: the verifier walks the branches (``branches_of``, ``verify_cond``) and emission inlines both of them into
the method's one instruction list, as the reference does:

```
JUMP_FALSE pred -> F          # pred: a one-element bool tensor, or a SymBool of the input shapes
<true branch>                 # the branch's placeholders are the operands' own values
MOVE true_out_i -> out_i      # a copy into the cond's own planned outputs
JUMP_FALSE False -> END       # unconditional
F: <false branch>
MOVE false_out_i -> out_i
END:
```

Memory is planned on that linear order: a branch's values live inside it, the cond's outputs from the first move
to their last use, its operands until the last use in either branch, so both branches' values are valid
whichever runs (forward jumps only: every path is a subsequence of the linear order). A ``SymBool`` predicate
(``x.shape[0] > 4`` with a dynamic dim) becomes a ``SymInt`` expression worth 0 or 1 (``sym_bool_expr``), which
the runtime evaluates from the input shapes like any size.
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch

from edgetorch.errors import ExportError, UnsupportedOpError
from edgetorch.formats import program as pf
from edgetorch.formats import symexpr

__all__ = ["COND", "is_cond", "branches_of", "is_branch_attr", "cond_submodules", "control_flow_graphs",
           "unique_branch_names", "sym_bool_expr", "SYM_BOOL_TARGETS", "emit_sym_bool", "emit_cond"]

COND = torch.ops.higher_order.cond

#: size comparisons a SymBool predicate is computed with (the runtime evaluates them from the input shapes)
SYM_BOOL_TARGETS = {operator.gt, operator.ge, operator.lt, operator.le, operator.eq, operator.ne, operator.and_,
                    operator.or_, operator.not_, torch.sym_not}


def is_cond(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is COND


def _attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in str(target).split("."):
        obj = getattr(obj, part, None)
    return obj


def branches_of(node: torch.fx.Node) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The true and false branch modules of a cond node (``ExportError`` when they are not graph modules)."""
    owner = node.graph.owning_module
    out = []
    for a in node.args[1:3]:
        sub = _attr(owner, a.target) if isinstance(a, torch.fx.Node) and a.op == "get_attr" else None
        if not isinstance(sub, torch.fx.GraphModule):
            raise ExportError(f"cond node '{node.name}': branch {a} is not a graph module held by the graph")
        out.append(sub)
    return out[0], out[1]


def is_branch_attr(node: torch.fx.Node) -> bool:
    """A ``get_attr`` node that only hands a branch module to cond nodes."""
    return node.op == "get_attr" and bool(node.users) and all(
        is_cond(u) and node in u.args[1:3] for u in node.users)


def cond_submodules(gm: torch.fx.GraphModule) -> list[torch.fx.GraphModule]:
    """The branch modules of ``gm``'s cond nodes, nested ones included, breadth first (the reference's order)."""
    out, queue, seen = [], [gm], {id(gm)}
    while queue:
        g = queue.pop(0)
        for n in g.graph.nodes:
            if is_cond(n):
                for sub in branches_of(n):
                    if id(sub) not in seen:
                        seen.add(id(sub))
                        out.append(sub)
                        queue.append(sub)
    return out


def control_flow_graphs(gm: torch.fx.GraphModule) -> list[torch.fx.GraphModule]:
    """``gm`` itself, then every branch module of its conds (breadth first)."""
    return [gm, *cond_submodules(gm)]


def unique_branch_names(gm: torch.fx.GraphModule) -> None:
    """Renames the nodes of ``gm``'s cond branches whose names another graph of the program uses (both branches
    of a cond often hold an ``add``): a runtime event names its node, so one name must mean one node."""
    taken = {n.name for n in gm.graph.nodes}
    for sub in cond_submodules(gm):
        own = {n.name for n in sub.graph.nodes}
        for n in sub.graph.nodes:
            if n.name in taken and n.op not in ("placeholder", "output"):
                k = 1
                while f"{n.name}_{k}" in taken or f"{n.name}_{k}" in own:
                    k += 1
                n._rename(f"{n.name}_{k}")
                own.add(n.name)
            taken.add(n.name)
        sub.recompile()


# -- SymBool predicates -----------------------------------------------------------------------------
def _clamp01(d: symexpr.Expr) -> symexpr.Expr:
    return ["min", ["max", d, 0], 1]


def _neg(e: symexpr.Expr) -> symexpr.Expr:
    return ["*", -1, e]


def sym_bool_expr(table: Any, e: Any, what: str) -> symexpr.Expr:
    """A size expression worth 1 where the sympy boolean ``e`` (over the method's symbols) holds, else 0:
    ``a > b`` is ``min(max(a - b, 0), 1)`` on integers; ``and`` / ``or`` / ``not`` are ``min`` / ``max`` /
    ``1 - x``. ``table`` is the method's ``exir.symbolic.SymbolTable``."""
    if isinstance(e, torch.SymBool):
        e = e.node.expr
    if isinstance(e, bool) or e in (sympy.true, sympy.false):
        return int(bool(e))
    rel = {sympy.StrictGreaterThan: (0, 0), sympy.GreaterThan: (0, 1), sympy.StrictLessThan: (1, 0),
           sympy.LessThan: (1, 1)}
    for cls, (swap, plus) in rel.items():
        if isinstance(e, cls):
            a, b = (e.rhs, e.lhs) if swap else (e.lhs, e.rhs)
            return _clamp01(["+", table.encode(a, what), _neg(table.encode(b, what)), plus])
    if isinstance(e, (sympy.Eq, sympy.Ne)):
        a, b = table.encode(e.lhs, what), table.encode(e.rhs, what)
        differs = ["+", _clamp01(["+", a, _neg(b)]), _clamp01(["+", b, _neg(a)])]
        return differs if isinstance(e, sympy.Ne) else ["+", 1, _neg(differs)]
    if isinstance(e, sympy.And):
        return ["min", *(sym_bool_expr(table, x, what) for x in e.args)]
    if isinstance(e, sympy.Or):
        return ["max", *(sym_bool_expr(table, x, what) for x in e.args)]
    if isinstance(e, sympy.Not):
        return ["+", 1, _neg(sym_bool_expr(table, e.args[0], what))]
    raise UnsupportedOpError(f"{what}: the symbolic predicate {e} is not a comparison of sizes the runtime can "
                             "evaluate")


# -- emission -----------------------------------------------------------------------------------------
def _pred_value(em: Any, pred: Any, node: torch.fx.Node) -> int:
    what = f"method '{em.name}': cond node '{node.name}' predicate"
    if isinstance(pred, torch.fx.Node):
        val = pred.meta.get("val")
        if isinstance(val, torch.Tensor):
            if val.dtype != torch.bool or val.numel() != 1:
                raise ExportError(f"{what} is a {val.dtype} tensor of shape {tuple(val.shape)}; expected one bool")
            vid = em._node_tensor(pred)
            em.use(vid, len(em.instructions))
            return vid
        return em.node_values[pred]  # a SymBool, emitted as a 0/1 SymInt (emit_sym_bool)
    if isinstance(pred, (bool, torch.SymBool)):
        return emit_sym_bool(em, pred, what)
    raise ExportError(f"{what} is a {type(pred).__name__}; expected a bool tensor or a SymBool")


def emit_sym_bool(em: Any, val: Any, what: str) -> int:
    """The value of a SymBool (or a bool): a 0/1 ``SymInt`` over the method's symbols, or a plain int."""
    e = sym_bool_expr(em.symbols, val, what)
    return em.add_value(e if isinstance(e, int) else pf.SymIntV(symexpr.dumps(e)))


def _emit_branch(em: Any, gm: torch.fx.GraphModule, operands: list[int], node: torch.fx.Node) -> list[int]:
    """Emits a branch's nodes with its placeholders bound to the operands' values; returns its output values."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(operands):
        raise ExportError(f"method '{em.name}': cond node '{node.name}' passes {len(operands)} operands to a branch "
                          f"taking {len(phs)}")
    for ph, vid in zip(phs, operands):
        em.node_values[ph] = vid
    out_node = None
    for n in gm.graph.nodes:
        if n.op == "output":
            out_node = n
        elif n.op != "placeholder":
            em.emit_node(n)
    res = out_node.args[0] if out_node is not None else ()
    return [em._node_tensor(r) for r in (res if isinstance(res, (list, tuple)) else [res])]


def _moves(em: Any, results: list[int], outs: list[int], node: torch.fx.Node) -> None:
    for r, o in zip(results, outs, strict=True):
        at = len(em.instructions)
        em.use(r, at)
        em.use(o, at)
        em.instructions.append(pf.InstructionDef(pf.MoveCallDef(r, o), node.name, 0, em._source(node)))


def emit_cond(em: Any, node: torch.fx.Node) -> None:
    """Emits a cond node inline (see the module docstring); ``em`` is emission's ``_MethodEmitter``."""
    pred, _, _, operands = node.args[:4]
    true_gm, false_gm = branches_of(node)
    pv = _pred_value(em, pred, node)
    ops = []
    for a in operands:
        if not isinstance(a, torch.fx.Node) or not isinstance(a.meta.get("val"), torch.Tensor):
            raise ExportError(f"method '{em.name}': cond node '{node.name}' operand {a} is not a tensor")
        ops.append(em._node_tensor(a))
    at = len(em.instructions)
    outs = em._new_outputs(node, pf.PLACEMENT_PLANNED, at)
    jump_false = pf.JumpFalseCallDef(pv, -1)
    em.instructions.append(pf.InstructionDef(jump_false, node.name, 0, em._source(node)))
    for vid in ops:  # the operands live through both branches
        em.use(vid, at)
    _moves(em, _emit_branch(em, true_gm, ops, node), outs, node)
    jump_end = pf.JumpFalseCallDef(em.add_value(False), -1)
    em.instructions.append(pf.InstructionDef(jump_end, node.name, 0, em._source(node)))
    jump_false.destination_instruction = len(em.instructions)
    _moves(em, _emit_branch(em, false_gm, ops, node), outs, node)
    jump_end.destination_instruction = len(em.instructions)
    for vid in ops:
        em.use(vid, len(em.instructions) - 1)
    em.node_values[node] = outs
