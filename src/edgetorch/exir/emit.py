"""Emission: an edge ExportedProgram becomes one execution plan (values, instructions, memory plan).

Reads the graph without mutating it (the ETRecord holds the same program). Every tensor produced by a
kernel gets a slot in the method's arena; view ops become aliases of their base (evaluated once when the
runtime loads the method); ops without an out variant run functionally and their result is copied into the
planned slot. Constants go to the shared segment area (deduplicated, 64-byte aligned). An elementwise op
(relu, hardtanh, add, an eval-mode dropout's clone ...) whose input dies at it writes its result over that input,
as eager's ``relu_`` does (``reuse_dying_inputs``): the instruction, its debug handle and its logged output are
unchanged, only the value it writes is the input's.

Bounded dynamic shapes: tensors whose sizes are symbolic are planned at their upper bounds and carry their size
expressions (``exir.symbolic``); symbolic-int nodes (``sym_size``, ``operator.mul`` ...) become ``SymInt``
values, evaluated by the runtime from the input shapes, not instructions. Non-tensor user inputs that export
specialised (``use_cache=False``) become constant values the runtime checks each call against.

Mutable buffers (``buffers_to_mutate``): the buffer becomes a ``MUTABLE`` value (state of the loaded program,
initialised from a constant, or from zeros the file does not store when its bytes are all 0). The op computing
its new value writes straight into it when it can (its first argument is the buffer, it has an out variant and
nothing reads the old value after it: an ``index_put`` of a KV cache); otherwise a ``copy`` instruction at the
end of the method stores the new value.
"""

from __future__ import annotations

import hashlib
import operator
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from edgetorch.errors import ExportError
from edgetorch.exir import control_flow
from edgetorch.exir.backend.backend_details import NamedDataConflictError
from edgetorch.exir.backend.lowered import LoweredBackendModule, is_delegate_call, lowered_module_of
from edgetorch.exir.debug_handles import get_debug_handle, source_location
from edgetorch.exir.memory_planning import Buffer, MemoryPlan, plan_memory, verify_memory_plan
from edgetorch.exir.op_variants import is_view_op, out_variant
from edgetorch.exir.symbolic import SymbolTable, is_dynamic_tensor, sym_tensor_def, symbol_table
from edgetorch.exir.verifier import _IGNORED_TARGETS
from edgetorch.formats import program as pf
from edgetorch.formats import symexpr
from edgetorch.formats.alignment import ALIGNMENT
from edgetorch.formats.dtypes import LAYOUTS, MEMORY_FORMATS, dtype_code, storage_nbytes
from edgetorch.formats.handles import DELEGATE_CALL, IN_DELEGATE, KERNEL, HandleGroup, OutputSource

__all__ = ["ConstantPool", "DelegatePool", "EmittedMethod", "emit_method"]


def _all_zero_bytes(t: torch.Tensor) -> bool:
    """Whether every byte of ``t`` is 0 (so -0.0 is not: a zero-initialised buffer must be bit-exact)."""
    t = t.detach().contiguous()
    return t.numel() == 0 or not bool(t.reshape(-1).view(torch.uint8).any())


class ConstantPool:
    """Constant tensors shared by every method of a program, placed in the segment area."""

    def __init__(self, layout: pf.SegmentLayout) -> None:
        self.layout = layout
        self.table: list[int] = []  # constant index -> segment range index
        self._keep: list[torch.Tensor] = []
        self._index: dict = {}

    def add(self, t: torch.Tensor, snapshot: bool = False) -> tuple[int, torch.Tensor]:
        """Returns (constant index, the contiguous tensor stored); the same tensor is stored once. The bytes are
        the tensor's own (zero copy) unless ``snapshot``: a copy, for a tensor the model may still update."""
        t = t.detach()
        key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())
        if key in self._index:
            return self._index[key]
        c = t.clone(memory_format=torch.contiguous_format) if snapshot else t.contiguous()
        raw = c.reshape(-1).view(torch.uint8).numpy() if c.numel() else b""
        self._keep.append(c)
        self.table.append(self.layout.add(raw))
        self._index[key] = (len(self.table) - 1, c)
        return self._index[key]

    def ranges(self) -> list[tuple[int, int]]:
        return [self.layout.ranges[i] for i in self.table]


