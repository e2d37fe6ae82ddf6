"""``torch.cond`` in a reference graph: the branch the reference takes on the recorded inputs, inlined.

The runtime runs one branch of a cond and logs only its ops; the reference graph holds both branches inside a
``higher_order.cond`` node, which an ``fx.Interpreter`` runs as one opaque call. ``inline_taken_branches``
evaluates each cond's predicate on the inputs and returns a graph where every cond node is replaced by the ops of
the branch taken (with their debug handles), nested conds included. The gap walk then computes a reference
value per branch op like for any op, and the branch that did not run is simply not in the graph: no row, no
"unmatched" entry for it. A graph without cond is returned as it is (no extra run).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from edgetorch.devtools.inspector._graph_writes import written_in_place
from edgetorch.errors import ETRecordFormatError, ExportError
from edgetorch.exir.control_flow import branches_of, is_cond

__all__ = ["has_cond", "inline_taken_branches"]


def has_cond(gm: torch.fx.GraphModule) -> bool:
    return any(is_cond(n) for n in gm.graph.nodes)


class _Preds(torch.fx.Interpreter):
    """Runs the graph until its last cond node, keeping each cond's predicate."""

    def __init__(self, gm: torch.fx.GraphModule, stop: torch.fx.Node) -> None:
        super().__init__(gm)
        self.stop = stop
        self.preds: dict[torch.fx.Node, bool] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if is_cond(n):
            p = self.env[n.args[0]] if isinstance(n.args[0], torch.fx.Node) else n.args[0]
            try:
                self.preds[n] = bool(p.reshape(()).item() if isinstance(p, torch.Tensor) else p)
            except (RuntimeError, ValueError) as e:
                raise ETRecordFormatError(f"the reference graph's cond node '{n.name}' has a predicate that is not "
                                          f"one bool ({e})", field=f"reference graph node {n.name}") from None
            if n is self.stop:
                raise _Stop()
        try:
            return super().run_node(n)
        except (RuntimeError, TypeError, ValueError, IndexError) as e:  # a hostile or corrupted reference graph
            raise ETRecordFormatError(f"the reference graph's node '{n.name}' fails on the values its arguments name "
                                      f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})",
                                      field=f"reference graph node {n.name}") from None


class _Stop(Exception):
    pass


def _predicates(gm: torch.fx.GraphModule, inputs: tuple) -> dict[torch.fx.Node, bool]:
    """Each top-level cond's predicate on ``inputs``; the attributes in-place ops write are restored after."""
    stop = [n for n in gm.graph.nodes if is_cond(n)][-1]
    saved = []
    for n in written_in_place(gm):
        if n.op == "get_attr" and isinstance(getattr(gm, str(n.target), None), torch.Tensor):
            saved.append((str(n.target), getattr(gm, str(n.target))))
            setattr(gm, str(n.target), saved[-1][1].detach().clone())
    walk = _Preds(gm, stop)
    try:
        with torch.no_grad():
            walk.run(*inputs)
    except _Stop:
        pass
    finally:
        for name, t in saved:
            setattr(gm, name, t)
    return walk.preds


def _inline_once(gm: torch.fx.GraphModule, preds: dict[torch.fx.Node, bool]) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    owner: dict[str, Any] = {}  # get_attr target -> the object (nested branch modules under new names)
    for n in gm.graph.nodes:
        if is_cond(n):
            env[n] = _inline_branch(g, _branches(n)[0 if preds[n] else 1], n, env, owner)
        elif n.op == "call_function" and n.target is operator.getitem and n.args[0] in env \
                and isinstance(env[n.args[0]], tuple):
            env[n] = env[n.args[0]][n.args[1]]
        elif n.op == "get_attr" and n.users and all(is_cond(u) for u in n.users):
            continue  # a branch module: inlined
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
    for n in g.nodes:
        if n.op in ("get_attr", "call_module") and n.target not in owner:
            owner[n.target] = _attr(gm, str(n.target))
    new = torch.fx.GraphModule(owner, g)
    new.meta.update(gm.meta)
    return new


def _branches(n: torch.fx.Node) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    try:
        return branches_of(n)
    except ExportError as e:
        raise ETRecordFormatError(f"the reference graph's {e}", field=f"reference graph node {n.name}") from None


def _attr(m: Any, target: str) -> Any:
    for part in target.split("."):
        m = getattr(m, part)
    return m


def _inline_branch(g: torch.fx.Graph, sub: torch.fx.GraphModule, cond: torch.fx.Node, env: dict,
                   owner: dict[str, Any]) -> tuple:
    """Copies ``sub``'s nodes into ``g`` with its placeholders bound to the cond's operands; returns its outputs.
    Nested conds keep pointing at their branch modules, registered on the new graph's module."""
    operands = [env[a] for a in cond.args[3]]
    local: dict[torch.fx.Node, Any] = {}
    phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(operands):
        raise ETRecordFormatError(f"the reference graph's cond node '{cond.name}' passes {len(operands)} operands to "
                                  f"a branch taking {len(phs)}", field=f"reference graph node {cond.name}")
    for ph, v in zip(phs, operands):
        local[ph] = v
    out: tuple = ()
    for n in sub.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            res = n.args[0]
            out = tuple(local[r] for r in (res if isinstance(res, (list, tuple)) else [res]))
        elif n.op == "get_attr":
            name = f"_inlined_{cond.name}_{n.target}".replace(".", "_")
            owner[name] = _attr(sub, str(n.target))
            local[n] = g.get_attr(name)
        else:
            local[n] = g.node_copy(n, lambda a: local[a])
    return out


def inline_taken_branches(gm: torch.fx.GraphModule, inputs: tuple) -> torch.fx.GraphModule:
    """``gm`` with each cond replaced by the ops of the branch its predicate takes on ``inputs`` (recursively);
    ``gm`` itself when it has no cond."""
    for _ in range(64):  # nesting depth
        if not has_cond(gm):
            return gm
        gm = _inline_once(gm, _predicates(gm, inputs))
    raise ETRecordFormatError("the reference graph nests torch.cond more than 64 deep", field="reference graph")
