"""What a stored reference graph or handle table is made of (``_reference`` builds and reads the documents): the
op targets (``target_name`` / ``resolve_target``: a fixed set of operator namespaces looked up through their own
operator lookup, and a fixed table of Python callables, ``CALLABLES``), the arguments (``encode_arg`` /
``decode_arg``: JSON, node references, dtypes, devices, layouts, memory formats) and the node metadata tables
(stack traces, module stacks, value specs). Nothing from a file is evaluated or imported; anything else raises
``GraphDataError``.
"""

from __future__ import annotations

import importlib
import json
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from edgetorch.devtools.etrecord._tensors import _NAME_OF, DTYPES, UnsupportedValueError
from edgetorch.runtime.ops import is_operator_allowed

REFERENCE_FORMAT = "edgetorch.reference_graph"
HANDLES_FORMAT = "edgetorch.handle_table"
SCHEMA_VERSION = 1

#: operator namespaces of the built-in allow-list (``edgetorch.formats.operators``; a user may register others)
NAMESPACES = ("aten", "quantized_decomposed", "edgetorch", "torchao")
# namespaces registered by a Python module: imported (a fixed name, never one from the file) on a miss
_LAZY_NAMESPACE_MODULES = {
    "quantized_decomposed": "torch.ao.quantization.fx._decomposed",
    "torchao": "torchao.quantization.quant_primitives",
    "edgetorch": "edgetorch.runtime.lowbit",
}
#: the Python callables a stored target may name: ``operator::<name>`` (getitem and the arithmetic, bitwise and
#: comparison functions of symbolic shapes), ``torch::<name>`` (``torch.sym_*``) and ``math::<name>``. A fixed
#: table: a name from the file is only ever a key into it.
CALLABLES: dict[str, Callable[..., Any]] = {
    **{f"operator::{n}": getattr(operator, n) for n in (
        "getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg", "pos", "abs", "eq", "ne", "lt",
        "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift", "truth")},
    **{f"torch::{n}": getattr(torch, n) for n in (
        "sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt", "sym_sum", "_sym_sqrt",
        "_sym_cos", "_sym_sin", "_sym_tan", "_sym_cosh", "_sym_sinh", "_sym_tanh", "_sym_acos", "_sym_asin",
        "_sym_atan", "_sym_log2") if callable(getattr(torch, n, None))},
    **{f"math::{n}": getattr(math, n) for n in ("ceil", "floor", "trunc", "sqrt", "log2", "exp")},
}
#: kept for callers of the previous table: ``{name: function}`` of the ``operator`` entries
OPERATORS: dict[str, Callable[..., Any]] = {k.split("::", 1)[1]: f for k, f in CALLABLES.items()
                                            if k.startswith("operator::")}
_CALLABLE_NAME = {id(f): k for k, f in CALLABLES.items()}
_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,199}"
_DUNDER = r"__[a-z][a-z0-9]*(?:_[a-z0-9]+)*__"  # ATen's Python-operator ops: aten::__and__, aten::__ilshift__
_TARGET_RE = re.compile(rf"^({_IDENT})::({_IDENT}|{_DUNDER})\.({_IDENT})$")
NAME_RE = re.compile(rf"^{_IDENT}$")
_DEVICE_RE = re.compile(r"^(?:cpu|cuda|meta|mps|xpu|hpu|privateuseone)(?::[0-9]{1,4})?$")
_LAYOUTS: dict[str, torch.layout] = {
    n: getattr(torch, n) for n in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                                   "sparse_bsc", "_mkldnn", "jagged")
    if isinstance(getattr(torch, n, None), torch.layout)
}
_MEMORY_FORMATS: dict[str, torch.memory_format] = {
    n: getattr(torch, n) for n in ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")
}
_LAYOUT_NAME = {v: k for k, v in _LAYOUTS.items()}
_MEMORY_FORMAT_NAME = {v: k for k, v in _MEMORY_FORMATS.items()}
_MAX_DEPTH = 32
MAX_NODES = 1_000_000
_INT_MIN, _INT_MAX = -(2**63), 2**64
ATTR_KINDS = ("parameter", "buffer", "constant")
# attribute names that would shadow a GraphModule / nn.Module member
RESERVED_ATTRS = frozenset(dir(torch.fx.GraphModule)) | frozenset(vars(torch.nn.Module()))