class DelegatePool:
    """Delegate blobs shared by every method, deduplicated by content, and the program's named data (the
    delegates' ``data_store_output``): each key stored once, identical bytes under two keys sharing one range; the
    same key with other bytes raises ``NamedDataConflictError``."""

    def __init__(self, layout: pf.SegmentLayout) -> None:
        self.layout = layout
        self.table: list[int] = []
        self._by_range: dict[int, int] = {}
        self._named: dict[str, tuple[bytes, int]] = {}  # key -> (sha256, segment range index)

    def add_named(self, key: str, data: bytes, backend_id: str = "") -> None:
        digest = hashlib.sha256(data).digest()
        old = self._named.get(key)
        if old is not None:
            if old[0] != digest:
                raise NamedDataConflictError(f"named data '{key}' (backend '{backend_id}') differs from the bytes "
                                             "an earlier delegate stored under that key: keys must name one content")
            return
        self._named[key] = (digest, self.layout.add(data, dedup_key=b"named:" + digest))

    def named_data(self) -> list[tuple[str, int, int]]:
        """``(key, offset, size)`` of every named data entry, sorted by key."""
        return [(k, *self.layout.ranges[r]) for k, (_, r) in sorted(self._named.items())]

    def add(self, blob: bytes) -> int:
        r = self.layout.add(blob, dedup_key=b"delegate:" + hashlib.sha256(blob).digest())
        if r not in self._by_range:
            self.table.append(r)
            self._by_range[r] = len(self.table) - 1
        return self._by_range[r]

    def ranges(self) -> list[tuple[int, int]]:
        return [self.layout.ranges[i] for i in self.table]


@dataclass
class EmittedMethod:
    """One method's plan, its memory plan and what each instruction covers (``HandleGroup``, in instruction
    order; an instruction without a handle has none)."""

    plan: pf.PlanDef
    memory_plan: MemoryPlan
    handle_groups: list[HandleGroup]


def _tensor_def(v: torch.Tensor, placement: int, constant_index: int = -1,
                symbols: SymbolTable | None = None, what: str = "") -> pf.TensorDef:
    if symbols is not None and is_dynamic_tensor(v):
        return _dynamic_tensor_def(v, placement, symbols, what)
    sizes = [int(s) for s in v.shape]
    strides = [int(s) for s in v.stride()]
    so = int(v.storage_offset())
    nbytes = storage_nbytes(sizes, strides, so, v.element_size())
    return pf.TensorDef(dtype_code(v.dtype), sizes, strides, so, placement, nbytes, -1, constant_index)


def _dynamic_tensor_def(v: torch.Tensor, placement: int, symbols: SymbolTable, what: str) -> pf.TensorDef:
    t = sym_tensor_def(symbols, v, what, dtype_code(v.dtype))
    t.placement = placement
    return t


