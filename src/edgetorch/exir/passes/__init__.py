"""Applying user graph passes to edge programs (``EdgeProgramManager.transform``).

A pass is a callable taking a ``torch.fx.GraphModule`` and returning either a GraphModule, an object with a
``graph_module`` attribute (a PassResult), or None (it changed the module in place). Passes run on a copy:
the program they were given (which an ETRecord may hold) is left untouched. After the passes, nodes created
without a debug handle get fresh ones and the edge verifier runs again.

``MemoryPlanningPass`` (also ``edgetorch.exir.passes.memory_planning_pass.MemoryPlanningPass``, where the
reference's users import it) holds the memory-planning options ``ExecutorchBackendConfig`` takes; the
``*SymShapeEvalPass`` classes (also in ``exir.passes.sym_shape_eval_pass``) say where dynamic shapes' planned
sizes come from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch.export import ExportedProgram

from edgetorch.errors import ExportError
from edgetorch.exir.clone import clone_program
from edgetorch.exir.debug_handles import fill_missing_debug_handles
from edgetorch.exir.memory_planning import MemoryPlanningPass
from edgetorch.exir.symbolic import ConstraintBasedSymShapeEvalPass, HintBasedSymShapeEvalPass
from edgetorch.exir.verifier import verify_edge_program

__all__ = ["ConstraintBasedSymShapeEvalPass", "HintBasedSymShapeEvalPass", "MemoryPlanningPass", "apply_passes"]


def apply_passes(ep: ExportedProgram, passes: Sequence[Callable], method: str, config) -> ExportedProgram:
    new = clone_program(ep)
    gm = new.graph_module
    for p in passes:
        name = getattr(p, "__name__", type(p).__name__)
        try:
            res = p(gm)
        except Exception as e:
            raise ExportError(f"method '{method}': pass {name} failed: {type(e).__name__}: {e}") from e
        if res is None:
            continue
        out = getattr(res, "graph_module", res)
        if out is not gm:
            if out.graph is not gm.graph:
                raise ExportError(f"method '{method}': pass {name} returned a new GraphModule; edgetorch passes "
                                  "must edit the module they are given in place (and may return it)")
    gm.graph.lint()
    gm.recompile()
    fill_missing_debug_handles(gm)
    if config._check_ir_validity:
        verify_edge_program(new, method)
    return new
