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

import copy
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch._higher_order_ops.executorch_call_delegate import executorch_call_delegate
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

from edgetorch.errors import ExportError
from edgetorch.exir.debug_handles import nodes_by_handle

__all__ = ["CALL_DELEGATE", "LOWERED_MODULE_PREFIX", "InlinedProgram", "LoweredBackendModule", "attach_lowered_module",
           "delegate_calls", "inline_lowered_modules", "is_delegate_call", "lowered_module_of", "lowered_modules"]

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


@dataclass(frozen=True)
class InlinedProgram:
    """A lowered program's flat edge graph (``inline_lowered_modules``), with the parts of an ``ExportedProgram``
    a reader of its graph needs: the graph module, its signature (the partitions' state lifted as inputs), the
    state dict and the constants. Not an ``ExportedProgram``: the partitions' fake tensors (``meta["val"]``)
    come from other fake modes than the outer program's, which torch's constructor refuses."""

    graph_module: torch.fx.GraphModule
    graph_signature: ExportGraphSignature
    state_dict: dict[str, torch.Tensor]
    constants: dict[str, Any]

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph


def _fresh_key(base: str, taken: set[str]) -> str:
    key = base if base not in taken else next(f"{base}_{i}" for i in range(1, 10**9) if f"{base}_{i}" not in taken)
    taken.add(key)
    return key


def _lift_state(call: torch.fx.Node, sub: ExportedProgram, graph: torch.fx.Graph, keys: set[str],
                state: dict, consts: dict, lifted: list) -> dict[torch.fx.Node, torch.fx.Node]:
    """Maps the partition's placeholders: user inputs to the call's operands (outer nodes), parameters /
    buffers / constants to new placeholders of ``graph`` whose tensors join ``state`` / ``consts`` (a fresh key
    where the name is taken) and whose specs are appended to ``lifted``."""
    from torch.export.graph_signature import InputKind, InputSpec, OutputKind, TensorArgument

    phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
    specs = sub.graph_signature.input_specs
    operands = iter(call.args[1:])
    if len(phs) != len(specs) or sum(s.kind == InputKind.USER_INPUT for s in specs) != len(call.args) - 1 or any(
            s.kind in (OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION)
            for s in sub.graph_signature.output_specs):
        raise ExportError(f"delegate call '{call.name}': its partition cannot be inlined (its inputs do not match "
                          "the call's, or it mutates state)")
    m: dict[torch.fx.Node, Any] = {}
    for ph, spec in zip(phs, specs, strict=True):
        if spec.kind == InputKind.USER_INPUT:
            m[ph] = next(operands)
            continue
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            raise ExportError(f"delegate call '{call.name}': input '{ph.name}' of kind {spec.kind.name} cannot be "
                              "inlined")
        in_state = spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent)
        key = _fresh_key(str(spec.target), keys)
        (state if in_state else consts)[key] = (sub.state_dict if in_state else sub.constants)[spec.target]
        node = graph.node_copy(ph)  # a fresh name if the outer graph has it
        node.target = node.name
        m[ph] = node
        lifted.append(InputSpec(spec.kind, TensorArgument(node.name), key, spec.persistent))
    return m


def _copy_partition(call: torch.fx.Node, sub: ExportedProgram, graph: torch.fx.Graph,
                    inner: dict[torch.fx.Node, Any]) -> tuple:
    """Copies the partition's op nodes into ``graph`` (``inner``: its placeholders' nodes there); returns the
    nodes of its outputs."""
    for s in sub.graph.nodes:
        if s.op == "call_function":
            inner[s] = graph.node_copy(s, lambda a: inner[a])
        elif s.op == "output":
            res = s.args[0] if isinstance(s.args[0], (list, tuple)) else (s.args[0],)
            return tuple(inner[r] if isinstance(r, torch.fx.Node) else r for r in res)
        elif s.op != "placeholder":
            raise ExportError(f"delegate call '{call.name}': its partition holds a {s.op} node")
    raise ExportError(f"delegate call '{call.name}': its partition has no output node")


def inline_lowered_modules(ep: ExportedProgram) -> ExportedProgram | InlinedProgram:
    """The flat edge graph of a lowered program: each delegate call replaced by the nodes of its lowered module's
    ``original_module`` (their metadata, debug handles included, kept), the partition's user inputs mapped to
    the call's operands, its parameters / buffers / constants lifted as inputs (the same tensors) and the
    call's ``getitem`` users to the partition's outputs. ``ep`` itself when it holds no delegate call; ``ep``
    is never modified. Raises ``ExportError`` naming a call whose partition cannot be inlined (it mutates
    state, has a token or a submodule)."""
    from torch.export.graph_signature import InputKind

    calls = delegate_calls(ep)
    if not calls:
        return ep
    sig = copy.deepcopy(ep.graph_signature)
    state, consts = dict(ep.state_dict), dict(ep.constants)
    keys = set(state) | set(consts)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    outer_ph = [n for n in ep.graph.nodes if n.op == "placeholder"]
    n_state = next((i for i, s in enumerate(sig.input_specs) if s.kind == InputKind.USER_INPUT), len(outer_ph))
    for n in outer_ph[:n_state]:
        env[n] = graph.node_copy(n, lambda a: env[a])
    lifted: list = []
    subs = {c: lowered_module_of(c, ep.graph_module).original_module for c in calls}
    # the partitions' state first: placeholders precede every other node, user inputs come last
    inner_ph = {c: _lift_state(c, subs[c], graph, keys, state, consts, lifted) for c in calls}
    for n in outer_ph[n_state:]:
        env[n] = graph.node_copy(n, lambda a: env[a])
    sig.input_specs[n_state:n_state] = lifted
    lowered_attrs = {c.args[0] for c in calls}
    for n in ep.graph.nodes:
        if n.op == "placeholder" or (n in lowered_attrs and all(is_delegate_call(u) for u in n.users)):
            continue
        if is_delegate_call(n):
            inner = {ph: env.get(a, a) if isinstance(a, torch.fx.Node) else a for ph, a in inner_ph[n].items()}
            env[n] = _copy_partition(n, subs[n], graph, inner)
        elif n.op == "call_function" and n.target is operator.getitem and is_delegate_call(n.args[0]):
            env[n] = env[n.args[0]][n.args[1]]
        else:
            env[n] = graph.node_copy(n, lambda a: env[a])
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    for spec, value in zip(sig.output_specs, values, strict=False):  # outputs now named after inner nodes
        if isinstance(value, torch.fx.Node) and isinstance(getattr(spec.arg, "name", None), str):
            spec.arg.name = value.name
    gm = torch.fx.GraphModule(ep.graph_module, graph)
    for name in {str(a.target) for a in lowered_attrs}:
        if hasattr(gm, name):
            delattr(gm, name)
    return InlinedProgram(gm, sig, state, consts)
