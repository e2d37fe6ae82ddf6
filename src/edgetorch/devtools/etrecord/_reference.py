"""Compact, fast-loading companions of the stored programs: the reference graph and the debug-handle table.

Deserializing an ``ExportedProgram`` with torch's schema deserializer takes seconds for a large model (and
imports torch._dynamo). The Inspector needs much less: a runnable graph of the ATen program and, per debug
handle, the edge nodes that carry it. Both are written at save time in an edgetorch JSON schema that loads
in milliseconds:

* **reference graph** (``reference/<i>.json``): the ATen program of one method as a flat, *unlifted* graph.
  Placeholders are the flattened user inputs; parameters, buffers and constants are ``get_attr`` nodes whose
  tensors are registered on the root module (read from ``tensors.bin``, zero-copy where it is mapped);
  the output node returns the flattened user outputs. Buffer and user-input mutations become
  ``aten::copy_`` nodes, as in ``ExportedProgram.module()``.
* **handle table** (``handles/<i>.json``): per debug handle, the op nodes of the edge program (before
  lowering) that carry it, in graph order.

Loading never evaluates or imports a string from the file: a node target is ``"<namespace>::<op>.<overload>"``
looked up through the namespace's own operator lookup (so ``aten::__and__.Tensor`` resolves, while a name like
``__class__`` never reaches a Python attribute), for a fixed set of namespaces, and the result must be an
``OpOverload``; the only other callables are a fixed table (``CALLABLES``) of functions of ``operator``
(``"operator::getitem"``, ``"operator::and_"``, ...), ``torch.sym_*`` (``"torch::sym_max"``) and ``math``
(``"math::ceil"``): the arithmetic of symbolic shapes. Arguments are JSON (node references, None, bool, int, float, str,
lists, tuples, dtypes, devices, layouts, memory formats); anything else is refused. Those parts (targets,
arguments, node metadata) are ``_reference_codec``; this module builds and reads the two documents.
"""

from __future__ import annotations

import json
import keyword
from collections.abc import Callable
from typing import Any

import torch

from edgetorch.devtools.etrecord._reference_codec import (
    ATTR_KINDS,
    HANDLES_FORMAT,
    MAX_NODES,
    NAME_RE,
    REFERENCE_FORMAT,
    RESERVED_ATTRS,
    SCHEMA_VERSION,
    GraphDataError,
    NodeInfo,
    Table,
    check_json_depth,
    check_table,
    decode_arg,
    decode_val,
    encode_arg,
    graph_module_class,
    json_ok,
    module_stack_json,
    module_stack_ok,
    resolve_target,
    table_index,
    target_name,
    val_json,
)
from edgetorch.devtools.etrecord._tensors import UnsupportedValueError, check_disjoint

__all__ = ["GraphDataError", "NodeInfo", "REFERENCE_FORMAT", "SCHEMA_VERSION", "build_handles", "build_reference",
           "encode_handles", "encode_reference", "handles_from_program", "reference_from_program", "resolve_target",
           "target_name"]


# --- reference graph -------------------------------------------------------------------------------------------

def _valid_attr_name(name: str, taken: set[str]) -> bool:
    return (isinstance(name, str) and bool(NAME_RE.match(name)) and not name.startswith("_")
            and not keyword.iskeyword(name) and name not in RESERVED_ATTRS and name not in taken)


def _inline_operands(node: torch.fx.Node) -> tuple[torch.fx.Node, tuple] | None:
    """(submodule get_attr node, operands) of a higher-order op the reference graph stores inlined: ops that only
    set the grad mode (the reference runs without grad anyway) or *disable* autocast, which change no value."""
    t, a = node.target, node.args
    name = getattr(t, "__name__", None) if isinstance(t, torch._ops.HigherOrderOperator) else None
    if name == "wrap_with_set_grad_enabled" and len(a) >= 2:
        sub, ops = a[1], a[2:]
    elif name == "wrap_with_autocast" and len(a) >= 5 and a[2] is False:
        sub, ops = a[4], a[5:]
    else:
        return None
    return (sub, tuple(ops)) if isinstance(sub, torch.fx.Node) and sub.op == "get_attr" and not node.kwargs else None


