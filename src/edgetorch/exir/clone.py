"""``clone_program``: a new ExportedProgram with its own graph, so a pass or a lowering never mutates its input."""

from __future__ import annotations

import copy

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature


def clone_program(ep: ExportedProgram, gm: torch.fx.GraphModule | None = None,
                  signature: ExportGraphSignature | None = None, state_dict: dict | None = None,
                  constants: dict | None = None) -> ExportedProgram:
    """A new ExportedProgram sharing tensors with ``ep`` but with its own graph (node metas copied)."""
    if gm is None:
        graph = torch.fx.Graph()
        out = graph.graph_copy(ep.graph, {})
        graph.output(out)
        gm = torch.fx.GraphModule(ep.graph_module, graph)
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=signature or copy.deepcopy(ep.graph_signature),
        state_dict=dict(ep.state_dict) if state_dict is None else state_dict,
        range_constraints=ep.range_constraints, module_call_graph=copy.deepcopy(ep.module_call_graph),
        example_inputs=ep.example_inputs, constants=dict(ep.constants) if constants is None else constants,
        verifiers=ep.verifiers,
    )
