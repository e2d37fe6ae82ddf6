"""Bounded dynamic shapes at run time: read the plan's symbols from the inputs, check their bounds, and reshape
every dynamic value in place before the instructions run.

A method with symbols is loaded at its upper bounds. Each ``execute`` then (1) reads every symbol from its
input dim and checks it against ``[min, max]``, naming the input, dim and bound; (2) re-evaluates the symbolic
ints (scalar boxes and int lists bound into the compiled calls are updated in place); (3) points every dynamic
planned tensor at its arena bytes with this run's sizes and strides (``Tensor.set_`` keeps the objects the
compiled calls hold), refusing any that would outgrow its planned bytes; (4) re-runs the view instructions so
aliases follow their bases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from edgetorch.errors import ProgramFormatError, RuntimeInputError
from edgetorch.formats import program as pf
from edgetorch.formats import symexpr
from edgetorch.formats.dtypes import code_dtype, storage_nbytes
from edgetorch.formats.plan_check import elements_overlap


class SymScalar:
    """A symbolic int bound into a compiled call: its value is refreshed every run."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"SymScalar({self.value})"


def resolve(x: Any) -> Any:
    return x.value if isinstance(x, SymScalar) else x


def with_sym_args(fn: Callable) -> Callable:
    """``fn`` called with every ``SymScalar`` argument replaced by its current value."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*[resolve(a) for a in args], **{k: resolve(v) for k, v in kwargs.items()})
    return call


@dataclass
class _Tensor:
    vid: int
    sizes: list[symexpr.Compiled]
    strides: list[symexpr.Compiled]
    offset: symexpr.Compiled
    base: int  # element offset of the tensor's storage start in the arena
    nbytes: int


class ShapeBinder:
    """The dynamic part of one method: symbols, symbolic values and the views to re-run each execute."""

    def __init__(self, plan: pf.PlanDef, method: str) -> None:
        self.method = method
        self.symbols = plan.symbols
        n = len(self.symbols)
        self.upper = [s.max for s in self.symbols]
        self.env = list(self.upper)
        self.scalars: list[tuple[SymScalar, symexpr.Compiled]] = []
        self.lists: list[tuple[list, list[symexpr.Compiled]]] = []
        self.tensors: list[_Tensor] = []
        self.views: list[Callable[[], None]] = []
        self._n = n
        # the tensors kernels write (and inputs, copied into): no two of their elements may share an address
        self.written = {o for ins in plan.instructions if isinstance(ins.call, pf.KernelCallDef)
                        and ins.call.kind != pf.CALL_VIEW for o in ins.call.outputs} | set(plan.inputs)

    # -- built while the method loads ---------------------------------------------------------------
    def scalar(self, v: pf.SymIntV, where: str) -> SymScalar:
        f = symexpr.compile_expr(symexpr.parse_expr(v.expr, self._n, where))
        box = SymScalar(self._eval(f, where))
        self.scalars.append((box, f))
        return box

    def int_list(self, v: pf.SymIntListV, where: str) -> list[int]:
        fs = [symexpr.compile_expr(e) for e in symexpr.parse_expr_list(v.exprs, self._n, where)]
        items = [self._eval(f, where) for f in fs]
        self.lists.append((items, fs))
        return items

    def tensor(self, vid: int, t: pf.TensorDef, base: int, where: str) -> tuple[list[int], list[int], int]:
        """Registers a dynamic planned tensor whose storage starts at element ``base`` of the arena; returns its
        (sizes, strides, offset) at the upper bounds."""
        sizes, strides, off = symexpr.parse_sym_shape(t.sym_shape, len(t.sizes), self._n, where)
        c = _Tensor(vid, [symexpr.compile_expr(e) for e in sizes], [symexpr.compile_expr(e) for e in strides],
                    symexpr.compile_expr(off), base, t.nbytes)
        shape = self._shape(c, where)
        self._check_extent(c, shape, code_dtype(t.scalar_type).itemsize, where)
        self.tensors.append(c)
        return shape

    def _eval(self, f: symexpr.Compiled, where: str) -> int:
        try:
            return f(self.env)
        except ZeroDivisionError as e:
            raise ProgramFormatError(f"method '{self.method}': {where}: {e}", field=where) from None

    def _shape(self, c: _Tensor, where: str) -> tuple[list[int], list[int], int]:
        return ([self._eval(f, where) for f in c.sizes], [self._eval(f, where) for f in c.strides],
                self._eval(c.offset, where))

    def _check_extent(self, c: _Tensor, shape: tuple, itemsize: int, where: str) -> None:
        sizes, strides, off = shape
        if min(sizes, default=0) < 0 or min(strides, default=0) < 0 or off < 0 or \
                storage_nbytes(sizes, strides, off, itemsize) > c.nbytes:
            raise ProgramFormatError(
                f"method '{self.method}': {where} with sizes {sizes} would span more than its planned {c.nbytes} "
                "bytes", field=where)
        if c.vid in self.written and elements_overlap(sizes, strides):  # the static check saw the upper bounds
            raise ProgramFormatError(
                f"method '{self.method}': {where} with sizes {sizes} and strides {strides} has elements sharing "
                "memory; kernels cannot write it (the file is inconsistent: corrupted or edited?)", field=where)

    # -- every run ------------------------------------------------------------------------------------
    def bind(self, flat: list) -> None:
        """Reads each symbol from the inputs (before they are copied) and checks its bounds."""
        env = self.env
        for k, s in enumerate(self.symbols):
            x = flat[s.input]
            if s.dim < 0:
                if not isinstance(x, int) or isinstance(x, bool):
                    raise RuntimeInputError(f"method '{self.method}': input {s.input} must be an int "
                                            f"(dynamic {s.name}), got {type(x).__name__}")
                v = x
            else:
                if not isinstance(x, torch.Tensor) or x.dim() <= s.dim:
                    raise RuntimeInputError(f"method '{self.method}': input {s.input} must be a tensor with at "
                                            f"least {s.dim + 1} dims (dynamic {s.name})")
                v = int(x.shape[s.dim])
            if not s.min <= v <= s.max:
                raise RuntimeInputError(
                    f"method '{self.method}': dynamic dim {s.name} is {v}, outside its bounds [{s.min}, {s.max}] "
                    "the program was planned for (torch.export.Dim min/max, or the example's sizes under "
                    "HintBasedSymShapeEvalPass)")
            env[k] = v

    def apply(self, slots: list, arena_views: Callable[[torch.dtype], torch.Tensor]) -> None:
        """Reshapes every dynamic value for the symbols ``bind`` read."""
        env = self.env
        for box, f in self.scalars:
            box.value = f(env)
        for items, fs in self.lists:
            for i, f in enumerate(fs):
                items[i] = f(env)
        for c in self.tensors:
            t = slots[c.vid]
            shape = self._shape(c, f"value {c.vid}")
            self._check_extent(c, shape, t.element_size(), f"value {c.vid}")
            base = arena_views(t.dtype)
            t.set_(base.untyped_storage(), c.base + shape[2], shape[0], shape[1])
        for view in self.views:
            view()