class _MethodEmitter:
    def __init__(self, ep: ExportedProgram, name: str, constants: ConstantPool, delegates: DelegatePool | None,
                 alignment: int, emit_stacktrace: bool, memory_planning_algo: str = "greedy") -> None:
        self.ep = ep
        self.memory_planning_algo = memory_planning_algo
        self.name = name
        self.constants = constants
        self.delegate_pool = delegates
        self.alignment = alignment
        self.emit_stacktrace = emit_stacktrace
        self.values: list = []
        self.node_values: dict[torch.fx.Node, int | list[int]] = {}
        self.operators: list[pf.OperatorDef] = []
        self._op_index: dict[tuple[str, str], int] = {}
        self.delegates: list[pf.BackendDelegateDef] = []
        self.instructions: list[pf.InstructionDef] = []
        self.alias_root: dict[int, int] = {}
        self.first_use: dict[int, int] = {}
        self.last_use: dict[int, int] = {}
        self.planned: list[int] = []
        self.inputs: list[int] = []
        self.handle_groups: list[HandleGroup] = []
        self.delegate_debug_bytes = 0  # what the delegate calls declare one traced call of theirs logs
        self._null: int | None = None
        self.symbols = symbol_table(ep, name)
        self.mutable_buffers: list[pf.MutableBufferDef] = []
        self.buffer_values: dict[str, int] = {}  # buffer FQN -> its MUTABLE value
        self.inplace: dict[torch.fx.Node, str] = {}  # node -> the buffer it writes in place

    # -- values ---------------------------------------------------------------------------------------
    def add_value(self, v) -> int:
        self.values.append(v)
        return len(self.values) - 1

    def null(self) -> int:
        if self._null is None:
            self._null = self.add_value(None)
        return self._null

    def root(self, vid: int) -> int:
        return self.alias_root.get(vid, vid)

    def use(self, vid: int, at: int) -> None:
        r = self.root(vid)
        if r in self.last_use:
            self.last_use[r] = max(self.last_use[r], at)

    def _node_tensor(self, n: torch.fx.Node) -> int:
        v = self.node_values.get(n)
        if v is None:
            raise ExportError(f"method '{self.name}': node '{n.name}' is used before it is defined")
        if isinstance(v, list):
            raise ExportError(f"method '{self.name}': node '{n.name}' is a multi-output value used as a tensor")
        return v

    def convert_arg(self, a, typ: torch._C.JitType, uses: list[int]) -> int:
        if isinstance(a, torch.fx.Node):
            vid = self._node_tensor(a)
            uses.append(vid)
            return vid
        if a is None:
            return self.null()
        if isinstance(a, (list, tuple)):
            tstr = str(typ)
            if "Tensor" not in tstr and any(isinstance(x, torch.fx.Node) for x in a):
                return self.sym_int_list(a)
            if any(isinstance(x, torch.fx.Node) for x in a) or "Tensor" in tstr:
                if "Tensor?" in tstr or "Optional[Tensor]" in tstr or any(x is None for x in a):
                    items = []
                    for x in a:
                        if x is None:
                            items.append(-1)
                        else:
                            items.append(self._node_tensor(x))
                            uses.append(items[-1])
                    return self.add_value(pf.OptionalTensorListV(tuple(items)))
                items = [self._node_tensor(x) for x in a]
                uses.extend(items)
                return self.add_value(pf.TensorListV(tuple(items)))
            if tstr.startswith("float") or any(isinstance(x, float) for x in a):
                return self.add_value(pf.DoubleListV(tuple(float(x) for x in a)))
            if tstr.startswith("bool"):
                return self.add_value(pf.BoolListV(tuple(bool(x) for x in a)))
            return self.add_value(pf.IntListV(tuple(int(x) for x in a)))
        if isinstance(a, torch.dtype):
            return self.add_value(pf.DtypeV(dtype_code(a)))
        if isinstance(a, torch.layout):
            return self.add_value(pf.LayoutV(LAYOUTS[a]))
        if isinstance(a, torch.memory_format):
            return self.add_value(pf.MemoryFormatV(MEMORY_FORMATS[a]))
        if isinstance(a, torch.device):
            return self.add_value(pf.DeviceV(str(a)))
        if isinstance(a, (bool, int, float, str)):
            return self.add_value(a)
        raise ExportError(f"method '{self.name}': cannot emit argument {a!r} of type {type(a).__name__}")

    def sym_int_list(self, a: list | tuple) -> int:
        exprs = []
        for x in a:
            v = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
            if not isinstance(v, (int, torch.SymInt)) or isinstance(v, bool):
                raise ExportError(f"method '{self.name}': list argument item {x} is {type(v).__name__}, expected "
                                  "an int or a symbolic int")
            exprs.append(self.symbols.encode_int(v, f"list argument item {x}"))
        return self.add_value(pf.SymIntListV(symexpr.dumps(exprs)))

    def sym_value(self, v, what: str) -> int:
        """A value for a symbolic (or specialised) scalar."""
        if isinstance(v, torch.SymInt):
            e = self.symbols.encode_int(v, what)
            return self.add_value(e if isinstance(e, int) else pf.SymIntV(symexpr.dumps(e)))
        if isinstance(v, (torch.SymFloat, torch.SymBool)):
            raise ExportError(f"method '{self.name}': {what} is a symbolic {type(v).__name__}; only symbolic "
                              "ints (sizes) are supported")
        return self.add_value(v)

    def operator_index(self, op: torch._ops.OpOverload) -> int:
        key = (op._schema.name, op._overloadname)
        if key not in self._op_index:
            self._op_index[key] = len(self.operators)
            self.operators.append(pf.OperatorDef(*key))
        return self._op_index[key]

    # -- nodes ----------------------------------------------------------------------------------------
    def emit_placeholders(self) -> None:
        sig = self.ep.graph_signature
        specs = {s.arg.name: s for s in sig.input_specs}
        for node in self.ep.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs[node.name]
            val = node.meta.get("val")
            if spec.kind == InputKind.USER_INPUT and not isinstance(val, torch.Tensor):
                vid = self.sym_value(val, f"input '{node.name}'")  # specialised constant or symbolic int
                self.inputs.append(vid)
            elif spec.kind == InputKind.USER_INPUT:
                vid = self.add_value(_tensor_def(val, pf.PLACEMENT_PLANNED, symbols=self.symbols,
                                                 what=f"input '{node.name}'"))
                self.planned.append(vid)
                self.first_use[vid] = -1
                self.last_use[vid] = -1
                self.inputs.append(vid)
            elif spec.kind == InputKind.BUFFER and spec.target in self.mutated:
                vid = self.mutable_buffer(spec.target)
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                target = spec.target
                if target in self.ep.state_dict:
                    data = self.ep.state_dict[target]
                elif target in self.ep.constants:
                    data = self.ep.constants[target]
                else:
                    raise ExportError(f"method '{self.name}': constant '{target}' of input '{node.name}' has no data")
                if not isinstance(data, torch.Tensor):
                    raise ExportError(f"method '{self.name}': constant '{target}' is a {type(data).__name__}, "
                                      "only tensors are supported")
                idx, stored = self.constants.add(data)
                vid = self.add_value(_tensor_def(stored, pf.PLACEMENT_CONSTANT, idx))
            else:
                raise ExportError(f"method '{self.name}': input '{node.name}' of kind {spec.kind.name} "
                                  "is not supported")
            self.node_values[node] = vid

    @property
    def mutated(self) -> set[str]:
        return set(self.ep.graph_signature.buffers_to_mutate.values())

    def mutable_buffer(self, target: str) -> int:
        data = self.ep.state_dict.get(target, self.ep.constants.get(target))
        if not isinstance(data, torch.Tensor):
            raise ExportError(f"method '{self.name}': mutable buffer '{target}' has no tensor data")
        if _all_zero_bytes(data):  # e.g. an empty KV cache: the loader allocates zeros, the file stores no bytes
            idx, stored = pf.MUTABLE_ZERO_INIT, data.detach().contiguous()
        else:
            idx, stored = self.constants.add(data, snapshot=True)  # the .pte keeps today's state, not a later run's
        self.mutable_buffers.append(pf.MutableBufferDef(target, idx, dtype_code(stored.dtype),
                                                        tuple(int(s) for s in stored.shape)))
        t = _tensor_def(stored, pf.PLACEMENT_MUTABLE)
        t.buffer_index = len(self.mutable_buffers) - 1
        vid = self.add_value(t)
        self.buffer_values[target] = vid
        return vid

    def find_inplace_updates(self) -> None:
        """Marks each op whose result becomes a buffer's new value and that can write into the buffer itself."""
        sig = self.ep.graph_signature
        out_node = next(n for n in self.ep.graph.nodes if n.op == "output")
        placeholders = {n.name: n for n in self.ep.graph.nodes if n.op == "placeholder"}
        buffer_node = {s.target: placeholders[s.arg.name] for s in sig.input_specs
                       if s.kind == InputKind.BUFFER and s.arg.name in placeholders}
        order = {n: i for i, n in enumerate(self.ep.graph.nodes)}
        for spec, node in zip(sig.output_specs, out_node.args[0]):
            if spec.kind != OutputKind.BUFFER_MUTATION or not isinstance(node, torch.fx.Node):
                continue
            buf = buffer_node.get(spec.target)
            op = node.target
            ok = (buf is not None and isinstance(op, torch._ops.OpOverload) and not is_view_op(op)
                  and out_variant(op) is not None and node.args and node.args[0] is buf
                  and all(order[u] < order[node] for u in buf.users if u is not node)
                  and sum(1 for a in out_node.args[0] if a is node) == 1
                  and _same_layout(node.meta.get("val"), buf.meta.get("val")))
            if ok:
                self.inplace[node] = spec.target

    def _new_outputs(self, node: torch.fx.Node, placement: int, at: int) -> list[int]:
        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (list, tuple)) else [val]
        out = []
        for v in vals:
            if not isinstance(v, torch.Tensor):
                raise ExportError(f"method '{self.name}': node '{node.name}' output is {type(v).__name__}, "
                                  "expected a tensor")
            vid = self.add_value(_tensor_def(v, placement, symbols=self.symbols, what=f"node '{node.name}'"))
            if placement == pf.PLACEMENT_PLANNED:
                self.planned.append(vid)
                self.first_use[vid] = at
                self.last_use[vid] = at
            out.append(vid)
        return out

    def _source(self, node: torch.fx.Node) -> str:
        return source_location(node.meta.get("stack_trace")) if self.emit_stacktrace else ""

    def emit_kernel(self, node: torch.fx.Node) -> None:
        op: torch._ops.OpOverload = node.target
        at = len(self.instructions)
        schema = op._schema
        uses: list[int] = []
        args = []
        for i, sa in enumerate(schema.arguments):
            if i < len(node.args):
                a = node.args[i]
            elif sa.name in node.kwargs:
                a = node.kwargs[sa.name]
            elif sa.has_default_value():
                a = sa.default_value
            else:
                raise ExportError(f"method '{self.name}': node '{node.name}' ({op}) lacks argument '{sa.name}'")
            args.append(self.convert_arg(a, sa.type, uses))
        if is_view_op(op):
            kind, target = pf.CALL_VIEW, op
            outs = self._new_outputs(node, pf.PLACEMENT_ALIAS, at)
            base = uses[0]
            for o in outs:
                self.alias_root[o] = self.root(base)
        elif node in self.inplace:  # writes the buffer's new value into the buffer itself
            kind, target = pf.CALL_OUT, out_variant(op)
            outs = [self.buffer_values[self.inplace[node]]]
        else:
            ov = out_variant(op)
            kind, target = (pf.CALL_OUT, ov) if ov is not None else (pf.CALL_FUNCTIONAL_COPY, op)
            outs = self._new_outputs(node, pf.PLACEMENT_PLANNED, at)
        for u in uses:
            self.use(u, at)
        h = get_debug_handle(node)
        self.instructions.append(pf.InstructionDef(
            pf.KernelCallDef(self.operator_index(target), kind, args, outs), node.name, h or 0, self._source(node)))
        if h is not None:
            self.handle_groups.append(HandleGroup(KERNEL, at, (h,)))
        val = node.meta.get("val")
        self.node_values[node] = outs if isinstance(val, (list, tuple)) else outs[0]

    def emit_delegate(self, node: torch.fx.Node) -> None:
        lowered = lowered_module_of(node, self.ep.graph_module)
        if self.delegate_pool is None:
            raise ExportError("delegate calls need a delegate pool")
        at = len(self.instructions)
        uses: list[int] = []
        args = [self.convert_arg(a, torch._C.TensorType.get(), uses) for a in node.args[1:]]
        outs = self._new_outputs(node, pf.PLACEMENT_PLANNED, at)
        for u in uses:
            self.use(u, at)
        blob = self.delegate_pool.add(lowered.processed_bytes)
        for key, data in (getattr(lowered, "named_data", None) or {}).items():
            self.delegate_pool.add_named(key, data, lowered.backend_id)
        self.delegates.append(pf.BackendDelegateDef(lowered.backend_id, blob, lowered.compile_spec_items))
        # the .pte carries no handle for a call: its handles are the group's, in the ETRecord
        self.instructions.append(pf.InstructionDef(
            pf.DelegateCallDef(len(self.delegates) - 1, args, outs), node.name, 0, self._source(node)))
        name = lowered.backend_id
        self.delegate_debug_bytes += lowered.debug_buffer_bytes or 0
        self.handle_groups.append(HandleGroup(DELEGATE_CALL, at, tuple(lowered.debug_handles()), None, name,
                                              _output_sources(lowered)))
        self.handle_groups += [HandleGroup(IN_DELEGATE, at, tuple(hs), did, name)
                               for did, hs in lowered.debug_handle_map.items()]
        self.node_values[node] = outs

    def emit_buffer_update(self, node: torch.fx.Node, target: str) -> None:
        """Stores a buffer's new value computed out of place: ``copy.out(buffer, new, out=buffer)``."""
        if self.inplace.get(node) == target:
            return  # written in place by its own instruction
        at = len(self.instructions)
        src = self._node_tensor(node)
        self.use(src, at)
        buf = self.buffer_values[target]
        args = [buf, src, self.add_value(False)]
        op = torch.ops.aten.copy.out
        self.instructions.append(pf.InstructionDef(
            pf.KernelCallDef(self.operator_index(op), pf.CALL_OUT, args, [buf]), f"update_{target}", 0, ""))

    def emit_outputs(self, out_node: torch.fx.Node | None) -> tuple[list[int], list[str]]:
        """Buffer updates, then the user outputs (value ids and names)."""
        if out_node is None:
            return [], []
        specs = self.ep.graph_signature.output_specs
        args = list(out_node.args[0])
        user = []
        for i, a in enumerate(args):
            spec = specs[i] if i < len(specs) else None
            if spec is not None and spec.kind == OutputKind.BUFFER_MUTATION:
                self.emit_buffer_update(a, spec.target)
            else:
                user.append((a, getattr(spec.arg, "name", None) if spec is not None else None))
        end = len(self.instructions)
        outputs, names = [], []
        for j, (a, name) in enumerate(user):
            for leaf in pytree.tree_leaves(a):
                if isinstance(leaf, torch.fx.Node):
                    vid = self._node_tensor(leaf)
                    self.use(vid, end)
                else:
                    vid = self.convert_arg(leaf, torch._C.NoneType.get(), [])
                outputs.append(vid)
                names.append(name or f"output_{len(names)}")
        return outputs, names

    def reuse_dying_inputs(self, outputs: list[int]) -> list[int]:
        """Elementwise ops whose input dies at them write their result into that input's slot (as eager's
        ``relu_``): the result's own value is dropped and every later reference names the input's. Returns the
        method's outputs renamed the same way."""
        rename: dict[int, int] = {}
        for at, ins in enumerate(self.instructions):
            c = ins.call  # kernel and delegate calls alike read the renamed values
            c.args = [rename.get(a, a) for a in c.args]
            c.outputs = [rename.get(o, o) for o in c.outputs]
            if not isinstance(c, pf.KernelCallDef) or c.kind != pf.CALL_OUT or len(c.outputs) != 1:
                continue
            op = self.operators[c.op_index]
            positions = _INPLACE_OUT.get((op.name, op.overload))
            o = c.outputs[0]
            x = next((c.args[i] for i in positions or () if self._can_take_over(c.args[i], o, at)
                      and not self._aliased_by_other_args(c.args, c.args[i])), None)
            if x is None:
                continue
            rename[o] = x
            c.outputs = [x]
            root = self.root(x)
            self.last_use[root] = self.last_use.pop(o)
            self.first_use.pop(o)
            self.planned.remove(o)
            self.values[o] = None
            for a, r in self.alias_root.items():
                if r == o:
                    self.alias_root[a] = root
        for i, v in enumerate(self.values):
            if isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)) and any(j in rename for j in v.items):
                self.values[i] = type(v)(tuple(rename.get(j, j) for j in v.items))
        return [rename.get(o, o) for o in outputs]

    def _aliased_by_other_args(self, args: list[int], x: int) -> bool:
        """True when an argument other than ``x`` itself reads ``x``'s storage (its base or another view)."""
        for a in args:
            v = self.values[a]
            items = v.items if isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)) else (a,)
            if any(i != x and i >= 0 and self.root(i) == self.root(x) for i in items):
                return True
        return False

    def _can_take_over(self, x: int, o: int, at: int) -> bool:
        """True when ``x`` (a planned value or a view of one, not an input) is last read, through any alias of
        its storage, at ``at`` and has ``o``'s dtype, sizes and strides, so the instruction at ``at`` may write
        ``o`` into ``x``'s bytes."""
        r = self.root(x)
        vx, vo, vr = self.values[x], self.values[o], self.values[r]
        return (isinstance(vx, pf.TensorDef) and isinstance(vo, pf.TensorDef) and isinstance(vr, pf.TensorDef)
                and r in self.last_use and o in self.last_use and r not in self.inputs
                and vr.placement == pf.PLACEMENT_PLANNED and vo.placement == pf.PLACEMENT_PLANNED
                and vx.placement in (pf.PLACEMENT_PLANNED, pf.PLACEMENT_ALIAS)
                and not vx.sym_shape and not vo.sym_shape and not vr.sym_shape and self.last_use[r] == at
                and (vx.scalar_type, vx.sizes, vx.strides, vx.storage_offset, vx.nbytes)
                == (vo.scalar_type, vo.sizes, vo.strides, vo.storage_offset, vo.nbytes))

    def emit_node(self, node: torch.fx.Node) -> None:
        """Emits one node of the method's graph or of a ``torch.cond`` branch (``exir.control_flow``)."""
        if node.op == "call_function":
            val = node.meta.get("val")
            if isinstance(val, torch.SymBool):  # a cond's predicate on sizes: a 0/1 SymInt
                self.node_values[node] = control_flow.emit_sym_bool(self, val, f"node '{node.name}'")
            elif isinstance(val, (torch.SymInt, torch.SymFloat, int, float, bool)) \
                    and not isinstance(val, torch.Tensor):
                self.node_values[node] = self.sym_value(val, f"node '{node.name}'")  # evaluated per run
            elif node.target is operator.getitem:
                src, idx = node.args
                vals = self.node_values[src]
                self.node_values[node] = vals[idx] if isinstance(vals, list) else vals
            elif node.target in _IGNORED_TARGETS:
                return
            elif is_delegate_call(node):
                self.emit_delegate(node)
            elif control_flow.is_cond(node):
                control_flow.emit_cond(self, node)  # both branches inline, with jumps and moves
            else:
                self.emit_kernel(node)
        elif node.op == "get_attr" and (all(is_delegate_call(u) for u in node.users)
                                        or control_flow.is_branch_attr(node)):
            return  # a lowered module (its delegate calls emit it) or a cond's branch (the cond emits it)
        else:
            raise ExportError(f"method '{self.name}': cannot emit node '{node.name}' ({node.op})")

    def emit(self) -> EmittedMethod:
        self.emit_placeholders()
        self.find_inplace_updates()
        out_node = None
        for node in self.ep.graph.nodes:
            if node.op == "output":
                out_node = node
            elif node.op != "placeholder":
                self.emit_node(node)
        outputs, output_names = self.emit_outputs(out_node)
        outputs = self.reuse_dying_inputs(outputs)
        # memory plan
        buffers = [Buffer(v, self.values[v].nbytes, self.first_use[v], self.last_use[v]) for v in self.planned]
        mp = plan_memory(buffers, self.alignment, self.memory_planning_algo)
        for v, off in mp.offsets.items():
            self.values[v].arena_offset = off
        sig = self.ep.graph_signature
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            in_spec = pytree.treespec_dumps(self.ep.call_spec.in_spec)
            out_spec = pytree.treespec_dumps(self.ep.call_spec.out_spec)
        plan = pf.PlanDef(
            name=self.name, values=self.values, inputs=self.inputs, outputs=outputs,
            input_spec=in_spec, output_spec=out_spec,
            input_names=[s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT],
            output_names=output_names, operators=self.operators, delegates=self.delegates,
            instructions=self.instructions, arena_size=mp.arena_size, debug_buffer_bytes=0,
            symbols=list(self.symbols.symbols), mutable_buffers=self.mutable_buffers)
        plan.debug_buffer_bytes = pf.run_debug_bytes(plan, self.delegate_debug_bytes)  # what the tracer reserves
        verify_memory_plan(plan)
        return EmittedMethod(plan, mp, self.handle_groups)


