"""A reference ETRecord's program document (torch.export's JSON schema) turned straight into edgetorch's
reference-graph document (``_reference.build_reference``), without torch's ExportedProgram deserializer.

torch's deserializer rebuilds every node with fake tensors, resolves every schema class and loads the weights
before anything can run (about half of the Inspector's time on a ViT-sized record). The Inspector needs only a
runnable flat graph: placeholders for the user inputs, the parameters / buffers / constants as attributes, the
op nodes with their names, stack traces, module stacks, debug handles and output shapes, the user outputs. This
module writes that graph's document from the checked JSON (``_executorch.read_program_doc``: every target is
already an allowed operator) with the same node names and arguments torch's deserializer gives; a document
holding anything else (higher-order ops with sub-graphs, custom objects, symbolic shapes, tokens) raises
``Unsupported`` and the caller deserializes the program with torch instead.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from edgetorch.devtools.etrecord._reference import REFERENCE_FORMAT, SCHEMA_VERSION
from edgetorch.devtools.etrecord._tensors import _NAME_OF


class Unsupported(Exception):
    """The document holds something this converter does not express (the caller falls back to torch)."""


def _enums() -> tuple[dict[int, torch.dtype], dict[int, torch.layout], dict[int, torch.memory_format]]:
    from torch._export.serde import serialize as s

    return ({int(k): v for k, v in s._SERIALIZE_TO_TORCH_DTYPE.items()},
            {int(k): v for k, v in s._SERIALIZE_TO_TORCH_LAYOUT.items()},
            {int(k): v for k, v in s._SERIALIZE_TO_TORCH_MEMORY_FORMAT.items()})


_MF_NAME = {torch.contiguous_format: "contiguous_format", torch.channels_last: "channels_last",
            torch.channels_last_3d: "channels_last_3d", torch.preserve_format: "preserve_format"}
_LAYOUT_NAME = {torch.strided: "strided"}
_NONFINITE = {"Infinity": "inf", "-Infinity": "-inf", "NaN": "nan", "inf": "inf", "-inf": "-inf", "nan": "nan"}


def _one(x: Any) -> tuple[str, Any]:
    if not isinstance(x, dict) or len(x) != 1:
        raise Unsupported(f"malformed argument {str(x)[:80]}")
    (k, v), = x.items()
    return k, v


def _float(v: Any) -> Any:
    if isinstance(v, str) and v in _NONFINITE:
        return {"float": _NONFINITE[v]}
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v) if math.isfinite(v) else {"float": repr(float(v))}
    raise Unsupported(f"float argument {str(v)[:40]!r}")


class _Converter:
    """Converts one document; ``names`` maps a tensor (value) name of the document to the node holding it."""

    def __init__(self) -> None:
        self.dtypes, self.layouts, self.formats = _enums()
        self.names: dict[str, Any] = {}

    def ref(self, name: Any) -> dict[str, str]:
        node = self.names.get(name) if isinstance(name, str) else None
        if node is None:
            raise Unsupported(f"argument names {str(name)[:60]!r}, not an earlier value")
        return node

    def sym(self, x: Any) -> Any:
        k, v = _one(x)
        if k == "as_int" and isinstance(v, int):
            return v
        if k == "as_name":
            return self.ref(v)
        raise Unsupported(f"symbolic value {k}")

    def arg(self, x: Any) -> Any:
        k, v = _one(x)
        if k == "as_none":
            return None
        if k == "as_tensor":
            return self.ref(v.get("name") if isinstance(v, dict) else None)
        if k == "as_tensors":
            return [self.ref(t.get("name") if isinstance(t, dict) else None) for t in v]
        if k in ("as_int", "as_bool", "as_string"):
            if not isinstance(v, {"as_int": int, "as_bool": bool, "as_string": str}[k]):
                raise Unsupported(f"{k} holds {type(v).__name__}")
            return v
        if k in ("as_ints", "as_bools", "as_strings"):
            if not isinstance(v, list):
                raise Unsupported(f"{k} is not a list")
            return list(v)
        if k == "as_float":
            return _float(v)
        if k == "as_floats":
            return [_float(f) for f in v]
        if k in ("as_sym_int", "as_sym_float", "as_sym_bool"):
            return self.sym(v)
        if k in ("as_sym_ints", "as_sym_floats", "as_sym_bools"):
            return [self.sym(s) for s in v]
        if k == "as_scalar_type" and v in self.dtypes and self.dtypes[v] in _NAME_OF:
            return {"dtype": _NAME_OF[self.dtypes[v]]}
        if k == "as_memory_format" and self.formats.get(v) in _MF_NAME:
            return {"memory_format": _MF_NAME[self.formats[v]]}
        if k == "as_layout" and self.layouts.get(v) in _LAYOUT_NAME:
            return {"layout": _LAYOUT_NAME[self.layouts[v]]}
        if k == "as_device" and isinstance(v, dict) and isinstance(v.get("type"), str):
            idx = v.get("index")
            return {"device": v["type"] if idx is None else f"{v['type']}:{idx}"}
        if k == "as_optional_tensors":
            return [None if _one(t)[0] == "as_none" else self.ref(_one(t)[1].get("name")) for t in v]
        raise Unsupported(f"argument kind {k}")


def _target(t: str) -> str:
    if t.startswith("torch.ops."):
        ns, op, overload = t[len("torch.ops."):].split(".")
        return f"{ns}::{op}.{overload}"
    if t.startswith("_operator."):
        return "operator::" + t[len("_operator."):]
    raise Unsupported(f"target {t[:80]}")


def _schema(t: str) -> Any:
    ns, op, overload = t[len("torch.ops."):].split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)._schema


def _inputs(c: _Converter, node: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments as torch's deserializer orders them (by the operator's schema)."""
    given = {}
    kinds = {}
    for a in node.get("inputs") or []:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise Unsupported("malformed input")
        given[a["name"]] = c.arg(a.get("arg"))
        kinds[a["name"]] = a.get("kind")
    t = node["target"]
    if not t.startswith("torch.ops."):  # operator.*: positional, as written
        return [given[k] for k in given], {}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for s in _schema(t).arguments:
        if s.name not in given:
            continue
        kind = kinds[s.name]
        positional = kind == 1 if kind in (1, 2) else (not s.has_default_value() and not s.kwarg_only)
        if positional and not kwargs:
            args.append(given[s.name])
        else:
            kwargs[s.name] = given[s.name]
    if len(args) + len(kwargs) != len(given):
        raise Unsupported(f"inputs {sorted(given)} do not match the schema of {t}")
    return args, kwargs