class _CallEncoder:
    """Writes ``call_function`` nodes; inlines the submodules of ``_inline_operands`` higher-order ops (their op
    nodes take fresh names and the higher-order node's ``meta["custom"]`` (debug handle), its stack trace and
    module stack where they have none, and the getitems of its result index the tuple of its outputs)."""

    def __init__(self, root: torch.nn.Module, nodes: list[dict[str, Any]], names: set[str], traces: Table,
                 stacks: Table) -> None:
        self.root, self.nodes, self.names, self.traces, self.stacks = root, nodes, names, traces, stacks
        self.top: dict[torch.fx.Node, Any] = {}  # top-level nodes stored in another form (inlined results)

    def inlined_only(self, node: torch.fx.Node) -> bool:
        return bool(node.users) and all(_inline_operands(u) is not None and _inline_operands(u)[0] is node
                                        for u in node.users)

    def _meta(self, node: torch.fx.Node, outer: torch.fx.Node | None) -> dict[str, Any]:
        src = outer.meta if outer is not None else {}
        custom = node.meta.get("custom") or src.get("custom")
        meta: dict[str, Any] = {}
        if custom is not None:
            if not isinstance(custom, dict) or not json_ok(custom):
                raise UnsupportedValueError(f"node {node.name!r}: meta['custom'] is not a JSON object")
            meta["custom"] = json.loads(json.dumps(custom, allow_nan=False))
        trace = node.meta.get("stack_trace") or src.get("stack_trace")
        meta["stack_trace"] = self.traces.add(trace if isinstance(trace, str) else None)
        meta["nn_module_stack"] = self.stacks.add(module_stack_json(node.meta.get("nn_module_stack")
                                                                     or src.get("nn_module_stack")))
        meta["val"] = val_json(node.meta.get("val"))
        return meta

    def _fresh(self, base: str) -> str:
        name = base if NAME_RE.match(base) and base not in self.names else next(
            f"{base[:150]}_{i}" for i in range(1, 10**9) if f"{base[:150]}_{i}" not in self.names)
        self.names.add(name)
        return name

    def call(self, node: torch.fx.Node, name: str, rename: dict[torch.fx.Node, Any] | None,
             outer: torch.fx.Node | None, depth: int = 0) -> None:
        """Appends ``node`` (stored as ``name``), or the inlined body of a higher-order op."""
        inl = _inline_operands(node)
        if inl is not None:
            self._inline(node, inl, rename, depth)
            return
        try:
            args = [encode_arg(a, rename=rename) for a in node.args]
            kwargs = {k: encode_arg(v, rename=rename) for k, v in node.kwargs.items()}
            target = target_name(node.target)
        except UnsupportedValueError as e:
            raise UnsupportedValueError(f"node {node.name!r}: {e}") from None
        self.nodes.append({"op": "call_function", "name": name, "target": target, "args": args, "kwargs": kwargs,
                           "meta": self._meta(node, outer)})

    def _inline(self, node: torch.fx.Node, inl: tuple[torch.fx.Node, tuple], rename: dict[torch.fx.Node, Any] | None,
                depth: int) -> None:
        sub_node, operands = inl
        sub = getattr(self.root, str(sub_node.target), None)
        if not isinstance(sub, torch.fx.GraphModule) or depth > 8:
            raise UnsupportedValueError(f"node {node.name!r}: higher-order op without an inlinable submodule")
        inner: dict[torch.fx.Node, Any] = {}
        phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
        if len(phs) != len(operands):
            raise UnsupportedValueError(f"node {node.name!r}: {len(operands)} operands for {len(phs)} inputs")
        for ph, a in zip(phs, operands, strict=True):
            inner[ph] = encode_arg(a, rename=rename)
        saved, self.root = self.root, sub
        try:
            for n in sub.graph.nodes:
                if n.op == "call_function":
                    fresh = self._fresh(f"{node.name}_{n.name}")
                    inner[n] = {"node": fresh}
                    self.call(n, fresh, inner, node, depth + 1)
                elif n.op == "output":
                    (self.top if rename is None else rename)[node] = encode_arg(n.args[0], rename=inner)
                elif n.op != "placeholder" and not (n.op == "get_attr" and self.inlined_only(n)):
                    raise UnsupportedValueError(f"node {node.name!r}: its submodule holds a {n.op} node")
        finally:
            self.root = saved


