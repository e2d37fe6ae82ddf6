"""``ExportPass``: the reference's base class for passes written as an interpreter over a graph, where a
subclass overrides ``call_operator(op, args, kwargs, meta)`` and calls ``super().call_operator(...)`` to emit
the op it wants (the same op, another, or several composed)::

    class ReplaceAddWithMul(ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op != exir_ops.edge.aten.add.Tensor:
                return super().call_operator(op, args, kwargs, meta)
            return super().call_operator(exir_ops.edge.aten.mul.Tensor, args, kwargs, meta)

    edge = edge.transform([ReplaceAddWithMul()])

The pass rebuilds the graph node by node: placeholders, attributes, ``getitem``s and the output are copied;
every operator call goes through ``call_operator`` with the arguments already rebuilt (fx nodes of the new
graph) and ``meta`` (``NodeMetadata``, a copy of the original node's metadata: its debug handle, stack trace and
module stack go to every node emitted for it). An emitted node's ``val`` (shape, dtype) is computed by running
the op on its arguments' values in their fake mode. The graph module is rewritten in place (``transform``'s
contract) and ``__call__`` returns ``PassResult(graph_module, modified)``.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import torch
from torch.fx.node import map_arg

from edgetorch.errors import ExportError

__all__ = ["PassResult", "NodeMetadata", "ExportPass"]


class PassResult(NamedTuple):
    graph_module: torch.fx.GraphModule
    modified: bool


class NodeMetadata:
    """A node's metadata as ``call_operator`` receives it (``meta["stack_trace"]``, ``meta.data``)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


def _val(x: Any) -> Any:
    return map_arg(x, lambda n: n.meta.get("val"))


class ExportPass:
    """See the module docstring."""

    def __init__(self) -> None:
        self._graph: torch.fx.Graph | None = None
        self._modified = False

    def call_operator(self, op: Any, args: tuple, kwargs: dict[str, Any], meta: NodeMetadata) -> torch.fx.Node:
        """Emits ``op(*args, **kwargs)`` into the new graph with ``meta`` and returns its node."""
        if self._graph is None:
            raise ExportError("ExportPass.call_operator is called by the pass while it runs, not directly")
        node = self._graph.call_function(op, tuple(args), dict(kwargs))
        node.meta.update({k: v for k, v in meta.data.items() if k != "val"})
        node.meta["val"] = self._fake_value(op, args, kwargs, meta)
        return node

    def _fake_value(self, op: Any, args: tuple, kwargs: dict[str, Any], meta: NodeMetadata) -> Any:
        vals, kvals = _val(tuple(args)), _val(dict(kwargs))
        leaves = [v for v in torch.utils._pytree.tree_leaves((vals, kvals)) if isinstance(v, torch.Tensor)]
        mode = torch._guards.detect_fake_mode(leaves)
        try:
            if mode is None:
                return op(*vals, **kvals)
            with mode:
                return op(*vals, **kvals)
        except Exception as e:  # the op does not accept what the pass gives it
            raise ExportError(f"ExportPass {type(self).__name__}: {op} cannot run on the arguments the pass "
                              f"gives it ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        """Rebuilds ``graph_module``'s graph through ``call_operator`` (in place)."""
        old, new = graph_module.graph, torch.fx.Graph()
        env: dict[torch.fx.Node, Any] = {}
        self._graph = new
        try:
            for n in old.nodes:
                if n.op == "call_function" and n.target is not operator.getitem:
                    args = map_arg(n.args, lambda a: env[a])
                    kwargs = map_arg(n.kwargs, lambda a: env[a])
                    out = self.call_operator(n.target, args, kwargs, NodeMetadata(n.meta))
                    self._modified |= not (isinstance(out, torch.fx.Node) and out.target is n.target)
                    env[n] = out
                else:
                    env[n] = new.node_copy(n, lambda a: env[a])
        finally:
            self._graph = None
        graph_module.graph = new
        graph_module.recompile()
        return PassResult(graph_module, self._modified)

    def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult:
        self._modified = False
        return self.call(graph_module)
