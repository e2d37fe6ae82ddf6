"""Bounded dynamic shapes at compile time: the symbols of an exported program (``torch.export.Dim``), where
each is read from the inputs, and sympy size expressions turned into the .pte expression grammar
(``formats.symexpr``).

Memory is planned at the upper bounds: a dim without a finite max is refused here, naming the input and dim.
Where the upper bounds come from is ``ExecutorchBackendConfig.sym_shape_eval_pass``'s choice: the export
constraints (``ConstraintBasedSymShapeEvalPass``, the default) or the example inputs' sizes
(``HintBasedSymShapeEvalPass``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.utils._sympy.value_ranges import ValueRanges

from edgetorch.errors import ExportError, UnsupportedOpError
from edgetorch.formats import program as pf
from edgetorch.formats import symexpr
from edgetorch.formats.dtypes import storage_nbytes

__all__ = ["SymbolTable", "symbol_table", "is_dynamic_tensor", "sym_tensor_def", "SymShapeEvalPass",
           "ConstraintBasedSymShapeEvalPass", "HintBasedSymShapeEvalPass"]

_MAX_BOUND = 1 << 40  # a "max" this large is no bound at all for planning


def _int_or_none(x) -> int | None:
    try:
        v = int(x)
    except Exception:  # sympy's infinities raise all sorts
        return None
    return v


@dataclass
class SymbolTable:
    """The symbols of one method, in the order they are numbered in the plan."""

    method: str
    symbols: list[pf.SymbolDef] = field(default_factory=list)
    index: dict[sympy.Symbol, int] = field(default_factory=dict)

    @property
    def dynamic(self) -> bool:
        return bool(self.symbols)

    def upper_env(self) -> list[int]:
        return [s.max for s in self.symbols]

    def lower_env(self) -> list[int]:
        return [s.min for s in self.symbols]

    # -- sympy -> JSON expressions ------------------------------------------------------------------
    def encode(self, e, what: str) -> symexpr.Expr:
        """The grammar form of a sympy size expression (or an int)."""
        if isinstance(e, int):
            return e
        if isinstance(e, (torch.SymInt,)):
            e = e.node.expr
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e not in self.index:
                raise UnsupportedOpError(
                    f"method '{self.method}': {what} depends on {e}, a size no input carries (a data-dependent "
                    "size, or a dim derived from one that is not an input dim); the edgetorch runtime plans "
                    "memory for bounded input dims only")
            return ["s", self.index[e]]
        name = type(e).__name__
        args = [self.encode(a, what) for a in e.args]
        if isinstance(e, sympy.Add):
            return ["+", *args]
        if isinstance(e, sympy.Mul):
            return ["*", *args]
        if isinstance(e, sympy.Pow) and isinstance(e.args[1], sympy.Integer) and 0 <= int(e.args[1]) <= 8:
            return ["^", args[0], int(e.args[1])]
        table = {"Max": "max", "Min": "min", "FloorDiv": "//", "Mod": "%", "PythonMod": "%", "CeilDiv": "ceil/",
                 "CleanDiv": "//", "PowByNatural": "^"}
        if name in table:
            return [table[name], *args]
        raise UnsupportedOpError(f"method '{self.method}': {what} has the size expression {e} ({name}), which the "
                                 "edgetorch runtime cannot evaluate")

    def encode_int(self, v, what: str) -> symexpr.Expr:
        if isinstance(v, torch.SymInt):
            c = _int_or_none(v.node.expr) if v.node.expr.is_number else None
            return c if c is not None else self.encode(v.node.expr, what)
        return int(v)

    def bounds(self, e: symexpr.Expr) -> int:
        """The largest value of ``e`` at the lower and the upper bounds of every symbol."""
        return max(symexpr.evaluate(e, self.upper_env()), symexpr.evaluate(e, self.lower_env()))


def _range(ep: ExportedProgram, sym: sympy.Symbol) -> tuple[int, int] | None:
    vr = ep.range_constraints.get(sym)
    if vr is None:
        return None
    lo, hi = _int_or_none(vr.lower), _int_or_none(vr.upper)
    if lo is None or hi is None or hi >= _MAX_BOUND:
        return None
    return max(lo, 0), hi


def symbol_table(ep: ExportedProgram, method: str) -> SymbolTable:
    """Numbers the symbols bound by user input dims (or int inputs), with their ranges; refuses unbounded ones."""
    table = SymbolTable(method)
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    k = -1
    for node in ep.graph.nodes:
        if node.op != "placeholder" or specs[node.name].kind != InputKind.USER_INPUT:
            continue
        k += 1
        val = node.meta.get("val")
        dims = list(enumerate(val.shape)) if isinstance(val, torch.Tensor) else [(-1, val)]
        for d, size in dims:
            if not isinstance(size, torch.SymInt) or not isinstance(size.node.expr, sympy.Symbol):
                continue
            sym = size.node.expr
            if sym in table.index:
                continue
            rng = _range(ep, sym)
            where = f"input '{node.name}'" + (f" dim {d}" if d >= 0 else "")
            if rng is None:
                raise ExportError(f"method '{method}': {where} is dynamic ({sym}) without an upper bound; give its "
                                  "torch.export.Dim a max (edgetorch plans memory at the upper bounds)")
            table.index[sym] = len(table.symbols)
            table.symbols.append(pf.SymbolDef(f"{sym} ({node.name}" + (f".shape[{d}])" if d >= 0 else ")"),
                                              rng[0], rng[1], k, d))
    return table


def is_dynamic_tensor(v: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset()))


def sym_tensor_def(table: SymbolTable, v: torch.Tensor, what: str, dtype_code: int) -> pf.TensorDef:
    """The ``TensorDef`` of a dynamic tensor: sizes/strides/offset at the upper bounds, ``sym_shape`` with their
    expressions, and ``nbytes`` the largest extent at the lower and the upper bounds (what the plan reserves)."""
    sizes = [table.encode_int(s, what) for s in v.shape]
    # a size-1 dim's stride never moves an address (and export may leave a stale symbol there): use 1
    strides = [1 if isinstance(n, int) and n == 1 else table.encode_int(s, what) for n, s in zip(v.shape, v.stride())]
    off = table.encode_int(v.storage_offset(), what)
    nbytes = 0
    for env in (table.lower_env(), table.upper_env()):
        at = [[symexpr.evaluate(e, env) for e in es] for es in (sizes, strides)]
        nbytes = max(nbytes, storage_nbytes(at[0], at[1], symexpr.evaluate(off, env), v.element_size()))
    text = symexpr.dumps({"sizes": sizes, "strides": strides, "offset": off})
    return pf.TensorDef(dtype_code, [table.bounds(e) for e in sizes], [table.bounds(e) for e in strides],
                        table.bounds(off), pf.PLACEMENT_PLANNED, nbytes, sym_shape=text)


def _input_dims(ep: ExportedProgram):
    """``(placeholder name, dim or -1, SymInt)`` for every user-input size that is a plain symbol."""
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    for node in ep.graph.nodes:
        if node.op != "placeholder" or specs[node.name].kind != InputKind.USER_INPUT:
            continue
        val = node.meta.get("val")
        dims = list(enumerate(val.shape)) if isinstance(val, torch.Tensor) else [(-1, val)]
        for d, size in dims:
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                yield node.name, d, size


class SymShapeEvalPass:
    """How ``to_executorch`` bounds a method's dynamic sizes for memory planning
    (``ExecutorchBackendConfig.sym_shape_eval_pass``). ``bound_program(ep, method)`` returns the program whose
    ``range_constraints`` the planner reads (``symbol_table``): every tensor is planned at the largest size those
    ranges allow, and the runtime refuses an input dim outside its symbol's range (naming the input and dim).

    Not a graph pass: ``to_executorch`` applies it (calling it raises ``ExportError``)."""

    def bound_program(self, ep: ExportedProgram, method: str) -> ExportedProgram:
        return ep

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise ExportError(f"{type(self).__name__} is not a graph pass in edgetorch: give it to "
                          "to_executorch(ExecutorchBackendConfig(sym_shape_eval_pass=...)), which plans with it")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ConstraintBasedSymShapeEvalPass(SymShapeEvalPass):
    """Plans each dynamic tensor at the upper bounds of the export constraints (each ``torch.export.Dim``'s
    ``max``): the program runs every size the constraints allow. A dynamic input dim without a finite ``max`` is
    refused (``ExportError`` naming the input and dim). edgetorch's default, as the reference's."""


class HintBasedSymShapeEvalPass(SymShapeEvalPass):
    """Plans each dynamic tensor at the sizes of the example inputs the program was exported with (each input
    symbol's hint): the arena is what the example needs, and the program then accepts an input dim from the
    constraint's ``min`` up to the example's size only (a larger one is refused by the runtime, naming the input,
    dim and bound, instead of overflowing the arena). A dim exported without a ``max`` is bounded by the
    example's size here, though the edge verifier refuses such a program first unless ``to_edge`` ran with
    ``EdgeCompileConfig(_check_ir_validity=False)``. A symbol without a hint (a program deserialized without
    its example shapes) is refused (``ExportError``)."""

    def bound_program(self, ep: ExportedProgram, method: str) -> ExportedProgram:
        ranges = dict(ep.range_constraints)
        for name, d, size in _input_dims(ep):
            sym = size.node.expr
            hint = _int_or_none(size.node.hint) if size.node.has_hint() else None
            where = f"input '{name}'" + (f" dim {d}" if d >= 0 else "")
            if hint is None:
                raise ExportError(f"method '{method}': HintBasedSymShapeEvalPass: {where} ({sym}) has no example "
                                  "size to plan at; use ConstraintBasedSymShapeEvalPass (a Dim with a max)")
            vr = ranges.get(sym)
            lo = _int_or_none(vr.lower) if vr is not None else None
            ranges[sym] = ValueRanges(min(max(lo or 0, 0), hint), hint)
        new = copy.copy(ep)  # shares the graph: only the ranges the planner reads differ
        new._range_constraints = ranges
        return new
