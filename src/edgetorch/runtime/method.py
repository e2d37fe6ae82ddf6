"""A loaded method: its values bound to the arena and constants, and its instructions compiled into a flat
list of calls.

``load_method`` does all the work that does not depend on the inputs: arena tensors are created once with the
exact sizes/strides the compiler planned, constants are viewed in place from the mapped file, view ops are
evaluated once (their outputs are fixed aliases of planned or constant storage), an instruction that computes
the same every run (a deterministic op of constants only: the dequantized int8 weight of a quantized program) is
run once and kept in memory of its own (its call becomes a no-op; a tracer still logs its outputs; the float
copy of such weights stays resident), and every kernel call is bound to its arguments with
``functools.partial``. ``execute`` then copies the inputs into their planned slots, runs
the calls and clones the outputs out of the arena.

``execute`` follows the reference runtime: it takes the flat inputs (a sequence, or positional and keyword
arguments as the model took them) and returns a flat list of outputs, so a program runs without the model's
Python classes; ``method(*args, **kwargs)`` returns the model's own output structure instead. Non-tensor inputs
that export specialised must be passed with the value they were exported with. Methods with bounded dynamic
shapes are reshaped for each call (``runtime._shapes``); mutable buffers live in the ``Program`` (shared by its
methods) until ``reset()``.

Tools watch a run through one documented hook: an optional ``MethodObserver`` (``runtime.observer``) that the
run loop calls before and after each instruction; the ETDump tracer is one.

Threads: one ``Method`` runs one call at a time (``execute`` holds a lock: its arena, state and observer are
shared); the methods of a program with mutable buffers share one lock (the program's state), and a traced
program runs one method at a time (its tracer is the program's). Calls are serialised, not sequences of calls: two
threads generating on one stateful program still see each other's cache updates between their calls; give each
its own ``load_program`` (or ``reset()`` inside one lock of your own). Load the program twice to run in parallel.
"""

from __future__ import annotations

import collections
import functools
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from edgetorch.errors import DebugBufferOverflowError, KernelError, ProgramFormatError, RuntimeInputError
from edgetorch.formats import plan_check
from edgetorch.formats import program as pf
from edgetorch.formats.dtypes import CODE_TO_LAYOUT, CODE_TO_MEMORY_FORMAT, code_dtype
from edgetorch.formats.operators import ZERO_FILLED_ALLOCATIONS
from edgetorch.runtime import _treespec, _unplanned, control_flow
from edgetorch.runtime._arena import allocate_arena as _allocate_arena
from edgetorch.runtime._arena import shape_text as _shape_text
from edgetorch.runtime._arena import strided as _strided
from edgetorch.runtime._arena import sym_sizes as _sym_sizes
from edgetorch.runtime._copy import clone
from edgetorch.runtime._inputs import bind_keywords, check_tensor_input
from edgetorch.runtime._load_checks import check_kernel, check_operators, first_run_calls
from edgetorch.runtime._shapes import ShapeBinder, SymScalar, resolve, with_sym_args
from edgetorch.runtime.backend_registry import get_backend, observe_delegate
from edgetorch.runtime.observer import MethodObserver
from edgetorch.runtime.ops import direct_functional, direct_kernel

__all__ = ["TensorInfo", "ValueInfo", "MethodMeta", "InstructionInfo", "Method"]

_STATIC_CHECKED = (pf.PLACEMENT_PLANNED, pf.PLACEMENT_CONSTANT, pf.PLACEMENT_MUTABLE)


