"""ExportedProgram <-> (graph JSON, tensor index JSON, tensor blob), without pickle.

The graph is the torch.export serialization schema as JSON (``torch._export.serde.serialize.serialize`` with the
three pickled companions switched off); the state dict, constants and example inputs are stored by
``_tensors`` and handed to ``ExportedProgramDeserializer`` as ready objects, so torch never sees bytes to
``torch.load``. torch's JSON deserializer is not safe on hostile input either: it runs every symbolic-shape
``expr_str`` through ``sympy.sympify`` (which evaluates Python), resolves ``torch.<anything>`` node targets to
arbitrary callables, and ``treespec_loads`` imports modules named in enum / defaultdict contexts. So the JSON is
checked first (``check_graph_json``) and the rebuilt graph again afterwards (``check_program_targets``).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import logging
import operator
import re
from typing import Any

import torch
from torch.export import ExportedProgram

from edgetorch.devtools.etrecord._lowered_serde import MAX_NESTING, LoweredDataError, encode_lowered, restore_lowered
from edgetorch.devtools.etrecord._tensors import (
    TensorBlobWriter,
    TensorDataError,
    TensorReader,
    UnsupportedValueError,
    check_treespec,
    decode_tree,
    encode_tree,
    portable_spec,
)
from edgetorch.runtime.ops import is_operator_allowed, operator_key

log = logging.getLogger(__name__)


def _serde() -> Any:
    """``torch._export.serde.serialize``, imported on first use: it pulls in torch._dynamo (seconds), and
    ``parse_etrecord`` must not pay for it until a program is actually deserialized."""
    from torch._export.serde import serialize

    return serialize

# --- checks on the graph JSON -----------------------------------------------------------------------------

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_TARGET_RE = re.compile(
    rf"^(?:torch\.ops\.(?P<ns>{_IDENT})\.(?P<op>{_IDENT})(?:\.(?P<overload>{_IDENT}))?"  # torch.ops.<ns>.<op>[.<ov>]
    r"|_operator\.[a-z_]+|math\.[a-z_0-9]+|torch\.(?:sym_[a-z_]+|_sym_[a-z0-9_]+))$")
_DUNDER_OP_RE = re.compile(r"^__[a-z][a-z0-9]*(?:_[a-z0-9]+)*__$")  # aten::__and__, aten::__irshift__, ...
_SYMBOL_RE = re.compile(r"^(?:s|u|zf|zuf|ps)\d+$")
_FLOAT_STR_RE = re.compile(r"^-?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)$", re.IGNORECASE)
# sympy classes printed by srepr (torch writes expr_str with srepr) and torch.utils._sympy.functions
_EXPR_CALLS = {
    "Add", "Mul", "Pow", "Symbol", "Integer", "Rational", "Float", "Max", "Min", "Abs", "Mod", "floor", "ceiling",
    "sqrt", "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan", "Eq", "Ne",
    "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "Piecewise", "ExprCondPair",
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator",
    "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
}
_POWER_CALLS = {"Pow", "PowByNatural", "FloatPow", "LShift"}  # pure-number arguments would evaluate huge ints
_EXPR_NAMES = {"oo", "zoo", "nan", "true", "false", "pi", "E"}
_ASSUMPTIONS = {
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "extended_real", "rational", "finite",
    "infinite", "zero", "nonzero", "even", "odd", "prime", "composite", "commutative", "complex", "imaginary",
    "extended_positive", "extended_negative", "extended_nonnegative", "extended_nonpositive", "extended_nonzero",
}
_EXPR_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
             ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.And, ast.Or, ast.BitAnd, ast.BitOr)
_MAX_EXPR_CHARS = 65536
_MAX_EXPR_DEPTH = 100


_INDEX_KEYS = {"state_dict", "constants", "example_inputs"}


class ProgramDataError(ValueError):
    """Bad or unsafe serialized program; the caller names the zip entry."""


def _has_symbol(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Symbol"
               or isinstance(n, ast.Name) and _SYMBOL_RE.match(n.id) for n in ast.walk(node))


def _check_expr_node(node: ast.AST, depth: int) -> None:
    if depth > _MAX_EXPR_DEPTH:
        raise ProgramDataError("nests too deeply")
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _EXPR_CALLS:
            raise ProgramDataError(f"call of {ast.dump(node.func)[:60]} is not allowed")
        if name in _POWER_CALLS and not _has_symbol(node):
            raise ProgramDataError(f"{name} of plain numbers is not allowed")
        for kw in node.keywords:
            if name == "Symbol" and kw.arg in _ASSUMPTIONS and isinstance(kw.value, ast.Constant) \
                    and isinstance(kw.value.value, bool):
                continue
            if name == "Float" and kw.arg == "precision" and isinstance(kw.value, ast.Constant) \
                    and type(kw.value.value) is int and 0 < kw.value.value <= 1024:
                continue
            raise ProgramDataError(f"keyword {kw.arg!r} of {name} is not allowed")
        for i, arg in enumerate(node.args):
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                ok = (name == "Symbol" and i == 0 and _SYMBOL_RE.match(arg.value)) or \
                     (name in ("Float", "Integer", "Rational") and _FLOAT_STR_RE.match(arg.value))
                if not ok:
                    raise ProgramDataError(f"string {arg.value[:40]!r} is not allowed as argument {i} of {name}")
                continue
            _check_expr_node(arg, depth + 1)
        return
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (bool, int, float)):
            if type(node.value) is int and abs(node.value) > 10**400:
                raise ProgramDataError("integer literal too large")
            return
        raise ProgramDataError(f"constant {node.value!r:.40} is not allowed")
    if isinstance(node, ast.Name):
        if node.id in _EXPR_NAMES or _SYMBOL_RE.match(node.id):
            return
        raise ProgramDataError(f"name {node.id!r} is not allowed")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not _has_symbol(node):
        raise ProgramDataError("powers of plain numbers are not allowed")
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare)):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.operator | ast.unaryop | ast.boolop | ast.cmpop):
                if not isinstance(child, _EXPR_OPS):
                    raise ProgramDataError(f"operator {type(child).__name__} is not allowed")
                continue
            _check_expr_node(child, depth + 1)
        return
    raise ProgramDataError(f"{type(node).__name__} is not allowed")


def check_sym_expr(expr: Any) -> None:
    """torch hands ``expr_str`` to ``sympy.sympify``, which evaluates it as Python. Only an expression made of
    sympy constructors (as ``srepr`` prints them: ``Add(Symbol('s0', positive=True), Integer(1))``), shape
    symbols, numbers and arithmetic / comparison operators gets through; the check parses with ``ast`` and
    never evaluates anything."""
    if not isinstance(expr, str) or len(expr) > _MAX_EXPR_CHARS:
        raise ProgramDataError(f"symbolic expression must be a string of at most {_MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise ProgramDataError(f"symbolic expression {expr[:80]!r} is not an expression") from None
    try:
        _check_expr_node(tree.body, 0)
    except ProgramDataError as e:
        raise ProgramDataError(f"symbolic expression {expr[:80]!r}: {e}") from None


def check_target(target: Any) -> None:
    """A node target torch's deserializer may look up (it walks ``getattr`` from the ``torch`` / ``operator`` /
    ``math`` module): ``torch.ops.<ns>.<op>[.<overload>]``, ``_operator.*``, ``math.*``, ``torch.sym_*``. A
    double underscore is allowed only as a whole ATen Python-operator name (``torch.ops.aten.__and__.Tensor``)
    that is not an attribute of the op namespace class, so the walk can only reach an operator."""
    m = _TARGET_RE.match(target) if isinstance(target, str) else None
    ok = m is not None and (m.group("ns") is None or _op_path_ok(m.group("ns"), m.group("op"), m.group("overload")))
    if not ok or (m.group("ns") is None and "__" in target):
        raise ProgramDataError(f"node target {str(target)[:120]!r} is not an operator")


def _op_path_ok(ns: str, op: str, overload: str | None) -> bool:
    if "__" in ns or (overload is not None and "__" in overload):
        return False
    if "__" in op:
        # an attribute of the namespace class (its MRO, not the metaclass: ``type.__or__`` is no attribute of an
        # instance) would be returned by getattr instead of an operator
        return bool(_DUNDER_OP_RE.match(op)) and not any(op in vars(k) for k in torch._ops._OpNamespace.__mro__)
    return True


def check_graph_json(doc: Any) -> bool:
    """Walks the whole serialized program: node targets, symbolic expressions and treespecs. Treespec nodes of
    types outside the plain containers are rewritten in place as ``ForeignContainer`` nodes (``check_treespec``);
    returns True when something was rewritten (the caller must then hand torch the re-encoded document)."""
    changed = False
    if not isinstance(doc, dict) or not isinstance(doc.get("graph_module"), dict):
        raise ProgramDataError("not a serialized ExportedProgram (no 'graph_module')")
    stack: list[Any] = [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if "target" in x and "inputs" in x and "outputs" in x:
                check_target(x["target"])
            for k, v in x.items():
                if k == "expr_str":
                    check_sym_expr(v)
                elif k in ("in_spec", "out_spec") and v is not None:
                    try:
                        safe = check_treespec(v, k)
                    except TensorDataError as e:
                        raise ProgramDataError(str(e)) from None
                    if safe is not v:
                        x[k] = safe
                        changed = True
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(x, list):
            stack.extend(v for v in x if isinstance(v, (dict, list)))
    return changed


#: higher-order operators a stored program may call: ``cond`` (its branches are submodules of the program, checked
#: like it) and the delegate call (its lowered module is the program's own attribute); any other (``map``,
#: ``while_loop``, ``auto_functionalized`` calling an operator passed as an argument, ...) is refused by name
_ALLOWED_HIGHER_ORDER = frozenset({"cond", "executorch_call_delegate"})


def _allowed_callable(t: Any) -> bool:
    if isinstance(t, torch._ops.OpOverload):  # the runtime's allow-list, or an operator the user registered
        name, _, overload = operator_key(t).rpartition(".")
        return is_operator_allowed(name, overload)
    if isinstance(t, torch._ops.HigherOrderOperator):  # only those whose every callee the program itself holds
        return t.name() in _ALLOWED_HIGHER_ORDER
    try:
        return t is operator.getitem or t in _serde()._SYM_OPS
    except TypeError:  # unhashable
        return False


def check_program_targets(ep: ExportedProgram) -> None:
    """Every ``call_function`` node of the rebuilt program (and its submodules) must call an operator."""
    for gm in ep.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            if node.op == "call_function" and not _allowed_callable(node.target):
                raise ProgramDataError(f"node {node.name!r} calls {node.target!r}, which is not an operator edgetorch "
                                       "runs (edgetorch.formats.operators, edgetorch.runtime.ops.register_operator)")
            if node.op in ("call_method", "call_module"):
                raise ProgramDataError(f"node {node.name!r} is a {node.op}, not allowed in an exported program")


# --- write ------------------------------------------------------------------------------------------------

def _encode_tensor_dict(d: dict[str, Any], blobs: TensorBlobWriter, what: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, t in d.items():
        if not isinstance(t, torch.Tensor):
            raise UnsupportedValueError(f"{what} {name!r} is a {type(t).__name__}; only tensors can be stored")
        out.append({"name": name, "param": isinstance(t, torch.nn.Parameter), "requires_grad": t.requires_grad,
                    "tensor": blobs.add(t, f"{what} {name!r}")})
    return out


def _portable_call_graph(ep: ExportedProgram) -> ExportedProgram:
    """``ep``, or a shallow copy whose module call graph has ``portable_spec`` treespecs: input/output
    containers that torch cannot serialize by name (a structseq, a namedtuple or dataclass registered without
    a serialized name) are stored as ``ForeignContainer`` nodes naming their type."""
    entries = list(ep.module_call_graph)
    new = []
    for e in entries:
        sig = e.signature
        if sig is None:
            new.append(e)
            continue
        ins = portable_spec(sig.in_spec) if sig.in_spec is not None else None
        outs = portable_spec(sig.out_spec) if sig.out_spec is not None else None
        if ins is sig.in_spec and outs is sig.out_spec:
            new.append(e)
        else:
            new.append(dataclasses.replace(e, signature=dataclasses.replace(sig, in_spec=ins, out_spec=outs)))
    if all(a is b for a, b in zip(new, entries, strict=True)):
        return ep
    out = copy.copy(ep)
    out._module_call_graph = new
    return out


def serialize_program(ep: ExportedProgram, what: str, blobs: TensorBlobWriter, _depth: int = 0
                      ) -> tuple[bytes, bytes]:
    """Returns (graph JSON, tensor index JSON); tensors go to ``blobs``. Raises ``UnsupportedValueError`` /
    ``ProgramDataError`` with a message naming ``what`` when the program cannot be stored. The lowered modules
    of a delegated program go to the index (``_lowered_serde``)."""
    def nested(sub: ExportedProgram, where: str) -> tuple[Any, Any]:
        if _depth >= MAX_NESTING:
            raise ProgramDataError(f"{where}: lowered modules nest more than {MAX_NESTING} levels deep")
        g, i = serialize_program(sub, where, blobs, _depth + 1)
        return json.loads(g), json.loads(i)

    lowered = encode_lowered(ep, blobs, what, nested)
    index: dict[str, Any] = {
        "state_dict": _encode_tensor_dict(dict(ep.state_dict), blobs, f"{what}: state_dict entry"),
        "constants": _encode_tensor_dict(dict(ep.constants), blobs, f"{what}: constant"),
        "example_inputs": None,
    }
    if ep.example_inputs is not None:
        try:
            index["example_inputs"] = encode_tree(ep.example_inputs, blobs, f"{what}: example_inputs")
        except UnsupportedValueError as e:
            log.warning("ETRecord: example inputs of %s not stored: %s", what, e)
    try:
        art = _serde().serialize(_portable_call_graph(ep), serialize_state_dict=False, serialize_constants=False,
                              serialize_example_inputs=False)
    except Exception as e:
        raise ProgramDataError(f"{what}: torch.export cannot serialize this program "
                               f"({type(e).__name__}: {e})") from e
    if lowered:
        index["lowered_modules"] = lowered
    return art.exported_program, json.dumps(index, separators=(",", ":")).encode()


# --- read -------------------------------------------------------------------------------------------------

def _decode_tensor_dict(items: Any, reader: TensorReader, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(items, list):
        raise ProgramDataError(f"{what} must be a list")
    out: dict[str, torch.Tensor] = {}
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("name"), str) or it["name"] in out:
            raise ProgramDataError(f"{what}: entry without a (unique) string name")
        name = it["name"]
        if set(it) != {"name", "param", "requires_grad", "tensor"} or not isinstance(it["param"], bool) \
                or not isinstance(it["requires_grad"], bool):
            raise ProgramDataError(f"{what} {name!r}: malformed entry")
        out[name] = reader.read(it["tensor"], f"{what} {name!r}", it["param"], it["requires_grad"])
    return out


def deserialize_program(graph_json: bytes, index_json: bytes, reader: TensorReader,
                        names: tuple[str, str], _depth: int = 0) -> ExportedProgram:
    """Rebuilds a program (with its lowered modules) from its entries ``names`` = (graph, index), tensors from
    ``reader``. Raises ``ProgramDataError`` whose ``args[1]`` is the entry at fault."""
    g_name, i_name = names
    try:
        doc = json.loads(graph_json)
        if check_graph_json(doc):
            graph_json = json.dumps(doc, separators=(",", ":")).encode()
    except (ValueError, RecursionError) as e:
        raise ProgramDataError(f"{e}", g_name) from None
    try:
        index = json.loads(index_json)
        if not isinstance(index, dict) or not _INDEX_KEYS <= set(index) <= {*_INDEX_KEYS, "lowered_modules"}:
            raise ProgramDataError("tensor index must hold exactly state_dict, constants and example_inputs "
                                   "(and lowered_modules)")
        state_dict = _decode_tensor_dict(index["state_dict"], reader, "state_dict entry")
        constants = _decode_tensor_dict(index["constants"], reader, "constant")
        example_inputs = None
        if index["example_inputs"] is not None:
            example_inputs = decode_tree(index["example_inputs"], reader, "example_inputs")
            if not (isinstance(example_inputs, tuple) and len(example_inputs) == 2
                    and isinstance(example_inputs[0], tuple) and isinstance(example_inputs[1], dict)):
                raise ProgramDataError("example_inputs must be (args tuple, kwargs dict)")
    except (ValueError, RecursionError) as e:
        raise ProgramDataError(f"{e}", i_name) from None
    serde = _serde()
    try:
        ep = serde.deserialize(serde.SerializedArtifact(graph_json, state_dict, constants,  # type: ignore[arg-type]
                                                        example_inputs))
    except Exception as e:
        raise ProgramDataError(f"torch.export cannot rebuild the program ({type(e).__name__}: {e})",
                               g_name) from None
    try:
        check_program_targets(ep)
    except ProgramDataError as e:
        raise ProgramDataError(str(e), g_name) from None
    _restore_lowered(ep, index.get("lowered_modules", []), reader, names, _depth)
    return ep


def _restore_lowered(ep: ExportedProgram, items: Any, reader: TensorReader, names: tuple[str, str],
                     depth: int) -> None:
    def build(graph: Any, index: Any) -> ExportedProgram:
        if depth >= MAX_NESTING:
            raise LoweredDataError(f"lowered modules nest more than {MAX_NESTING} levels deep")
        return deserialize_program(json.dumps(graph).encode(), json.dumps(index).encode(), reader, names,
                                   depth + 1)

    try:
        restore_lowered(ep, items, reader, build)
    except (ValueError, RecursionError) as e:
        raise ProgramDataError(f"lowered modules: {e.args[0] if e.args else e}", names[1]) from None