class GraphDataError(ValueError):
    """A malformed or unsafe reference graph / handle table; the caller names the zip entry."""


@dataclass(frozen=True)
class NodeInfo:
    """One op node of an edge program: ``op`` is the operator's schema name (``"aten::addmm"``) or the
    target's name, ``nn_module_stack`` maps a key to ``(module path, module type name)``, ``is_view`` says
    the op returns an alias of an input (``edgetorch.exir.op_variants.is_view_op``)."""

    name: str
    op: str
    stack_trace: str | None
    nn_module_stack: dict[str, tuple[str, str]] | None
    is_view: bool


# --- targets ---------------------------------------------------------------------------------------------

def target_name(t: Any) -> str:
    """``torch.ops.aten.add.Tensor`` -> ``"aten::add.Tensor"``, ``operator.getitem`` -> ``"operator::getitem"``;
    raises ``UnsupportedValueError`` for any other callable (or one that would not resolve back to itself)."""
    if isinstance(t, torch._ops.OpOverload):
        ns = t.namespace
        name = t._schema.name.split("::", 1)[-1]
        s = f"{ns}::{name}.{t._overloadname}"
        try:
            ok = resolve_target(s) is t
        except GraphDataError:
            ok = False
        if not ok:
            raise UnsupportedValueError(f"operator {s} cannot be stored: not on the operator allow-list "
                                        "(edgetorch.formats.operators) nor registered with "
                                        "edgetorch.runtime.ops.register_operator")
        return s
    try:
        k = _CALLABLE_NAME.get(id(t))
    except TypeError:
        k = None
    if k is not None and CALLABLES[k] is t:
        return k
    raise UnsupportedValueError(f"call target {t!r} is neither an OpOverload nor an allowed Python callable "
                                f"(operator, torch.sym_*, math)")


_RESOLVED: dict[str, Callable[..., Any]] = {}
_DUNDER_RE = re.compile(rf"^{_DUNDER}$")


def _dunder_op(op: str) -> bool:
    """An ATen Python-operator name (``__and__``), never an attribute of the op namespace class itself."""
    return bool(_DUNDER_RE.match(op)) and not any(op in vars(k) for k in torch._ops._OpNamespace.__mro__)


def _lookup(ns: str, op: str, overload: str) -> Any:
    """``torch.ops.<ns>.<op>.<overload>`` without ordinary attribute lookup on the namespace: a packet it already
    holds, else the namespace's operator lookup itself (``_OpNamespace.__getattr__``, which only finds registered
    operators), so a name like ``__class__`` or ``__init__`` can never reach a Python attribute."""
    space = getattr(torch.ops, ns)
    packet = vars(space).get(op)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        packet = type(space).__getattr__(space, op)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return None
    return getattr(packet, overload)


def resolve_target(s: Any) -> Callable[..., Any]:
    """The callable a stored target names; ``GraphDataError`` for anything that is not an allowed operator: the
    operators of the runtime's allow-list (``edgetorch.formats.operators``) and those the user registered
    (``edgetorch.runtime.ops.register_operator``), or the Python callables of ``CALLABLES``."""
    if not isinstance(s, str) or len(s) > 512:
        raise GraphDataError(f"node target {str(s)[:80]!r} is not a string")
    if s in CALLABLES:
        return CALLABLES[s]
    m = _TARGET_RE.match(s)
    if m is None or "__" in m.group(1) + m.group(3) or ("__" in m.group(2) and not _dunder_op(m.group(2))):
        raise GraphDataError(f"node target {s[:120]!r} is not an allowed operator: neither "
                             "'<namespace>::<op>.<overload>' nor one of the Python callables of symbolic shapes")
    ns, op, overload = m.groups()
    if not is_operator_allowed(f"{ns}::{op}", overload):
        raise GraphDataError(f"node target {s!r} is not an operator edgetorch runs: no namespace::op.overload on "
                             "the allow-list (edgetorch.formats.operators) nor registered with "
                             "edgetorch.runtime.ops.register_operator")
    if s in _RESOLVED:
        return _RESOLVED[s]
    found = None
    try:
        found = _lookup(ns, op, overload)
    except (AttributeError, RuntimeError):
        pass
    if found is None and ns in _LAZY_NAMESPACE_MODULES:
        try:
            importlib.import_module(_LAZY_NAMESPACE_MODULES[ns])
            found = _lookup(ns, op, overload)
        except (ImportError, AttributeError, RuntimeError):
            found = None
    if not isinstance(found, torch._ops.OpOverload):
        raise GraphDataError(f"node target {s!r} is not an operator of this torch")
    _RESOLVED[s] = found
    return found