def _flat(ep: Any) -> Any:
    """``ep`` with its delegate calls inlined (the edge ops and debug handles of each partition in its place)."""
    from edgetorch.errors import ExportError
    from edgetorch.exir.backend.lowered import inline_lowered_modules

    try:
        return inline_lowered_modules(ep)
    except ExportError as e:
        raise UnsupportedValueError(str(e)) from None


def encode_reference(ep: Any, method: str, add_tensor: Callable[[torch.Tensor, str], Any]) -> dict[str, Any]:
    """The reference-graph document of an ATen ``ExportedProgram``; ``add_tensor(tensor, what)`` gives the
    JSON stored for each attribute tensor. Raises ``UnsupportedValueError`` for a program it cannot express
    (non-operator targets, custom objects, tokens, submodules, arguments JSON cannot hold). A lowered program
    is stored flat: each delegate call inlined (``inline_lowered_modules``), its partition's nodes and state
    in its place."""
    from torch.export.graph_signature import InputKind, OutputKind

    if _has_cond(ep):
        raise ControlFlowProgram("a program with torch.cond is read from the full program")
    ep = _flat(ep)
    sig = ep.graph_signature
    traces, stacks = Table(), Table()
    attrs: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    names = {n.name for n in ep.graph.nodes}
    enc = _CallEncoder(ep.graph_module, nodes, names, traces, stacks)
    attr_names: set[str] = set()
    node_of_target: dict[str, str] = {}  # buffer FQN / user input name -> node name
    specs = iter(sig.input_specs)
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            spec = next(specs, None)
            if spec is None:
                raise UnsupportedValueError("the graph has more placeholders than the signature has inputs")
            if spec.kind == InputKind.USER_INPUT:
                nodes.append({"op": "placeholder", "name": node.name})
                node_of_target[node.name] = node.name
                continue
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                raise UnsupportedValueError(f"input {node.name!r} of kind {spec.kind.name} cannot be stored")
            in_state = spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent)
            t = (ep.state_dict if in_state else ep.constants).get(spec.target)
            if not isinstance(t, torch.Tensor):
                raise UnsupportedValueError(f"input {node.name!r} ({spec.target}) is not a tensor")
            attr = node.name
            if not _valid_attr_name(attr, attr_names):
                attr = next(f"attr_{i}" for i in range(len(attrs), 10**9) if _valid_attr_name(f"attr_{i}", attr_names))
            attr_names.add(attr)
            kind = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer"}.get(spec.kind, "constant")
            attrs.append({"name": attr, "kind": kind, "param": isinstance(t, torch.nn.Parameter),
                          "requires_grad": bool(t.requires_grad),
                          "tensor": add_tensor(t, f"reference graph of {method!r}: {kind} {spec.target!r}")})
            nodes.append({"op": "get_attr", "name": node.name, "target": attr})
            node_of_target[spec.target] = node.name
        elif node.op == "call_function":
            enc.call(node, node.name, enc.top, None)
        elif node.op == "output":
            outs = node.args[0]
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            if len(outs) != len(sig.output_specs):
                raise UnsupportedValueError("the output node does not match the output signature")
            user: list[Any] = []
            for i, (o, spec) in enumerate(zip(outs, sig.output_specs, strict=True)):
                if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
                    user.append(o)
                    continue
                if spec.kind not in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION) \
                        or spec.target not in node_of_target:
                    raise UnsupportedValueError(f"output {i} of kind {spec.kind.name} cannot be stored")
                name = next(f"copy__{j}" for j in range(10**9) if f"copy__{j}" not in names)
                names.add(name)
                nodes.append({"op": "call_function", "name": name, "target": "aten::copy_.default",
                              "args": [{"node": node_of_target[spec.target]}, encode_arg(o, rename=enc.top)],
                              "kwargs": {},
                              "meta": {"stack_trace": None, "nn_module_stack": None, "val": None}})
            nodes.append({"op": "output", "name": node.name, "args": [encode_arg(tuple(user), rename=enc.top)]})
        elif node.op == "get_attr" and enc.inlined_only(node):
            continue  # a submodule of higher-order ops that are inlined
        else:
            raise UnsupportedValueError(f"node {node.name!r} is a {node.op}; only flat graphs of operators can "
                                        "be stored")
    return {"format": REFERENCE_FORMAT, "version": SCHEMA_VERSION, "method": method,
            "stack_traces": traces.items, "module_stacks": stacks.items, "attrs": attrs, "nodes": nodes}


