"""``torch.export`` of one method for the export session, with the one fallback non-strict export needs.

A module that reaches some of its buffers through plain Python objects instead of its own attributes (a Hugging
Face ``StaticCache`` held by ``TorchExportableModuleWithStaticCache``: the cache tensors are registered as the
wrapper's buffers, but the layers read and write them through the cache object) exports wrongly with
``strict=False``: torch lifts those tensors as *constants* (``lifted_tensor_<i>``) and records the cache updates
as in-place writes into them; the program would hold a frozen copy of the state, and ``run_decompositions``
(``to_edge``) fails deep inside AOT autograd ("expected compiled_fn to be GraphModule"). ``export_method`` sees
such constants (a constant sharing storage with a buffer or parameter of the module, written in place by the
graph) and exports again with ``strict=True`` (TorchDynamo traces the attribute accesses, so the tensors stay
the module's buffers and their updates buffer mutations), or raises an ``ExportError`` saying what to do.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from edgetorch.errors import ExportError

__all__ = ["export_method", "frozen_state"]

log = logging.getLogger(__name__)


def frozen_state(ep: ExportedProgram, model: torch.nn.Module) -> dict[str, str]:
    """``{constant: module buffer or parameter}`` of the lifted constants of ``ep`` that alias the module's own
    state (same storage) and that the graph writes in place."""
    state = {}
    for name, t in [*model.named_buffers(), *model.named_parameters()]:
        if isinstance(t, torch.Tensor) and t.numel():
            state.setdefault(t.untyped_storage().data_ptr(), name)
    aliased: dict[str, tuple[str, str]] = {}  # placeholder -> (constant, state name)
    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.CONSTANT_TENSOR or spec.target is None:
            continue
        t = ep.constants.get(spec.target)
        if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() in state:
            aliased[spec.arg.name] = (spec.target, state[t.untyped_storage().data_ptr()])
    out: dict[str, str] = {}
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for arg, value in zip(schema.arguments, node.args):
            info = arg.alias_info
            if info is not None and info.is_write and isinstance(value, torch.fx.Node) and value.name in aliased:
                const, name = aliased[value.name]
                out[const] = name
    return out


def export_method(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, dynamic_shapes: Any = None,
                  strict: bool = False, method: str = "forward") -> ExportedProgram:
    """``torch.export.export(model, args, kwargs, dynamic_shapes=..., strict=strict)``; a non-strict program
    that writes module state it holds as constants (``frozen_state``) is exported again with ``strict=True``
    (logged), and an ``ExportError`` naming the state says what to do if that fails too."""
    ep = torch.export.export(model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    if strict or not isinstance(model, torch.nn.Module):
        return ep
    frozen = frozen_state(ep, model)
    if not frozen:
        return ep
    names = sorted(set(frozen.values()))
    log.warning("export(%s): non-strict torch.export made the module's buffers %s constants written in place "
                "(the module reaches them through Python objects, e.g. a Hugging Face StaticCache): exporting "
                "again with strict=True", method, names[:4])
    try:
        return torch.export.export(model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=True)
    except Exception as e:
        raise ExportError(
            f"method '{method}': torch.export with strict=False turns the module's buffers {names[:4]} into "
            "constants that the graph writes in place (the module reaches them through plain Python objects, "
            "e.g. a Hugging Face StaticCache, not through its own attributes), which no program can hold; the "
            f"strict export tried next (recipe.strict = True) failed too: {type(e).__name__}: {e}. Make the "
            "module read and write that state through its registered buffers (self.<name>)") from e