# --- arguments -------------------------------------------------------------------------------------------

def encode_arg(x: Any, depth: int = 0, rename: dict[torch.fx.Node, Any] | None = None) -> Any:
    """The JSON of one node argument; ``rename`` gives the JSON of nodes stored under another form (the nodes
    of an inlined submodule)."""
    if depth > _MAX_DEPTH:
        raise UnsupportedValueError(f"argument nested deeper than {_MAX_DEPTH}")
    if isinstance(x, torch.fx.Node):
        if rename is not None and x in rename:
            return rename[x]
        return {"node": x.name}
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x) if math.isfinite(x) else {"float": repr(float(x))}
    if isinstance(x, list):
        return [encode_arg(v, depth + 1, rename) for v in x]
    if isinstance(x, tuple):
        return {"tuple": [encode_arg(v, depth + 1, rename) for v in x]}
    if isinstance(x, torch.dtype) and x in _NAME_OF:
        return {"dtype": _NAME_OF[x]}
    if isinstance(x, torch.device):
        return {"device": str(x)}
    if isinstance(x, torch.layout) and x in _LAYOUT_NAME:
        return {"layout": _LAYOUT_NAME[x]}
    if isinstance(x, torch.memory_format) and x in _MEMORY_FORMAT_NAME:
        return {"memory_format": _MEMORY_FORMAT_NAME[x]}
    raise UnsupportedValueError(f"argument of type {type(x).__name__} ({str(x)[:60]}) cannot be stored")