#: out kernels that may write their result over one of their inputs (elementwise, TensorIterator-based: the
#: output aliasing an input of the same layout reads each element before writing it), with the argument
#: positions that may be overwritten
_INPLACE_OUT: dict[tuple[str, str], tuple[int, ...]] = {
    ("aten::relu", "out"): (0,),
    ("aten::hardtanh", "out"): (0,),
    ("aten::clamp", "out"): (0,),
    ("aten::gelu", "out"): (0,),
    ("aten::silu", "out"): (0,),
    ("aten::sigmoid", "out"): (0,),
    ("aten::clone", "out"): (0,),  # eval-mode dropout: a clone of a dying value is the value itself
    ("aten::add", "out"): (0, 1),
    ("aten::mul", "out"): (0, 1),
}


def _same_layout(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and not is_dynamic_tensor(a) and tuple(a.shape) == tuple(b.shape) and a.stride() == b.stride())


def _output_source(node: Any) -> OutputSource:
    """(debug handle, output index) of the edge op behind one output of a lowered partition."""
    if not isinstance(node, torch.fx.Node):
        return None
    index = 0
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) and isinstance(node.args[1], int):
        node, index = node.args[0], node.args[1]
    h = get_debug_handle(node) if node.op == "call_function" else None
    return None if h is None else (h, index)


def _output_sources(lowered: LoweredBackendModule) -> tuple[OutputSource, ...]:
    """Per output of a delegate call, the edge op computing it (the partition's outputs are the call's)."""
    sub = lowered.original_module
    res = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    res = list(res) if isinstance(res, (list, tuple)) else [res]
    return tuple(_output_source(o) for o in res[:len(sub.graph_signature.output_specs)])


def emit_method(ep: ExportedProgram, name: str, constants: ConstantPool, delegates: DelegatePool | None = None,
                alignment: int = ALIGNMENT, emit_stacktrace: bool = True,
                memory_planning_algo: str = "greedy") -> EmittedMethod:
    """Emits one method of a program; constants and delegate blobs go to the shared pools; its arena is planned
    with ``memory_planning_algo`` (``memory_planning.ALGORITHMS``)."""
    return _MethodEmitter(ep, name, constants, delegates, alignment, emit_stacktrace, memory_planning_algo).emit()
