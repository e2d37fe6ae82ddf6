"""One-call export, as the reference's example scripts call it: ``export_to_edge`` (torch.export + ``to_edge``),
``export_to_exec_prog`` (the same + ``to_executorch``) and ``save_pte_program``.

The model is exported in eval mode; ``example_inputs`` is the tuple of positional inputs, ``example_kwarg_inputs``
the keyword ones; ``dynamic_shapes`` and ``strict`` go to ``torch.export.export``. ``edge_compile_config`` and
``backend_config`` are edgetorch's ``EdgeCompileConfig`` / ``ExecutorchBackendConfig``. Errors keep their types:
a model that is not an ``nn.Module`` is a ``ValueError`` naming what was passed (the reference's contract), an
export failure is torch's own error.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from edgetorch.exir import EdgeCompileConfig, EdgeProgramManager, ExecutorchProgramManager, to_edge

__all__ = ["export_to_edge", "export_to_exec_prog", "save_pte_program"]

log = logging.getLogger(__name__)


def _export(model: Any, example_inputs: tuple, example_kwarg_inputs: dict | None, dynamic_shapes: Any,
            strict: bool) -> torch.export.ExportedProgram:
    if not isinstance(model, torch.nn.Module):  # a GraphModule is a Module too
        raise ValueError(f"expected the model to be a torch.nn.Module or torch.fx.GraphModule, got "
                         f"{type(model).__name__}")
    return torch.export.export(model.eval(), tuple(example_inputs), example_kwarg_inputs,
                               dynamic_shapes=dynamic_shapes, strict=strict)


def export_to_edge(model: torch.nn.Module, example_inputs: tuple, *, example_kwarg_inputs: dict | None = None,
                   dynamic_shapes: Any = None, edge_constant_methods: dict[str, Any] | None = None,
                   edge_compile_config: EdgeCompileConfig | None = None, strict: bool = True,
                   verbose: bool = True) -> EdgeProgramManager:
    """``torch.export`` then ``to_edge`` (``edge_constant_methods``: methods returning constants)."""
    aten = _export(model, example_inputs, example_kwarg_inputs, dynamic_shapes, strict)
    if verbose:
        log.info("core ATen graph:\n%s", aten.graph)
    return to_edge(aten, constant_methods=edge_constant_methods, compile_config=edge_compile_config)


def export_to_exec_prog(model: torch.nn.Module, example_inputs: tuple, *,
                        example_kwarg_inputs: dict | None = None, dynamic_shapes: Any = None,
                        edge_constant_methods: dict[str, Any] | None = None,
                        edge_compile_config: EdgeCompileConfig | None = None, backend_config: Any = None,
                        strict: bool = True) -> ExecutorchProgramManager:
    """``export_to_edge`` then ``to_executorch(backend_config)``: the program manager (``.buffer``, ``.save``)."""
    edge = export_to_edge(model, example_inputs, example_kwarg_inputs=example_kwarg_inputs,
                          dynamic_shapes=dynamic_shapes, edge_constant_methods=edge_constant_methods,
                          edge_compile_config=edge_compile_config, strict=strict, verbose=False)
    return edge.to_executorch(backend_config)


def save_pte_program(prog: ExecutorchProgramManager, model_name: str, output_dir: str = "") -> str:
    """Writes ``prog`` to ``<output_dir>/<model_name>.pte`` (or to ``model_name`` when it ends in ``.pte``),
    atomically; returns the path."""
    path = model_name if model_name.endswith(".pte") else os.path.join(output_dir, f"{model_name}.pte")
    prog.save(path)
    log.info("saved the program to %s", path)
    return path