def decode_arg(x: Any, env: dict[str, torch.fx.Node], depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise GraphDataError(f"argument nested deeper than {_MAX_DEPTH}")
    if x is None or isinstance(x, (bool, str, float)):
        return x
    if isinstance(x, int):
        if not _INT_MIN <= x < _INT_MAX:
            raise GraphDataError(f"integer argument {x} is out of range")
        return x
    if isinstance(x, list):
        return [decode_arg(v, env, depth + 1) for v in x]
    if isinstance(x, dict) and len(x) == 1:
        (k, v), = x.items()
        if k == "node":
            node = env.get(v) if isinstance(v, str) else None
            if node is None:
                raise GraphDataError(f"argument refers to {str(v)[:80]!r}, not an earlier node")
            return node
        if k == "tuple" and isinstance(v, list):
            return tuple(decode_arg(a, env, depth + 1) for a in v)
        if k == "float" and v in ("inf", "-inf", "nan"):
            return float(v)
        if k == "dtype" and isinstance(v, str) and v in DTYPES:
            return DTYPES[v]
        if k == "device" and isinstance(v, str) and _DEVICE_RE.match(v):
            return torch.device(v)
        if k == "layout" and isinstance(v, str) and v in _LAYOUTS:
            return _LAYOUTS[v]
        if k == "memory_format" and isinstance(v, str) and v in _MEMORY_FORMATS:
            return _MEMORY_FORMATS[v]
    raise GraphDataError(f"malformed argument {json.dumps(x)[:80] if json_ok(x) else type(x).__name__}")


def json_ok(x: Any) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


# --- node metadata -----------------------------------------------------------------------------------------

class Table:
    """Interns repeated values (stack traces, module stacks) into a list; nodes hold indices."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._index: dict[str, int] = {}

    def add(self, value: Any) -> int | None:
        if value is None:
            return None
        key = json.dumps(value, sort_keys=False)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.items)
            self.items.append(value)
        return i


def module_stack_json(stack: Any) -> dict[str, list[str]] | None:
    if not isinstance(stack, dict) or not stack:
        return None
    out: dict[str, list[str]] = {}
    for k, v in stack.items():
        if not (isinstance(k, str) and isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[0], str)):
            return None
        ty = v[1]
        if not isinstance(ty, str):  # a class: its qualified name, as torch.export writes it
            ty = f"{getattr(ty, '__module__', '')}.{getattr(ty, '__qualname__', ty)}"
        out[k] = [v[0], ty]
    return out


def val_json(v: Any, depth: int = 0) -> Any:
    """The shape and dtype of a node's ``meta["val"]`` (FakeTensor or a sequence of them); None if unknown."""
    if isinstance(v, torch.Tensor):
        if v.dtype not in _NAME_OF or not all(type(d) is int for d in v.shape):
            return None
        return {"dtype": _NAME_OF[v.dtype], "shape": [int(d) for d in v.shape]}
    if isinstance(v, (list, tuple)) and depth < 2:
        items = [val_json(x, depth + 1) for x in v]
        return {"seq": items} if any(i is not None for i in items) else None
    return None


def check_table(doc: dict[str, Any], key: str, item_ok: Callable[[Any], bool]) -> list[Any]:
    items = doc[key]
    if not isinstance(items, list) or not all(item_ok(x) for x in items):
        raise GraphDataError(f"{key!r} must be a list of valid entries")
    return items


def module_stack_ok(x: Any) -> bool:
    return isinstance(x, dict) and all(isinstance(k, str) and isinstance(v, list) and len(v) == 2
                                       and isinstance(v[0], str) and isinstance(v[1], str) for k, v in x.items())


def table_index(i: Any, table: list[Any], what: str) -> Any:
    if i is None:
        return None
    if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(table)):
        raise GraphDataError(f"{what} index {i!r} is out of range")
    return table[i]


def check_json_depth(x: Any, what: str) -> None:
    stack = [(x, 0)]
    while stack:
        v, d = stack.pop()
        if d > _MAX_DEPTH:
            raise GraphDataError(f"{what} nested deeper than {_MAX_DEPTH}")
        if isinstance(v, dict):
            stack.extend((c, d + 1) for c in v.values())
        elif isinstance(v, list):
            stack.extend((c, d + 1) for c in v)


def decode_val(spec: Any, cache: dict[tuple, torch.Tensor], depth: int = 0) -> Any:
    """A value spec as meta tensors (one shared meta tensor per distinct shape and dtype)."""
    if spec is None:
        return None
    if isinstance(spec, dict) and set(spec) == {"dtype", "shape"}:
        dtype = DTYPES.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
        shape = spec["shape"]
        if dtype is None or not isinstance(shape, list) or len(shape) > 64 or not all(
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**62 for s in shape):
            raise GraphDataError("malformed value spec")
        key = (dtype, *shape)
        t = cache.get(key)
        if t is None:
            t = cache[key] = torch.empty(shape, dtype=dtype, device="meta")
        return t
    if isinstance(spec, dict) and set(spec) == {"seq"} and isinstance(spec["seq"], list) and depth < 2:
        return tuple(decode_val(s, cache, depth + 1) for s in spec["seq"])
    raise GraphDataError("malformed value spec")


def graph_module_class() -> type[torch.fx.GraphModule]:
    """torch's lazily compiled GraphModule where available: the Python code of a large graph is generated
    on the first call (the Inspector's interpreter never needs it), not while loading."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # pragma: no cover - older / newer torch
        return torch.fx.GraphModule
    return _LazyGraphModule if issubclass(_LazyGraphModule, torch.fx.GraphModule) else torch.fx.GraphModule