def _val(tv: dict[str, Any], c: _Converter, name: Any) -> Any:
    meta = tv.get(name) if isinstance(name, str) else None
    if not isinstance(meta, dict):
        return None
    dtype = c.dtypes.get(meta.get("dtype"))
    sizes = meta.get("sizes")
    if dtype not in _NAME_OF or not isinstance(sizes, list):
        return None
    shape = []
    for s in sizes:
        if not isinstance(s, dict) or not isinstance(s.get("as_int"), int):
            return None  # a symbolic size: no static value spec
        shape.append(s["as_int"])
    return {"dtype": _NAME_OF[dtype], "shape": shape}


class _Tables:
    """The stack-trace and module-stack tables of the document (each distinct value stored once)."""

    def __init__(self, stack_of: Any) -> None:
        self.traces: dict[str, int] = {}
        self.stack_index: dict[str, int] = {}
        self.stacks: list[dict[str, list[str]]] = []
        self.stack_of = stack_of

    def meta(self, md: Any, handle: Any, val: Any) -> dict[str, Any]:
        md = md if isinstance(md, dict) else {}
        meta: dict[str, Any] = {}
        if handle is not None:
            meta["custom"] = {"debug_handle": handle}
        trace = md.get("stack_trace")
        meta["stack_trace"] = self.traces.setdefault(trace, len(self.traces)) if isinstance(trace, str) else None
        raw = md.get("nn_module_stack")
        meta["nn_module_stack"] = None
        if isinstance(raw, str):
            if raw not in self.stack_index:
                stack = self.stack_of(raw)
                self.stack_index[raw] = -1 if stack is None else len(self.stacks)
                if stack is not None:
                    self.stacks.append({k: list(v) for k, v in stack.items()})
            if self.stack_index[raw] >= 0:
                meta["nn_module_stack"] = self.stack_index[raw]
        meta["val"] = val
        return meta


