"""Symbolic size expressions of bounded dynamic shapes: the JSON grammar stored in .pte files, its checker and
its evaluator.

An expression is JSON: an integer literal; ``["s", k]``, the value of the plan's symbol ``k``; or an operator
list ``[op, a, b, ...]`` with ``op`` one of ``+`` and ``*`` (any number of operands), ``//`` and ``%`` (floor
division and modulo, two operands, divisor never zero at run time), ``max`` and ``min`` (one or more), ``^``
(power with a non-negative literal exponent) and ``ceil/`` (ceiling division). Parsing is ``json.loads`` and a
walk over lists and ints: nothing from a file is evaluated as code. ``compile_expr`` turns a checked expression
into a closure over a list of symbol values, so a run evaluates sizes without re-walking the JSON.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

from edgetorch.formats.errors import ProgramFormatError

__all__ = ["Expr", "Env", "Compiled", "MAX_DEPTH", "MAX_LITERAL", "check_expr", "compile_expr", "parse_expr",
           "parse_expr_list", "parse_sym_shape", "dumps", "evaluate"]

Expr = Any  # int | list
Env = Sequence[int]
Compiled = Callable[[Env], int]

MAX_DEPTH = 64
MAX_LITERAL = 1 << 62
_NARY = {"+": operator.add, "*": operator.mul, "max": max, "min": min}


def _floordiv(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero in a symbolic size")
    return a // b


def _mod(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("modulo by zero in a symbolic size")
    return a % b


def _ceildiv(a: int, b: int) -> int:
    return -_floordiv(-a, b)


_BINARY = {"//": _floordiv, "%": _mod, "ceil/": _ceildiv}


def check_expr(e: Any, num_symbols: int, where: str, depth: int = 0) -> None:
    """Raises ``ProgramFormatError`` naming ``where`` unless ``e`` follows the grammar."""
    if depth > MAX_DEPTH:
        raise ProgramFormatError(f"{where}: symbolic expression nested deeper than {MAX_DEPTH}", field=where)
    if isinstance(e, bool) or (not isinstance(e, (int, list))):
        raise ProgramFormatError(f"{where}: symbolic expression item {e!r} is not an int or a list", field=where)
    if isinstance(e, int):
        if abs(e) > MAX_LITERAL:
            raise ProgramFormatError(f"{where}: literal {e} is out of range", field=where)
        return
    if not e or not isinstance(e[0], str):
        raise ProgramFormatError(f"{where}: symbolic expression {e!r} has no operator", field=where)
    op, args = e[0], e[1:]
    if op == "s":
        if len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], int) \
                or not 0 <= args[0] < num_symbols:
            raise ProgramFormatError(f"{where}: symbol reference {e!r} is not one of the plan's {num_symbols} "
                                     "symbols", field=where)
        return
    if op in _NARY:
        ok = len(args) >= 1
    elif op in _BINARY:
        ok = len(args) == 2
    elif op == "^":
        ok = len(args) == 2 and isinstance(args[1], int) and not isinstance(args[1], bool) and 0 <= args[1] <= 8
    else:
        raise ProgramFormatError(f"{where}: unknown operator {op!r} in a symbolic expression", field=where)
    if not ok:
        raise ProgramFormatError(f"{where}: operator {op!r} has the wrong operands {args!r}", field=where)
    for a in args:
        check_expr(a, num_symbols, where, depth + 1)


def compile_expr(e: Expr) -> Compiled:
    """A closure evaluating a checked expression on a list of symbol values."""
    if isinstance(e, int):
        return lambda env, v=e: v
    op, args = e[0], e[1:]
    if op == "s":
        return lambda env, k=args[0]: env[k]
    if op == "^":
        base, n = compile_expr(args[0]), args[1]
        return lambda env: base(env) ** n
    subs = [compile_expr(a) for a in args]
    if op in _NARY:
        f = _NARY[op]
        return lambda env: reduce(f, (s(env) for s in subs))
    f2 = _BINARY[op]
    a, b = subs
    return lambda env: f2(a(env), b(env))


def parse_expr(text: str, num_symbols: int, where: str) -> Expr:
    """A JSON expression from a file, checked."""
    try:
        e = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ProgramFormatError(f"{where}: symbolic expression is not valid JSON ({err})", field=where) from None
    check_expr(e, num_symbols, where)
    return e


def parse_expr_list(text: str, num_symbols: int, where: str) -> list[Expr]:
    try:
        items = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ProgramFormatError(f"{where}: symbolic list is not valid JSON ({err})", field=where) from None
    if not isinstance(items, list):
        raise ProgramFormatError(f"{where}: symbolic list is not a JSON list", field=where)
    for e in items:
        check_expr(e, num_symbols, where)
    return items


def parse_sym_shape(text: str, rank: int, num_symbols: int, where: str) -> tuple[list, list, Expr]:
    """(sizes, strides, storage offset) expressions of a tensor's ``sym_shape``, checked against its rank."""
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ProgramFormatError(f"{where}: sym_shape is not valid JSON ({err})", field=where) from None
    if not isinstance(d, dict) or set(d) != {"sizes", "strides", "offset"}:
        raise ProgramFormatError(f"{where}: sym_shape must be an object with sizes, strides and offset",
                                 field=where)
    sizes, strides, off = d["sizes"], d["strides"], d["offset"]
    if not isinstance(sizes, list) or not isinstance(strides, list) or len(sizes) != rank or len(strides) != rank:
        raise ProgramFormatError(f"{where}: sym_shape sizes/strides must be lists of {rank} expressions",
                                 field=where)
    for e in (*sizes, *strides, off):
        check_expr(e, num_symbols, where)
    return sizes, strides, off


def dumps(e: Expr) -> str:
    return json.dumps(e, separators=(",", ":"))


def evaluate(e: Expr, env: Env) -> int:
    return compile_expr(e)(env)
