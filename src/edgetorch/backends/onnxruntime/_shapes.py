"""Dynamic shapes of the onnxruntime delegate at run time, without the compiler (no sympy, no torch.export).

A blob records each shape as a list of dims: an ``int`` for a static dim, a string for a dynamic one: the
symbol (``"s27"``, the ONNX ``dim_param``) or an integer expression of symbols as sympy prints it (``"2*s27"``,
``"(s27//2)"``, ``"Max(1, s27)"``). ``bind`` reads the value of every symbol from the dims of the actual inputs
(checking static dims, consistency and the ``dims`` bounds), and ``resolve`` evaluates a shape for this run.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Sequence
from typing import Any

from edgetorch.errors import RuntimeInputError

Dim = int | str
_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_CALLS: dict[str, Callable[..., int]] = {
    "Max": max, "Min": min, "Mod": operator.mod, "PythonMod": operator.mod, "FloorDiv": operator.floordiv,
    "CleanDiv": operator.floordiv,
}


class UnsupportedDimError(ValueError):
    """A dim expression uses something this evaluator does not know (the caller falls back to learning the
    shape from a run)."""


def _eval(node: ast.AST, env: dict[str, int]) -> int:
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise UnsupportedDimError(f"symbol {node.id} is not bound by any input dim")
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS \
            and not node.keywords:
        return int(_CALLS[node.func.id](*(_eval(a, env) for a in node.args)))
    raise UnsupportedDimError(f"unsupported dim expression element {ast.dump(node)[:60]}")


def eval_dim(dim: Dim, env: dict[str, int]) -> int:
    """The value of one dim for the symbol values ``env``; ``UnsupportedDimError`` if it cannot be computed."""
    if isinstance(dim, int):
        return dim
    try:
        tree = ast.parse(dim, mode="eval")
    except SyntaxError:
        raise UnsupportedDimError(f"dim expression {dim!r} does not parse") from None
    return _eval(tree, env)


def resolve(shape: Sequence[Dim], env: dict[str, int]) -> tuple[int, ...]:
    """A recorded shape evaluated for this run."""
    return tuple(eval_dim(d, env) for d in shape)


def bind(inputs: Sequence[dict[str, Any]], shapes: Sequence[Sequence[int]],
         bounds: dict[str, Sequence[int | None]]) -> dict[str, int]:
    """Symbol values from the actual input ``shapes`` (``inputs``: the blob's ``{name, shape}`` entries).

    Raises ``RuntimeInputError`` naming the input and dim when a rank or a static dim differs, when two dims of
    one symbol disagree, or when a symbol lies outside its ``bounds`` ``[min, max]`` (max None: unbounded)."""
    env: dict[str, int] = {}
    for spec, shape in zip(inputs, shapes):
        want, name = spec.get("shape"), spec.get("name")
        if want is None:
            continue
        if len(want) != len(shape):
            raise RuntimeInputError(f"onnxruntime delegate input '{name}' has rank {len(shape)} "
                                    f"(shape {list(shape)}), the delegate was built for rank {len(want)} {want}")
        for d, (w, got) in enumerate(zip(want, shape)):
            if isinstance(w, int):
                if w >= 0 and w != got:
                    raise RuntimeInputError(f"onnxruntime delegate input '{name}' dim {d} is {got}, the delegate "
                                            f"was built for {w} (shape {want})")
            elif w.isidentifier():
                if env.setdefault(w, got) != got:
                    raise RuntimeInputError(f"onnxruntime delegate input '{name}' dim {d} is {got}, but dim {w} "
                                            f"is {env[w]} in an earlier input")
                lo, hi = (list(bounds.get(w) or [None, None]) + [None, None])[:2]
                if (lo is not None and got < lo) or (hi is not None and got > hi):
                    raise RuntimeInputError(f"onnxruntime delegate input '{name}' dim {d} ({w}) is {got}, outside "
                                            f"its bounds [{lo}, {'inf' if hi is None else hi}]")
    for spec, shape in zip(inputs, shapes):  # dims that are expressions of bound symbols
        for d, (w, got) in enumerate(zip(spec.get("shape") or (), shape)):
            if isinstance(w, str) and not w.isidentifier():
                try:
                    value = eval_dim(w, env)
                except UnsupportedDimError:
                    continue
                if value != got:
                    raise RuntimeInputError(f"onnxruntime delegate input '{spec.get('name')}' dim {d} is {got}, "
                                            f"but {w} = {value} for the other inputs")
    return env