def _attr_name(name: str, taken: set[str]) -> str:
    from edgetorch.devtools.etrecord._reference import _valid_attr_name

    if _valid_attr_name(name, taken):
        return name
    return next(f"attr_{i}" for i in range(len(taken), 10**9) if _valid_attr_name(f"attr_{i}", taken))


_FQN_FIELD = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}


def _signature_inputs(c: _Converter, sig: dict[str, Any], state: dict[str, Any], consts: dict[str, Any],
                      nodes: list[Any], attrs: list[Any], tensors: list[torch.Tensor]) -> dict[str, str]:
    """Placeholders and attributes of the inputs; returns {buffer FQN / user input name: node name}."""
    taken: set[str] = set()
    node_of: dict[str, str] = {}
    for spec in sig.get("input_specs") or []:
        kind, v = _one(spec)
        if kind == "user_input":
            k, a = _one(v.get("arg"))
            if k != "as_tensor":
                raise Unsupported(f"user input of kind {k}")
            name = a["name"]
            nodes.append({"op": "placeholder", "name": name})
            c.names[name] = {"node": name}
            node_of[name] = name
            continue
        fqn = _FQN_FIELD.get(kind)
        if fqn is None:
            raise Unsupported(f"input of kind {kind}")
        name, target = v["arg"]["name"], v[fqn]
        in_state = kind == "parameter" or (kind == "buffer" and v.get("persistent", True))
        t = (state if in_state else consts).get(target)
        if not isinstance(t, torch.Tensor) or type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise Unsupported(f"input {name} ({target}) is not a plain tensor")
        attr = _attr_name(name, taken)
        taken.add(attr)
        tensors.append(t)
        attrs.append({"name": attr, "kind": {"parameter": "parameter", "buffer": "buffer"}.get(kind, "constant"),
                      "param": isinstance(t, torch.nn.Parameter), "requires_grad": bool(t.requires_grad),
                      "tensor": len(tensors) - 1})
        nodes.append({"op": "get_attr", "name": name, "target": attr})
        c.names[name] = {"node": name}
        node_of[target] = name
    return node_of


def _outputs(c: _Converter, node: dict[str, Any], tv: dict[str, Any]) -> tuple[str | None, list[tuple[str, Any]]]:
    """(name of a single-tensor output, [(getitem name, value spec)] of a multi-output op)."""
    outs = node.get("outputs") or []
    if len(outs) == 1:
        k, v = _one(outs[0])
        if k == "as_tensor":
            return v["name"], []
        if k != "as_tensors":
            raise Unsupported(f"output of kind {k}")
        outs = [{"as_tensor": t} for t in v]
    items = []
    for o in outs:
        k, v = _one(o)
        if k != "as_tensor":
            raise Unsupported(f"multi-output of kind {k}")
        items.append((v["name"], _val(tv, c, v["name"])))
    return None, items