@dataclass(frozen=True)
class TensorInfo:
    """A tensor input or output; ``shape`` holds the upper bounds of dynamic dims, listed in ``dynamic_dims``."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    dynamic_dims: tuple[int, ...] = ()


@dataclass(frozen=True)
class ValueInfo:
    """A non-tensor input or output: the value the program was exported with (``None`` for a symbolic int)."""

    name: str
    value: Any
    symbolic: bool = False


@dataclass(frozen=True)
class MethodMeta:
    """What a method takes and returns, and what it costs in memory."""

    name: str
    inputs: tuple[TensorInfo | ValueInfo, ...]
    outputs: tuple[TensorInfo | ValueInfo | None, ...]
    arena_bytes: int
    num_instructions: int
    debug_buffer_bytes: int

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o.name if o else "" for o in self.outputs]

    def num_inputs(self) -> int:
        return len(self.inputs)

    def num_outputs(self) -> int:
        return len(self.outputs)


@dataclass
class InstructionInfo:
    """What an observer needs to know about one instruction (``Method.instructions``)."""

    index: int
    name: str  # "native_call_addmm.out" or "DELEGATE_CALL"
    node_name: str
    debug_handle: int
    source: str
    kind: str  # OUT / FUNCTIONAL_COPY / VIEW / DELEGATE
    outputs: list[int]
    delegate_backend: str | None = None


class Method:
    """One method of a loaded program; ``execute`` runs it on new inputs."""

    def __init__(self, program: Any, plan: pf.PlanDef) -> None:
        self._program = program
        self._plan = plan
        self.name = plan.name
        loaded = program._loaded
        # a stateful method shares its program's lock: the mutable buffers are the program's (a prefill and a decode
        # on two threads would interleave their cache updates); a stateless one runs beside its siblings
        shared = getattr(program, "_state_lock", None) if plan.mutable_buffers else None
        self._lock = shared if shared is not None else threading.RLock()
        self._ops = check_operators(plan)  # before anything runs (views and folded instructions run at load)
        plan_check.check_io(plan)  # at every verification level: inputs the run loop can copy into
        self._shapes_checked = False  # the first run checks every static planned shape (see _check_planned_shapes)
        self._runs_checked: set[tuple] = set()  # symbol bindings whose run checked each kernel's outputs
        self._arena = _allocate_arena(plan)
        self._arena_views: dict[torch.dtype, torch.Tensor] = {}
        self._slots: list[Any] = [None] * len(plan.values)
        self._shapes = ShapeBinder(plan, self.name) if plan.symbols else None
        self._buffers: list[str] = []  # names of the mutable buffers this method uses
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # frombuffer on a read-only bytes object
            for i, v in enumerate(plan.values):
                self._slots[i] = self._materialize(i, v, loaded)
        self._unplanned = _unplanned.UnplannedInputs(plan, self._slots)  # gives unplanned inputs their slots
        self._constant_ids = {i for i, v in enumerate(plan.values)
                              if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_CONSTANT}
        writes = collections.Counter(o for ins in plan.instructions for o in getattr(ins.call, "outputs", ()))
        self._unfoldable = set(plan.outputs) | {o for o, n in writes.items() if n > 1}
        self.instructions: list[InstructionInfo] = []
        self._calls: list[Callable[[], Any] | None] = []
        self._delegate_handles: dict[int, Any] = {}
        self._delegate_backends: dict[int, Any] = {}
        self._jumps: dict[int, control_flow.Jump] = {}  # JUMP_FALSE instructions (torch.cond), by index
        with torch.no_grad():
            for k, ins in enumerate(plan.instructions):
                self._calls.append(self._compile(k, ins))
        self._fast = [(k, c) for k, c in enumerate(self._calls) if c is not None]
        self._input_slots = [self._slots[i] for i in plan.inputs]
        self._in_root = _treespec.parse(plan.input_spec, f"{self.name}.input_spec")
        self._out_root = _treespec.parse(plan.output_spec, f"{self.name}.output_spec")
        self._kwarg_order = _treespec.kwarg_order(self._in_root)
        self._meta = self._make_meta()
        self._observer: MethodObserver | None = None

    # -- loading ------------------------------------------------------------------------------------
    def _arena_view(self, dtype: torch.dtype) -> torch.Tensor:
        t = self._arena_views.get(dtype)
        if t is None:
            n = self._arena.numel() - self._arena.numel() % dtype.itemsize  # whole elements (Minimal: any size)
            t = self._arena[:n].view(dtype) if n else torch.empty(0, dtype=dtype)
            self._arena_views[dtype] = t
        return t

    def _materialize(self, i: int, v: Any, loaded: Any) -> Any:
        if isinstance(v, pf.TensorDef):
            dtype = code_dtype(v.scalar_type)
            if v.placement == pf.PLACEMENT_PLANNED:
                sizes, strides, off = v.sizes, v.strides, v.storage_offset
                if v.sym_shape:
                    if self._shapes is None:
                        raise ProgramFormatError(f"method '{self.name}': value {i} has a symbolic shape but the "
                                                 "method has no symbols", field=f"{self.name}.values[{i}]")
                    sizes, strides, off = self._shapes.tensor(i, v, v.arena_offset // dtype.itemsize,
                                                              f"{self.name}.values[{i}]")
                if v.nbytes == 0:
                    return torch.empty_strided(sizes, strides, dtype=dtype)
                return _strided(self._arena_view(dtype), sizes, strides, v.arena_offset // dtype.itemsize + off,
                                f"method '{self.name}': planned value {i}", f"{self.name}.values[{i}]")
            if v.placement == pf.PLACEMENT_MUTABLE:
                mb = self._plan.mutable_buffers[v.buffer_index]
                self._buffers.append(mb.name)
                return self._program._mutable_buffer(mb, self.name)
            if v.placement == pf.PLACEMENT_CONSTANT:
                off, size = loaded.program.constants[v.constant_index]
                if v.nbytes == 0:
                    return torch.empty_strided(v.sizes, v.strides, dtype=dtype)
                raw = torch.frombuffer(loaded.buffer, dtype=torch.uint8, count=size - size % dtype.itemsize,
                                       offset=loaded.segment_base + off)
                return _strided(raw.view(dtype), v.sizes, v.strides, v.storage_offset,
                                f"method '{self.name}': constant value {i}", f"{self.name}.values[{i}]")
            return None  # ALIAS / DYNAMIC: produced by an instruction
        if isinstance(v, pf.IntListV):
            return list(v.items)
        if isinstance(v, pf.DoubleListV):
            return list(v.items)
        if isinstance(v, pf.BoolListV):
            return list(v.items)
        if isinstance(v, pf.DtypeV):
            return code_dtype(v.scalar_type)
        if isinstance(v, pf.LayoutV):
            return CODE_TO_LAYOUT[v.value]
        if isinstance(v, pf.MemoryFormatV):
            return CODE_TO_MEMORY_FORMAT[v.value]
        if isinstance(v, pf.DeviceV):
            return torch.device(v.value)
        if isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)):
            return v  # resolved when an instruction binds it (items may be aliases made earlier)
        if isinstance(v, (pf.SymIntV, pf.SymIntListV)):
            if self._shapes is None:
                raise ProgramFormatError(f"method '{self.name}': value {i} is symbolic but the method has no "
                                         "symbols", field=f"{self.name}.values[{i}]")
            where = f"{self.name}.values[{i}]"
            return self._shapes.scalar(v, where) if isinstance(v, pf.SymIntV) else self._shapes.int_list(v, where)
        return v  # None, bool, int, float, str

    def _arg(self, vid: int) -> Any:
        x = self._slots[vid]
        if isinstance(x, pf.TensorListV):
            return [self._slots[j] for j in x.items]
        if isinstance(x, pf.OptionalTensorListV):
            return [None if j < 0 else self._slots[j] for j in x.items]
        return x

    def _bind(self, k: int, ins: pf.InstructionDef, op: torch._ops.OpOverload) -> tuple[list, dict, list]:
        c = ins.call
        schema = op._schema
        nonout = [a for a in schema.arguments if not a.is_out]
        outs = [a for a in schema.arguments if a.is_out]
        if len(c.args) != len(nonout):
            raise ProgramFormatError(
                f"method '{self.name}': instruction {k} ({ins.node_name}) passes {len(c.args)} arguments to "
                f"{op}, whose schema has {len(nonout)}", field=f"{self.name}.instructions[{k}].args")
        pos, kw = [], {}
        for sa, vid in zip(nonout, c.args):
            val = self._arg(vid)
            if sa.kwarg_only:
                kw[sa.name] = val
            else:
                pos.append(val)
        return pos, kw, outs

    def _compile(self, k: int, ins: pf.InstructionDef) -> Callable[[], Any] | None:
        plan = self._plan
        c = ins.call
        if isinstance(c, pf.DelegateCallDef):
            return self._compile_delegate(k, ins)
        if pf.is_control(ins):
            return self._compile_control(k, ins)
        opdef = plan.operators[c.op_index]
        op = self._ops[c.op_index]
        pos, kw, out_args = self._bind(k, ins, op)
        out_tensors = [self._slots[o] for o in c.outputs]
        kind = pf.CALL_KIND_NAMES.get(c.kind, "?")
        self.instructions.append(InstructionInfo(
            k, f"native_call_{opdef.name.split('::')[-1]}.{opdef.overload}", ins.node_name, ins.debug_handle,
            ins.source, kind, list(c.outputs)))
        fn = getattr(op, "_op", op)
        if any(isinstance(a, SymScalar) for a in (*pos, *kw.values())):
            fn = with_sym_args(fn)  # a size that changes per run: read when the call runs
        if c.kind == pf.CALL_VIEW:
            return self._compile_view(k, ins, op, pos, kw)
        for o, t in zip(c.outputs, out_tensors):
            if not isinstance(t, torch.Tensor):
                raise ProgramFormatError(f"method '{self.name}': instruction {k} ({ins.node_name}) writes value {o}, "
                                         "which is not a planned tensor", field=f"{self.name}.values[{o}]")
        if f"{opdef.name}.{opdef.overload or 'default'}" in ZERO_FILLED_ALLOCATIONS:
            return functools.partial(_zero_fill, out_tensors)  # torch.empty*: never hand out unwritten bytes
        if c.kind == pf.CALL_OUT:
            if len(out_args) == 1 and isinstance(out_args[0].type, torch.ListType):
                kw[out_args[0].name] = out_tensors
            elif len(out_args) == len(out_tensors):
                for a, t in zip(out_args, out_tensors):
                    kw[a.name] = t
            else:
                raise ProgramFormatError(f"method '{self.name}': instruction {k} ({ins.node_name}) has "
                                         f"{len(out_tensors)} outputs but {op} takes {len(out_args)} out arguments",
                                         field=f"{self.name}.instructions[{k}].outputs")
            check_kernel(self.name, k, ins, op, pos, kw)
            direct = None if fn is not getattr(op, "_op", op) else direct_kernel(op, pos, kw)
            call = direct if direct is not None else functools.partial(fn, *pos, **kw)
            return self._folded(k, ins, op, call, out_tensors) if self._foldable(ins, op) else call
        if c.kind == pf.CALL_FUNCTIONAL_COPY:
            check_kernel(self.name, k, ins, op, pos, kw)
            call = self._functional_copy(op, fn, pos, kw, out_tensors)
            return self._folded(k, ins, op, call, out_tensors) if self._foldable(ins, op) else call
        raise ProgramFormatError(f"method '{self.name}': instruction {k} has unsupported call kind {kind}",
                                 field=f"{self.name}.instructions[{k}].kind")

    def _compile_control(self, k: int, ins: pf.InstructionDef) -> Callable[[], Any]:
        """A ``JUMP_FALSE`` or a ``MOVE`` (``runtime.control_flow``): checked, compiled, listed (logs nothing)."""
        call, name, kind = control_flow.compile_control(self, k, ins)
        self.instructions.append(InstructionInfo(k, name, ins.node_name, ins.debug_handle, ins.source, kind, []))
        return call

    @staticmethod
    def _functional_copy(op: Any, fn: Callable[..., Any], pos: list, kw: dict,
                         out_tensors: list[torch.Tensor]) -> Callable[[], Any]:
        """A functional op whose results are copied into the planned outputs (or a direct kernel for it)."""
        if len(out_tensors) == 1:
            dst = out_tensors[0]
            direct = None if fn is not getattr(op, "_op", op) else direct_functional(op, pos, kw, dst)
            if direct is not None:
                return direct

            def call_copy1(fn=fn, pos=pos, kw=kw, dst=dst):
                dst.copy_(fn(*pos, **kw))
            return call_copy1

        def call_copy(fn=fn, pos=pos, kw=kw, dsts=out_tensors):
            for d, r in zip(dsts, fn(*pos, **kw)):
                d.copy_(r)
        return call_copy

    def _foldable(self, ins: pf.InstructionDef, op: torch._ops.OpOverload) -> bool:
        """Whether an instruction computes the same every run: a deterministic op whose tensor inputs are all
        constants (or folded values), in a method without symbolic shapes, none of its outputs a method output or
        written by another instruction."""
        c = ins.call
        tensors = []
        for a in c.args:
            v = self._plan.values[a]
            if isinstance(v, pf.TensorDef):
                tensors.append(a)
            elif isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)):  # e.g. index's indices
                tensors += [j for j in v.items if j >= 0]
        if not self._program._fold_constants or self._shapes is not None:
            return False
        if not tensors or not all(a in self._constant_ids for a in tensors):
            return False
        if torch.Tag.nondeterministic_seeded in op.tags or any(o in self._unfoldable for o in c.outputs):
            return False
        return bool(c.outputs) and all(isinstance(self._plan.values[o], pf.TensorDef) for o in c.outputs)

    def _folded(self, k: int, ins: pf.InstructionDef, op: Any, call: Callable[[], Any],
                out_tensors: list[torch.Tensor]) -> Callable[[], Any]:
        """Runs a foldable instruction once, at load, and keeps its outputs in memory of their own (out of the
        arena, whose bytes later instructions reuse); the instruction still runs each time as a no-op, so a
        tracer logs its outputs as before. A dequantized int8 weight is computed once instead of every run."""
        key = self._fold_key(ins)
        kept = self._program._folded.get(key) if key is not None else None
        if kept is None or [(t.shape, t.stride(), t.dtype) for t in kept] != \
                [(t.shape, t.stride(), t.dtype) for t in out_tensors]:
            try:
                call()
            except Exception as e:
                raise self._kernel_error(k, ins, op, e) from None
            kept = [t.clone(memory_format=torch.preserve_format) for t in out_tensors]
            if key is not None:
                self._program._folded[key] = kept
        for o, t in zip(ins.call.outputs, kept, strict=True):
            self._slots[o] = t
            self._constant_ids.add(o)
        return _noop

    def _fold_key(self, ins: pf.InstructionDef) -> tuple | None:
        """What identifies a folded result across the program's methods (a dequantized weight read by the
        prefill and the decode method is kept once): the op and its arguments, tensors by their place in the
        constant segment; None when an argument is itself a folded value."""
        c = ins.call
        opdef = self._plan.operators[c.op_index]
        parts: list[Any] = [opdef.name, opdef.overload]
        for a in c.args:
            v = self._plan.values[a]
            if isinstance(v, pf.TensorDef):
                if v.placement != pf.PLACEMENT_CONSTANT:
                    return None
                parts.append(("c", v.constant_index, v.scalar_type, tuple(v.sizes), tuple(v.strides),
                              v.storage_offset))
            elif isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)):
                return None
            else:
                parts.append(repr(self._slots[a]))
        return tuple(parts)

    def _compile_view(self, k: int, ins: pf.InstructionDef, op: Any, pos: list, kw: dict) -> None:
        """Evaluates a view once (its output aliases fixed storage); a dynamic method re-runs it every call."""
        c = ins.call

        def evaluate() -> list[torch.Tensor]:
            try:
                r = op(*[resolve(a) for a in pos], **{n: resolve(a) for n, a in kw.items()})
            except Exception as e:
                raise self._kernel_error(k, ins, op, e) from None
            return list(r) if isinstance(r, (list, tuple)) else [r]

        rs = evaluate()
        if len(rs) != len(c.outputs):
            raise ProgramFormatError(f"method '{self.name}': view instruction {k} ({ins.node_name}) made "
                                     f"{len(rs)} outputs, the program declares {len(c.outputs)}",
                                     field=f"{self.name}.instructions[{k}].outputs")
        for o, t in zip(c.outputs, rs):
            want = self._plan.values[o]
            if isinstance(want, pf.TensorDef) and list(t.shape) != want.sizes and not self._shapes:
                raise ProgramFormatError(
                    f"method '{self.name}': view instruction {k} ({ins.node_name}) made shape "
                    f"{list(t.shape)}, the program declares {want.sizes}", field=f"{self.name}.values[{o}]")
            self._slots[o] = t
        if self._shapes is not None:
            outs = [self._slots[o] for o in c.outputs]

            def rerun() -> None:
                for t, r in zip(outs, evaluate()):
                    t.set_(r)
            self._shapes.views.append(rerun)
        return None

    def _compile_delegate(self, k: int, ins: pf.InstructionDef) -> Callable[[], Any]:
        c = ins.call
        d = self._plan.delegates[c.delegate_index]
        loaded = self._program._loaded
        off, size = loaded.program.delegate_data[d.data_index]
        blob = memoryview(loaded.buffer)[loaded.segment_base + off:loaded.segment_base + off + size]
        backend = get_backend(d.backend_id)
        try:
            named = {"named_data": loaded.named_data} if getattr(backend, "reads_named_data", False) else {}
            handle = backend.init(blob, dict(d.compile_specs), **named)
        except Exception as e:
            raise ProgramFormatError(f"method '{self.name}': delegate {c.delegate_index} of backend "
                                     f"'{d.backend_id}' (instruction {k}, {ins.node_name}) failed to load: {e}",
                                     field=f"{self.name}.delegates[{c.delegate_index}]") from e
        self._delegate_handles[k] = handle
        self._delegate_backends[k] = backend
        inputs = [self._arg(a) for a in c.args]
        outputs = [self._slots[o] for o in c.outputs]
        self.instructions.append(InstructionInfo(k, "DELEGATE_CALL", ins.node_name, ins.debug_handle, ins.source,
                                                 "DELEGATE", list(c.outputs), d.backend_id))

        def call_delegate(backend=backend, handle=handle, inputs=inputs, outputs=outputs):
            backend.execute(handle, inputs, outputs, self._observer)  # the observer's DelegateEvents, if any
        return call_delegate

    def _info(self, name: str, v: Any) -> TensorInfo | ValueInfo:
        if isinstance(v, pf.TensorDef):
            dyn: tuple[int, ...] = ()
            if v.sym_shape:
                sizes = _sym_sizes(v)
                dyn = tuple(d for d, e in enumerate(sizes) if not isinstance(e, int))
            return TensorInfo(name, code_dtype(v.scalar_type), tuple(v.sizes), dyn)
        if isinstance(v, (pf.SymIntV, pf.SymIntListV)):
            return ValueInfo(name, None, symbolic=True)
        return ValueInfo(name, v)

    def _make_meta(self) -> MethodMeta:
        plan = self._plan
        ins = tuple(self._info(name, plan.values[vid]) for name, vid in zip(plan.input_names, plan.inputs))
        outs = tuple(self._info(name, plan.values[vid]) for name, vid in zip(plan.output_names, plan.outputs))
        return MethodMeta(plan.name, ins, outs, plan.arena_size, len(plan.instructions), plan.debug_buffer_bytes)

    # -- running ------------------------------------------------------------------------------------
    @property
    def metadata(self) -> MethodMeta:
        return self._meta

    def method_meta(self) -> MethodMeta:
        return self._meta

    def _kernel_error(self, k: int, ins: pf.InstructionDef, op: Any, e: Exception) -> KernelError:
        where = f"\n  source: {ins.source}" if ins.source else ""
        return KernelError(f"method '{self.name}': instruction {k} ({op}, node '{ins.node_name}', debug handle "
                           f"{ins.debug_handle}) failed: {type(e).__name__}: {e}{where}")

    def _flatten_inputs(self, args: tuple, kwargs: dict) -> list:
        """The flat inputs: ``execute([a, b])`` (the reference's sequence), or ``execute(a, b, k=c)`` as the model
        took them (keyword inputs in the order the program was exported with)."""
        n = len(self._plan.inputs)
        if not kwargs and len(args) == n and all(type(a) is torch.Tensor for a in args):
            return list(args)  # the common case, without walking the pytree
        if len(args) == 1 and isinstance(args[0], (list, tuple)) and not kwargs and len(args[0]) == n:
            return list(args[0])
        if kwargs:
            bound = bind_keywords(self.name, args, kwargs, self._kwarg_order, self._meta.input_names)
            if isinstance(bound, list):
                return bound
            args, kwargs = bound
        flat = pytree.tree_leaves((tuple(args), dict(kwargs)), is_leaf=lambda x: x is None)
        if len(flat) != n:
            raise RuntimeInputError(
                f"method '{self.name}' expects {n} input(s) {self._meta.input_names}, got {len(flat)} (pass them "
                "as the model took them, or as one flat sequence)")
        return flat

    def _check_value_input(self, info: ValueInfo, x: Any) -> None:
        if info.symbolic:
            if not isinstance(x, int) or isinstance(x, bool):
                raise RuntimeInputError(f"method '{self.name}': input '{info.name}' must be an int, got "
                                        f"{type(x).__name__}")
            return
        if type(x) is not type(info.value) or x != info.value:
            raise RuntimeInputError(
                f"method '{self.name}': input '{info.name}' was exported as {info.value!r} and the program is "
                f"specialised to it; got {x!r} (re-export with that value to run it)")

    def _check_and_copy_inputs(self, flat: list) -> None:
        if len(flat) != len(self._input_slots):
            raise RuntimeInputError(f"method '{self.name}' expects {len(self._input_slots)} input(s) "
                                    f"{self._meta.input_names}, got {len(flat)}")
        for j, (info, slot, x) in enumerate(zip(self._meta.inputs, self._input_slots, flat)):
            if isinstance(info, ValueInfo):
                self._check_value_input(info, x)
                continue
            if not isinstance(x, torch.Tensor):
                raise RuntimeInputError(f"method '{self.name}': input '{info.name}' must be a tensor of "
                                        f"{info.dtype} {list(info.shape)}, got {type(x).__name__}")
            check_tensor_input(self.name, info.name, x)
            if x.dtype != info.dtype:
                raise RuntimeInputError(f"method '{self.name}': input '{info.name}' must have dtype {info.dtype}, "
                                        f"got {x.dtype}")
            if x.device.type != "cpu":
                raise RuntimeInputError(f"method '{self.name}': input '{info.name}' is on device {x.device}; the "
                                        "edgetorch runtime takes CPU tensors")
            if x.shape != slot.shape:
                raise RuntimeInputError(f"method '{self.name}': input '{info.name}' must have shape "
                                        f"{_shape_text(info, slot)}, got {list(x.shape)}")
            self._unplanned.fill(j, slot, x)

    def _collect_outputs(self) -> list:
        flat = []
        for vid in self._plan.outputs:
            v = self._slots[vid]
            if isinstance(v, SymScalar):
                v = v.value
            flat.append(clone(v) if isinstance(v, torch.Tensor) else v)
        return flat

    def execute(self, *args: Any, **kwargs: Any) -> list:
        """Runs the method and returns the flat list of its outputs (the reference runtime's convention).

        Inputs: ``execute([x, y])`` (a sequence of the flat inputs, as the reference runtime) or ``execute(x, y,
        mask=m)`` as the model took them. Use ``method(*args, **kwargs)`` for the model's own output structure."""
        flat = self._flatten_inputs(args, kwargs)
        with self._lock, torch.no_grad():
            if self._shapes is not None:
                self._shapes.bind(flat)
                self._shapes.apply(self._slots, self._arena_view)
            self._check_and_copy_inputs(flat)
            run = tuple(self._shapes.env) if self._shapes is not None else ()
            if run in self._runs_checked:
                self._run(self._observer)
            else:  # a first run (of these symbol values): every kernel's outputs checked right after it ran
                fast, self._fast = self._fast, first_run_calls(self.name, self._plan, self._slots, self._fast)
                try:
                    self._run(self._observer)
                finally:
                    self._fast = fast
                if len(self._runs_checked) < 1024 and not self._jumps:  # with jumps, a branch may not have run yet
                    self._runs_checked.add(run)
            if not self._shapes_checked:
                self._check_planned_shapes()
                self._shapes_checked = True
            return self._collect_outputs()

    def _check_planned_shapes(self) -> None:
        """After the first run: every static planned tensor still has the shape the program plans. A kernel that
        computed another shape (a corrupted or hand-edited file whose indices still pass the load checks) made
        torch resize its output away from the arena; the run is refused instead of returning its result. Static
        shapes do not change between runs, so once is enough."""
        for vid, v in enumerate(self._plan.values):
            if not isinstance(v, pf.TensorDef) or v.sym_shape or v.placement not in _STATIC_CHECKED:
                continue
            t = self._arg(vid)
            if isinstance(t, torch.Tensor) and list(t.shape) != list(v.sizes):
                writer = next((k for k, ins in enumerate(self._plan.instructions) if vid in ins.call.outputs), None)
                raise ProgramFormatError(
                    f"method '{self.name}': instruction {writer} computed value {vid} with shape {list(t.shape)}, "
                    f"but the program plans {list(v.sizes)} (the file is inconsistent: corrupted or edited?)",
                    field=f"{self.name}.values[{vid}].sizes")

    def execute_structured(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the method and returns its outputs with the structure the eager model returned (the classes it
        names, e.g. a ``transformers`` ModelOutput, must be importable and imported)."""
        flat = self.execute(*args, **kwargs)
        return _treespec.unflatten(self._plan.output_spec, self._out_root, flat, self.name)

    def reset(self) -> None:
        """Restores the initial value of every mutable buffer this method uses (e.g. empties a KV cache)."""
        with self._lock:
            self._program.reset_buffers(self._buffers)

    @property
    def buffer_names(self) -> list[str]:
        """The mutable buffers this method reads and updates (state kept in the program across calls)."""
        return list(self._buffers)

    def _run(self, observer: MethodObserver | None) -> None:
        """The run loop: every instruction that runs (VIEWs ran at load), in order, with the observer's hooks
        around the run and each instruction (``runtime.observer``). An instruction's error becomes a
        ``KernelError``; a hook's propagates as it is."""
        if self._jumps:
            return control_flow.run_with_jumps(self, self._fast, observer)
        before = after = None
        if observer is not None:
            observer.begin_run(self)
            before, after = observer.before_instruction, observer.after_instruction
        ok = False
        try:
            for k, call in self._fast:
                if before is not None:
                    before(k)
                try:
                    call()
                except (DebugBufferOverflowError, ProgramFormatError):
                    raise  # the observer's own error (a delegate logging more than the buffer holds), a first-run check
                except Exception as e:
                    raise self._instruction_error(k, e) from e
                if after is not None:
                    after(k)
            ok = True
        finally:
            if observer is not None:
                observer.end_run(self, ok)

    def _instruction_error(self, k: int, e: Exception) -> KernelError:
        ins = self._plan.instructions[k]
        return self._kernel_error(k, ins, ins.node_name, e)

    def run_instruction(self, k: int) -> None:
        """Runs instruction ``k`` alone, without observer hooks (to step through a method); VIEW instructions
        are no-ops at run time."""
        call = self._calls[k]
        if call is not None:
            try:
                call()
            except DebugBufferOverflowError:
                raise
            except Exception as e:
                raise self._instruction_error(k, e) from e

    @property
    def observer(self) -> MethodObserver | None:
        """The ``MethodObserver`` whose hooks the run loop calls (None: plain runs)."""
        return self._observer

    @observer.setter
    def observer(self, observer: MethodObserver | None) -> None:
        with self._lock:  # never in the middle of a run
            self._observer = observer
            for k, handle in self._delegate_handles.items():  # backends prepare their traced runs now
                observe_delegate(self._delegate_backends[k], handle, observer)

    def delegate_handle(self, k: int) -> Any:
        """The handle its backend's ``init`` returned for the DELEGATE_CALL instruction ``k``."""
        return self._delegate_handles[k]

    def value(self, vid: int) -> Any:
        """The current content of a value slot (tensors alias the arena: copy before the next run)."""
        return self._arg(vid)

    @property
    def plan(self) -> pf.PlanDef:
        return self._plan

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.execute_structured(*args, **kwargs)

    def __repr__(self) -> str:
        return (f"Method({self.name!r}, inputs={self._meta.input_names}, instructions={len(self._calls)}, "
                f"arena={self._plan.arena_size} bytes)")


def _noop() -> None:
    """A folded instruction at run time: its outputs were computed at load."""


def _zero_fill(out_tensors: list[torch.Tensor]) -> None:
    """What an ``empty*`` allocation instruction does here (``formats.operators.ZERO_FILLED_ALLOCATIONS``)."""
    for t in out_tensors:
        t.zero_()