def _header(doc: Any, fmt: str, keys: set[str]) -> None:
    if not isinstance(doc, dict) or set(doc) != keys:
        raise GraphDataError(f"must be a JSON object with exactly the keys {sorted(keys)}")
    if doc["format"] != fmt or doc["version"] != SCHEMA_VERSION:
        raise GraphDataError(f"unsupported format {doc['format']!r} version {doc['version']!r} (expected {fmt!r} "
                             f"version {SCHEMA_VERSION})")
    if not isinstance(doc["method"], str):
        raise GraphDataError("method must be a string")


_REF_KEYS = {"format", "version", "method", "stack_traces", "module_stacks", "attrs", "nodes"}


def build_reference(doc: Any, read_tensor: Callable[[Any, str, bool, bool], torch.Tensor]) -> torch.fx.GraphModule:
    """Validates a reference-graph document and builds its GraphModule; ``read_tensor(stored, what, param,
    requires_grad)`` gives an attribute's tensor. Raises ``GraphDataError`` (or the reader's own error)."""
    _header(doc, REFERENCE_FORMAT, _REF_KEYS)
    traces = check_table(doc, "stack_traces", lambda x: isinstance(x, str))
    stacks = [{k: (v[0], v[1]) for k, v in s.items()} for s in check_table(doc, "module_stacks", module_stack_ok)]
    attrs, nodes = doc["attrs"], doc["nodes"]
    if not isinstance(attrs, list) or not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise GraphDataError("attrs and nodes must be lists")
    root = torch.nn.Module()
    taken: set[str] = set()
    for a in attrs:
        if not isinstance(a, dict) or set(a) != {"name", "kind", "param", "requires_grad", "tensor"}:
            raise GraphDataError("malformed attribute entry")
        name = a["name"]
        if not _valid_attr_name(name, taken):
            raise GraphDataError(f"attribute name {str(name)[:80]!r} is not allowed")
        if a["kind"] not in ATTR_KINDS or not isinstance(a["param"], bool) \
                or not isinstance(a["requires_grad"], bool):
            raise GraphDataError(f"attribute {name!r}: malformed kind/param/requires_grad")
        taken.add(name)
        t = read_tensor(a["tensor"], f"attribute {name!r}", a["param"], a["requires_grad"])
        if isinstance(t, torch.nn.Parameter):
            root.register_parameter(name, t)
        else:
            root.register_buffer(name, t)
    check_disjoint([(f"attribute {a['name']!r}", a["tensor"]) for a in attrs])  # each read and checked above
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    vals: dict[tuple, torch.Tensor] = {}
    n_out = 0
    for i, nd in enumerate(nodes):
        if not isinstance(nd, dict) or not isinstance(nd.get("op"), str) or not isinstance(nd.get("name"), str):
            raise GraphDataError(f"node {i} is malformed")
        op, name = nd["op"], nd["name"]
        if n_out:
            raise GraphDataError("the output node must be the last node")
        if not NAME_RE.match(name) or name in env:
            raise GraphDataError(f"node {i}: name {name[:80]!r} is not a fresh identifier")
        if op == "placeholder" and set(nd) == {"op", "name"}:
            node = graph.create_node("placeholder", name, name=name)
        elif op == "get_attr" and set(nd) == {"op", "name", "target"}:
            if nd["target"] not in taken:
                raise GraphDataError(f"node {name!r}: get_attr of an unknown attribute")
            node = graph.create_node("get_attr", nd["target"], name=name)
        elif op == "call_function" and set(nd) == {"op", "name", "target", "args", "kwargs", "meta"}:
            try:
                target = resolve_target(nd["target"])
            except GraphDataError as e:
                raise GraphDataError(f"node {name!r}: {e}") from None
            args, kwargs, meta = nd["args"], nd["kwargs"], nd["meta"]
            if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(
                    isinstance(k, str) and NAME_RE.match(k) for k in kwargs):
                raise GraphDataError(f"node {name!r}: malformed args/kwargs")
            node = graph.create_node("call_function", target, name=name)
            # set after creation: create_node would walk the arguments with pytree looking for SymInts,
            # which decoded JSON never holds (a third of the load time of a large graph)
            node.args = tuple(decode_arg(a, env) for a in args)
            if kwargs:
                node.kwargs = {k: decode_arg(v, env) for k, v in kwargs.items()}
            _apply_meta(node, meta, traces, stacks, vals)
        elif op == "output" and set(nd) == {"op", "name", "args"}:
            args = nd["args"]
            if not isinstance(args, list) or len(args) != 1:
                raise GraphDataError("the output node takes exactly one argument")
            node = graph.create_node("output", "output", (decode_arg(args[0], env),), name=name)
            n_out += 1
        else:
            raise GraphDataError(f"node {name!r}: op {op[:40]!r} or its fields are not allowed")
        if node.name != name and op != "placeholder":  # an input may be named like a builtin ("input")
            raise GraphDataError(f"node name {name!r} is not usable in a graph")
        env[name] = node
    if n_out != 1:
        raise GraphDataError("the graph has no output node")
    return graph_module_class()(root, graph, class_name="ReferenceGraph")


