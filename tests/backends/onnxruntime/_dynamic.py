"""Test helpers for dynamic shapes: models with a dynamic sequence length, edge programs exported with
``torch.export.Dim`` bounds, and ``partition_reexport_with_dims``, which makes lowering re-export a partition
with the dynamic dims of its inputs (what ``edgetorch.exir.backend.lowering._partition_program`` does not do
yet: it re-exports partitions at static example shapes, and fails on symbolic ones)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.export import Dim


def _hint(size: object) -> int:
    if isinstance(size, int):
        return size
    hint = size.node.hint
    if hint is None:
        raise ValueError(f"size {size} has no example value")
    return int(hint)


def hinted_example(val: torch.Tensor) -> torch.Tensor:
    """A random tensor of ``val``'s dtype at its example (hint) shape."""
    shape = tuple(_hint(s) for s in val.shape)
    if val.dtype.is_floating_point:
        return torch.randn(shape, dtype=val.dtype)
    return torch.zeros(shape, dtype=val.dtype)


def dims_of_placeholders(gm: torch.fx.GraphModule) -> tuple | None:
    """``dynamic_shapes`` for exporting ``gm``: one ``Dim`` per symbol its placeholders' sizes are (bounds from
    the symbol's shape environment), ``Dim.AUTO`` for sizes that are expressions; None when all are static."""
    from torch.utils._sympy.value_ranges import bound_sympy

    dims: dict[Any, Any] = {}
    spec: list[dict[int, Any] | None] = []
    for ph in (n for n in gm.graph.nodes if n.op == "placeholder"):
        v = ph.meta.get("val")
        entry: dict[int, Any] = {}
        for i, s in enumerate(getattr(v, "shape", ())):
            if isinstance(s, int):
                continue
            expr, env = s.node.expr, s.node.shape_env
            if expr.is_Symbol:
                r = bound_sympy(expr, env.var_to_range)
                dims.setdefault(expr, Dim(str(expr), min=int(r.lower), max=int(r.upper)))
                entry[i] = dims[expr]
            else:
                entry[i] = Dim.AUTO
        spec.append(entry or None)
    return tuple(spec) if dims or any(spec) else None


@contextlib.contextmanager
def partition_reexport_with_dims() -> Iterator[None]:
    """Within the block, lowering re-exports each partition with the dynamic dims of its inputs (examples at
    the hint shapes). A lowering that already passes ``dynamic_shapes`` is left alone."""
    from edgetorch.exir.backend import lowering

    real_export, real_example = torch.export.export, lowering._example

    def example(val: torch.Tensor) -> torch.Tensor:
        try:
            return real_example(val)
        except RuntimeError:  # symbolic sizes
            return hinted_example(val)

    def export(mod: Any, args: tuple, *a: Any, dynamic_shapes: Any = None, **kw: Any) -> Any:
        if dynamic_shapes is None and isinstance(mod, torch.fx.GraphModule):
            dynamic_shapes = dims_of_placeholders(mod)
        return real_export(mod, args, *a, dynamic_shapes=dynamic_shapes, **kw)

    lowering._example, torch.export.export = example, export
    try:
        yield
    finally:
        lowering._example, torch.export.export = real_example, real_export
