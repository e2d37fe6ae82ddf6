"""``ops.edge.<namespace>.<op>.<overload>``: the operators of edgetorch's edge dialect, named as the reference's
passes and partitioners name them (``from edgetorch.exir.dialects._ops import ops as exir_ops``;
``exir_ops.edge.aten.add.Tensor``). edgetorch's edge programs call ATen's own operators, so the namespace resolves
to ``torch.ops``: ``exir_ops.edge.aten.add.Tensor is torch.ops.aten.add.Tensor`` and a pass comparing a node's
target with it matches the nodes of an edge program. ``ops.backend`` is the same namespace (edgetorch's backends
use the same operators)."""

from __future__ import annotations

from typing import Any

import torch


class _Namespace:
    """Attribute access into ``torch.ops`` (``.aten``, ``.quantized_decomposed``, ...)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, ns: str) -> Any:
        if ns.startswith("__"):
            raise AttributeError(ns)
        return getattr(torch.ops, ns)

    def __repr__(self) -> str:
        return f"exir_ops.{self._name}"


class _Ops:
    edge = _Namespace("edge")
    backend = _Namespace("backend")


ops = _Ops()
