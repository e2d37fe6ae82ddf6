"""``clone_program``: a new ExportedProgram with its own graph, so a pass or a lowering never mutates its input;
``sync_signature_names``: a signature named after its graph's nodes again (a graph copy, or torch's ``deepcopy``
of an ExportedProgram, renames a placeholder called ``input`` to ``input_1`` but not the signature)."""

from __future__ import annotations

import copy

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

__all__ = ["clone_program", "sync_signature_names"]


def clone_program(ep: ExportedProgram, gm: torch.fx.GraphModule | None = None,
                  signature: ExportGraphSignature | None = None, state_dict: dict | None = None,
                  constants: dict | None = None) -> ExportedProgram:
    """A new ExportedProgram sharing tensors with ``ep`` but with its own graph (node metas copied)."""
    if gm is None:
        graph = torch.fx.Graph()
        out = graph.graph_copy(ep.graph, {})
        graph.output(out)
        gm = torch.fx.GraphModule(ep.graph_module, graph)
    signature = signature or copy.deepcopy(ep.graph_signature)
    sync_signature_names(signature, gm.graph)
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=signature,
        state_dict=dict(ep.state_dict) if state_dict is None else state_dict,
        range_constraints=ep.range_constraints, module_call_graph=copy.deepcopy(ep.module_call_graph),
        example_inputs=ep.example_inputs, constants=dict(ep.constants) if constants is None else constants,
        verifiers=ep.verifiers,
    )


def sync_signature_names(signature: ExportGraphSignature, graph: torch.fx.Graph) -> bool:
    """Renames, in place, the input and output arguments of ``signature`` to the graph's placeholder and output
    node names (matched by position) where they differ. Returns whether anything was renamed; a signature whose
    inputs do not match the placeholders one to one is left as it is."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    specs = signature.input_specs
    if len(placeholders) != len(specs):
        return False
    renamed = {}
    for spec, node in zip(specs, placeholders):
        name = getattr(spec.arg, "name", None)
        if isinstance(name, str) and name != node.name:
            renamed[name] = node.name
            spec.arg.name = node.name
    if not renamed:
        return False
    out = next((n for n in reversed(graph.nodes) if n.op == "output"), None)
    values = list(out.args[0]) if out is not None and isinstance(out.args[0], (list, tuple)) else []
    for spec, value in zip(signature.output_specs, values):
        name = getattr(spec.arg, "name", None)
        if isinstance(name, str) and isinstance(value, torch.fx.Node) and name != value.name:
            spec.arg.name = value.name
    return True