def _apply_meta(node: torch.fx.Node, meta: Any, traces: list[str], stacks: list[Any],
                vals: dict[tuple, torch.Tensor]) -> None:
    if not isinstance(meta, dict) or not set(meta) <= {"custom", "stack_trace", "nn_module_stack", "val"}:
        raise GraphDataError(f"node {node.name!r}: malformed meta")
    if "custom" in meta:
        custom = meta["custom"]
        if not isinstance(custom, dict):
            raise GraphDataError(f"node {node.name!r}: meta custom must be an object")
        check_json_depth(custom, f"node {node.name!r}: meta custom")
        node.meta["custom"] = custom
    trace = table_index(meta.get("stack_trace"), traces, "stack trace")
    if trace is not None:
        node.meta["stack_trace"] = trace
    stack = table_index(meta.get("nn_module_stack"), stacks, "module stack")
    if stack is not None:
        node.meta["nn_module_stack"] = dict(stack)
    val = decode_val(meta.get("val"), vals)
    if val is not None:
        node.meta["val"] = val


class ControlFlowProgram(UnsupportedValueError):
    """A program with ``torch.cond``: no compact graph is stored (its branches are graphs of their own); readers
    use the full program (``reference_from_program``)."""


def _has_cond(ep: Any) -> bool:
    return any(n.op == "call_function" and n.target is torch.ops.higher_order.cond for n in ep.graph.nodes)


