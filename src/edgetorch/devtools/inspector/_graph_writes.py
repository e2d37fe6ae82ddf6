"""What a reference graph writes in place, and which of its ops allocate memory they leave uninitialised: the
facts the gap walk needs to keep each op's value as the op computed it."""

from __future__ import annotations

import torch
import torch.fx

#: ATen ops whose output holds whatever the memory held (``empty_like`` + ``copy_``, as in MoE experts): a value
#: no comparison can judge
_UNINITIALISED = frozenset({"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                            "new_empty_strided"})


def is_uninitialised(n: torch.fx.Node) -> bool:
    """Whether ``n`` allocates a tensor without writing it (``torch.empty*``, ``Tensor.new_empty*``)."""
    t = n.target
    return n.op == "call_function" and isinstance(t, torch._ops.OpOverload) and \
        t._schema.name.split("::")[-1] in _UNINITIALISED


def is_view(n: torch.fx.Node) -> bool:
    """Whether ``n`` is a view op (its output aliases its first argument)."""
    t = n.target
    if not isinstance(t, torch._ops.OpOverload):
        return False
    from edgetorch.exir.op_variants import is_view_op

    return is_view_op(t)


def written_in_place(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Nodes whose value an in-place op writes (the ``Tensor(a!)`` arguments: ``relu_``'s input, ``copy_``'s
    destination), not every argument of such an op (``copy_``'s source is only read), and the tensors those
    are views of (``mask = x.new_zeros(...); mask[:, a:b] = 1`` writes ``mask`` through a slice)."""
    out: set[torch.fx.Node] = set()

    def add(x: torch.fx.Node) -> None:
        while x not in out:
            out.add(x)
            base = x.args[0] if x.args else None
            if not (is_view(x) and isinstance(base, torch.fx.Node)):
                return
            x = base

    for u in gm.graph.nodes:
        t = u.target
        if not (isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable):
            continue
        for i, a in enumerate(t._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            v = u.args[i] if i < len(u.args) else u.kwargs.get(a.name)
            for x in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(x, torch.fx.Node):
                    add(x)
    return out