def reference_document(doc: dict[str, Any], state: dict[str, Any], consts: dict[str, Any], method: str,
                       handles: dict[str, Any], stack_of: Any) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """The reference-graph document (``_reference.build_reference``) of a checked torch.export document and the
    attribute tensors it indexes. ``handles``: {node name: debug handle} stamped as ``meta["custom"]``;
    ``stack_of`` parses a module-stack string. Raises ``Unsupported`` for what it cannot express."""
    c = _Converter()
    gm = doc["graph_module"]
    graph, sig = gm.get("graph") or {}, gm.get("signature") or {}
    tv = graph.get("tensor_values") or {}
    if graph.get("sym_int_values") or graph.get("custom_obj_values") or graph.get("sym_bool_values"):
        raise Unsupported("symbolic values or custom objects")
    nodes: list[dict[str, Any]] = []
    attrs: list[dict[str, Any]] = []
    tensors: list[torch.Tensor] = []
    tables = _Tables(stack_of)
    node_of = _signature_inputs(c, sig, state, consts, nodes, attrs, tensors)
    if len(nodes) != len(graph.get("inputs") or []):
        raise Unsupported("the signature does not match the graph inputs")
    used = {n["name"] for n in nodes}
    for nd in graph.get("nodes") or []:
        _node(c, nd, tv, handles, tables, nodes, used)
    _output(c, graph, sig, node_of, nodes, used)
    return ({"format": REFERENCE_FORMAT, "version": SCHEMA_VERSION, "method": method,
             "stack_traces": list(tables.traces), "module_stacks": tables.stacks, "attrs": attrs, "nodes": nodes},
            tensors)


def _node(c: _Converter, nd: Any, tv: dict[str, Any], handles: dict[str, Any], tables: _Tables,
          nodes: list[Any], used: set[str]) -> None:
    if not isinstance(nd, dict) or not isinstance(nd.get("target"), str):
        raise Unsupported("malformed node")
    target = _target(nd["target"])
    args, kwargs = _inputs(c, nd)
    single, items = _outputs(c, nd, tv)
    name = nd.get("name") or single
    if not isinstance(name, str) or not name or name in used:
        raise Unsupported(f"node name {str(name)[:60]!r}")
    used.add(name)
    md = nd.get("metadata")
    val = _val(tv, c, single) if single is not None else ({"seq": [v for _, v in items]}
                                                          if all(v is not None for _, v in items) else None)
    nodes.append({"op": "call_function", "name": name, "target": target, "args": args, "kwargs": kwargs,
                  "meta": tables.meta(md, handles.get(name), val)})
    if single is not None:
        c.names[single] = {"node": name}
        return
    for i, (item, spec) in enumerate(items):
        if item in used:
            raise Unsupported(f"output name {item[:60]!r} reused")
        used.add(item)
        nodes.append({"op": "call_function", "name": item, "target": "operator::getitem",
                      "args": [{"node": name}, i], "kwargs": {},
                      "meta": tables.meta(md, None, spec)})  # no handle, as torch's path stamps
        c.names[item] = {"node": item}


def _output(c: _Converter, graph: dict[str, Any], sig: dict[str, Any], node_of: dict[str, str],
            nodes: list[Any], used: set[str]) -> None:
    outs = graph.get("outputs") or []
    specs = sig.get("output_specs") or []
    if len(outs) != len(specs):
        raise Unsupported("the outputs do not match the output signature")
    user: list[Any] = []
    for o, spec in zip(outs, specs, strict=True):
        kind, v = _one(spec)
        value = c.arg(o)
        if kind in ("user_output", "loss_output"):
            user.append(value)
            continue
        target = v.get("buffer_name") if kind == "buffer_mutation" else v.get("user_input_name") \
            if kind == "user_input_mutation" else None
        if target not in node_of:
            raise Unsupported(f"output of kind {kind}")
        name = next(f"copy__{j}" for j in range(10**9) if f"copy__{j}" not in used)
        used.add(name)
        nodes.append({"op": "call_function", "name": name, "target": "aten::copy_.default",
                      "args": [{"node": node_of[target]}, value], "kwargs": {},
                      "meta": {"stack_trace": None, "nn_module_stack": None, "val": None}})
    name = next(f"output{'' if j == 0 else f'_{j}'}" for j in range(10**9)
                if f"output{'' if j == 0 else f'_{j}'}" not in used)
    nodes.append({"op": "output", "name": name, "args": [{"tuple": user}]})