def reference_from_program(ep: Any, method: str) -> torch.fx.GraphModule:
    """The reference graph of an in-memory ATen program (its tensors are used as they are). A program with
    ``torch.cond`` gives its unlifted module (``ExportedProgram.module()``: user inputs as placeholders, the state
    as attributes, each cond with its branch modules), which the gap walk runs branch by branch."""
    if _has_cond(ep):
        gm = _flat(ep).module()
        for n in [n for n in gm.graph.nodes if n.op == "call_module" and not n.users]:
            gm.graph.erase_node(n)  # torch's input guards (_guards_fn): the Inspector passes the recorded inputs
        gm.recompile()
        return gm
    tensors: list[torch.Tensor] = []

    def add(t: torch.Tensor, what: str) -> int:
        tensors.append(t)
        return len(tensors) - 1

    doc = encode_reference(ep, method, add)
    return build_reference(doc, lambda i, what, param, rg: tensors[i])


# --- handle table ---------------------------------------------------------------------------------------------

def encode_handles(ep: Any, method: str) -> dict[str, Any]:
    """The handle-table document of an edge program: every op node with a debug handle (getitem skipped); a
    lowered program's partitions are inlined, so their edge ops are listed, not the delegate calls."""
    from edgetorch.exir.debug_handles import nodes_by_handle
    from edgetorch.exir.op_variants import is_view_op

    ep = _flat(ep)
    traces, stacks = Table(), Table()
    rows: list[list[Any]] = []
    order = {n: i for i, n in enumerate(n for g in ep.graph_module.modules() if isinstance(g, torch.fx.GraphModule)
                                        for n in g.graph.nodes)}  # torch.cond branches after the graph
    for h, n in sorted(((h, n) for h, ns in nodes_by_handle(ep.graph).items() for n in ns),
                       key=lambda x: order[x[1]]):
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            op, is_view = t._schema.name, is_view_op(t)
        else:
            op, is_view = str(getattr(t, "__name__", t)), False
        trace = n.meta.get("stack_trace")
        rows.append([h, n.name, op, traces.add(trace if isinstance(trace, str) else None),
                     stacks.add(module_stack_json(n.meta.get("nn_module_stack"))), bool(is_view)])
    return {"format": HANDLES_FORMAT, "version": SCHEMA_VERSION, "method": method,
            "stack_traces": traces.items, "module_stacks": stacks.items, "nodes": rows}


_HANDLE_KEYS = {"format", "version", "method", "stack_traces", "module_stacks", "nodes"}


def build_handles(doc: Any) -> dict[int, list[NodeInfo]]:
    """Validates a handle-table document; returns ``{debug handle: [NodeInfo, ...]}`` in graph order."""
    _header(doc, HANDLES_FORMAT, _HANDLE_KEYS)
    traces = check_table(doc, "stack_traces", lambda x: isinstance(x, str))
    stacks = [{k: (v[0], v[1]) for k, v in s.items()}
              for s in check_table(doc, "module_stacks", module_stack_ok)]
    rows = doc["nodes"]
    if not isinstance(rows, list) or len(rows) > MAX_NODES:
        raise GraphDataError("nodes must be a list")
    out: dict[int, list[NodeInfo]] = {}
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 6 and isinstance(row[0], int) and not isinstance(row[0], bool)
                and isinstance(row[1], str) and isinstance(row[2], str) and isinstance(row[5], bool)):
            raise GraphDataError(f"node row {i} is malformed")
        stack = table_index(row[4], stacks, "module stack")
        info = NodeInfo(row[1], row[2], table_index(row[3], traces, "stack trace"),
                        None if stack is None else dict(stack), row[5])
        out.setdefault(row[0], []).append(info)
    return out


def handles_from_program(ep: Any, method: str) -> dict[int, list[NodeInfo]]:
    return build_handles(encode_handles(ep, method))
