"""Lowered partitions: ``LoweredBackendModule``, held by the graph that calls it.

A lowered program keeps each delegated partition as a submodule of its graph module (``lowered_module_0``,
``lowered_module_1``, ...). A ``get_attr`` node reads it and hands it, as the first argument, to a call of
``CALL_DELEGATE`` (torch's ``executorch_call_delegate`` higher-order operator):
``executorch_call_delegate(lowered_module_0, *inputs)``; ``operator.getitem`` nodes take its outputs.

So the lowered module lives exactly as long as the graph that holds it: ``copy.deepcopy`` of the program copies
it, ``exir.clone.clone_program`` shares it, ``ExportedProgram.graph_module`` shows it, and
``ExportedProgram.module()`` runs it (the operator's CPU and fake-tensor implementations run the original,
pre-lowering partition, so the lowered graph stays runnable and re-exportable in eager PyTorch). torch's
export verifier accepts such a submodule by its class name and fields (``backend_id``, ``processed_bytes``,
``compile_specs``, ``original_module``).
"""

from __future__ import annotations

import torch
from torch._higher_order_ops.executorch_call_delegate import executorch_call_delegate
from torch.export import ExportedProgram

from edgetorch.errors import ExportError
from edgetorch.exir.debug_handles import nodes_by_handle

__all__ = ["CALL_DELEGATE", "LOWERED_MODULE_PREFIX", "LoweredBackendModule", "attach_lowered_module",
           "delegate_calls", "is_delegate_call", "lowered_module_of", "lowered_modules"]

#: the target of every delegate call node: ``CALL_DELEGATE(lowered_module, *inputs) -> tuple of outputs``
CALL_DELEGATE = executorch_call_delegate
#: the name of the ``i``-th lowered submodule of a graph module is ``f"{LOWERED_MODULE_PREFIX}{i}"``
LOWERED_MODULE_PREFIX = "lowered_module_"


class LoweredBackendModule(torch.nn.Module):
    """One partition compiled by a backend: its blob (``processed_bytes``), the compile specs, the partition as
    an ExportedProgram (``original_module``; its parameters are buffers), the backend's op id -> edge debug
    handles map, how many debug-buffer bytes one traced call logs and the named data it stores outside its blob
    (``named_data``: key -> bytes, ``PreprocessResult.data_store_output``). Calling it calls ``CALL_DELEGATE`` on
    itself, which runs ``original_module``."""

    def __init__(self, backend_id: str, processed_bytes: bytes, compile_specs: list,
                 original_module: ExportedProgram, debug_handle_map: dict | None = None,
                 debug_buffer_bytes: int | None = None, named_data: dict[str, bytes] | None = None) -> None:
        super().__init__()
        self.backend_id = backend_id
        self.processed_bytes = bytes(processed_bytes)
        self.compile_specs = list(compile_specs)  # list[CompileSpec]
        self.original_module = original_module
        self.debug_handle_map = dict(debug_handle_map or {})  # backend op id -> tuple of edge handles
        self.debug_buffer_bytes = debug_buffer_bytes  # what one traced call logs (PreprocessResult's)
        self.named_data: dict[str, bytes] = dict(named_data or {})  # stored once per program at emission
        self.module_name: str | None = None  # its attribute name in the graph module holding it

    def forward(self, *args: torch.Tensor) -> tuple:
        return CALL_DELEGATE(self, *args)

    def debug_handles(self) -> list[int]:
        """Handles of every op in the partition, in graph order (duplicates removed)."""
        return list(nodes_by_handle(self.original_module.graph))

    @property
    def compile_spec_items(self) -> list[tuple[str, bytes]]:
        return [(c.key, c.value) for c in self.compile_specs]

    def extra_repr(self) -> str:
        return f"backend_id={self.backend_id!r}, processed_bytes={len(self.processed_bytes)} bytes"


def is_delegate_call(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is CALL_DELEGATE


def delegate_calls(graph: torch.fx.Graph | torch.fx.GraphModule | ExportedProgram) -> list[torch.fx.Node]:
    """The delegate call nodes of a graph (or of a graph module / program's graph), in graph order."""
    g = graph.graph if isinstance(graph, (torch.fx.GraphModule, ExportedProgram)) else graph
    return [n for n in g.nodes if is_delegate_call(n)]


def lowered_module_of(node: torch.fx.Node, root: torch.nn.Module | None = None) -> LoweredBackendModule:
    """The lowered module a delegate call node calls: its first argument, a ``get_attr`` of a submodule of
    ``root`` (by default the graph module owning the node's graph). Raises ``ExportError`` naming the node."""
    if not is_delegate_call(node):
        raise ExportError(f"node '{node.name}' is not a delegate call (its target is {node.target})")
    attr = node.args[0] if node.args else None
    root = root if root is not None else node.graph.owning_module
    if not isinstance(attr, torch.fx.Node) or attr.op != "get_attr" or root is None:
        raise ExportError(f"delegate call '{node.name}': its first argument must be a get_attr node of the graph "
                          f"module holding the lowered module, got {attr!r}")
    try:
        mod = root.get_submodule(str(attr.target))
    except AttributeError:
        raise ExportError(f"delegate call '{node.name}': the graph module has no submodule "
                          f"'{attr.target}' (the lowered module was lost)") from None
    if not isinstance(mod, LoweredBackendModule):
        raise ExportError(f"delegate call '{node.name}': submodule '{attr.target}' is a {type(mod).__name__}, "
                          "not a LoweredBackendModule")
    return mod


def lowered_modules(gm: torch.fx.GraphModule) -> dict[str, LoweredBackendModule]:
    """``{attribute name: lowered module}`` of the delegate calls of ``gm``, in graph order."""
    out: dict[str, LoweredBackendModule] = {}
    for n in delegate_calls(gm.graph):
        out.setdefault(str(n.args[0].target), lowered_module_of(n, gm))
    return out


def attach_lowered_module(gm: torch.fx.GraphModule, lowered: LoweredBackendModule) -> str:
    """Registers ``lowered`` on ``gm`` under the first free name ``lowered_module_<i>``; returns the name."""
    i = 0
    while hasattr(gm, f"{LOWERED_MODULE_PREFIX}{i}"):
        i += 1
    name = f"{LOWERED_MODULE_PREFIX}{i}"
    gm.add_module(name, lowered)
    lowered.module_name = name
    return name
