"""The consistency checks of a program file (``Verification.InternalConsistency``): every index, offset and
size of a decoded ``ProgramDef`` against its bounds, so that the runtime never reads or writes outside what the
file owns. ``check_consistency`` is re-exported by ``formats.program``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from edgetorch.formats import symexpr
from edgetorch.formats._program_defs import (
    CALL_KIND_NAMES,
    CALL_VIEW,
    MUTABLE_ZERO_INIT,
    PLACEMENT_ALIAS,
    PLACEMENT_CONSTANT,
    PLACEMENT_DYNAMIC,
    PLACEMENT_MUTABLE,
    PLACEMENT_PLANNED,
    DeviceV,
    DtypeV,
    JumpFalseCallDef,
    KernelCallDef,
    LayoutV,
    MemoryFormatV,
    MoveCallDef,
    OptionalTensorListV,
    PlanDef,
    ProgramDef,
    SymIntListV,
    SymIntV,
    TensorDef,
    TensorListV,
)
from edgetorch.formats.alignment import ALIGNMENT, align
from edgetorch.formats.control_flow import check_instruction
from edgetorch.formats.dtypes import PLAIN_CODE_TO_DTYPE, storage_nbytes
from edgetorch.formats.errors import ProgramFormatError


def _plain_scalar_type(code: int) -> bool:
    return code in PLAIN_CODE_TO_DTYPE


def _check_mutable(p: PlanDef, k: int, v: TensorDef, fail: Callable[[str, str], None]) -> None:
    fld = f"{p.name}.values[{k}].buffer_index"
    if not 0 <= v.buffer_index < len(p.mutable_buffers):
        fail(f"method '{p.name}': tensor value {k} refers to mutable buffer {v.buffer_index}, but the method has "
             f"{len(p.mutable_buffers)}", fld)
    mb = p.mutable_buffers[v.buffer_index]
    if mb.scalar_type != v.scalar_type or tuple(mb.sizes) != tuple(v.sizes) or v.sym_shape:
        fail(f"method '{p.name}': tensor value {k} does not match the dtype/shape of mutable buffer '{mb.name}'", fld)


def _check_symbols(p: PlanDef, fail: Callable[[str, str], None]) -> None:
    for j, sym in enumerate(p.symbols):
        fld = f"{p.name}.symbols[{j}]"
        if not 0 <= sym.min <= sym.max <= symexpr.MAX_LITERAL:
            fail(f"method '{p.name}': symbol '{sym.name}' has the range [{sym.min}, {sym.max}]", fld)
        if not 0 <= sym.input < len(p.inputs):
            fail(f"method '{p.name}': symbol '{sym.name}' is read from input {sym.input}, but the method has "
                 f"{len(p.inputs)}", fld)
        v = p.values[p.inputs[sym.input]] if 0 <= p.inputs[sym.input] < len(p.values) else None
        ok = (sym.dim == -1 and isinstance(v, (int, SymIntV))) or (
            isinstance(v, TensorDef) and 0 <= sym.dim < len(v.sizes))
        if not ok:
            fail(f"method '{p.name}': symbol '{sym.name}' is read from dim {sym.dim} of input {sym.input}, which "
                 "has no such dim", fld)


MAX_TENSOR_BYTES = 1 << 44  # no dim, stride or extent of a sane tensor comes near this (16 TiB)


def _check_extent(p: PlanDef, k: int, v: TensorDef, program: ProgramDef, fail: Callable[[str, str], None],
                  kernel_written: frozenset[int] = frozenset()) -> None:
    """The elements ``sizes``/``strides``/``storage_offset`` address lie inside the bytes the tensor owns
    (its arena slot or its constant), so that no view made from them reads or writes outside. A tensor a kernel
    writes (``kernel_written``) must not have elements sharing memory; a delegate may return a broadcast
    (stride-0) tensor, which the runtime stores element by element."""
    fld = f"{p.name}.values[{k}]"
    itemsize = PLAIN_CODE_TO_DTYPE[v.scalar_type].itemsize
    if v.storage_offset < 0 or any(st < 0 for st in v.strides):
        fail(f"method '{p.name}': tensor value {k} has a negative stride or storage offset", fld + ".strides")
    if any(x > MAX_TENSOR_BYTES for x in (*v.sizes, *v.strides, v.storage_offset, v.nbytes)):
        fail(f"method '{p.name}': tensor value {k} has an implausible size, stride, offset or byte count",
             fld + ".sizes")
    extent = storage_nbytes(v.sizes, v.strides, v.storage_offset, itemsize)
    if v.placement == PLACEMENT_PLANNED:
        if v.arena_offset % ALIGNMENT and v.nbytes:
            fail(f"method '{p.name}': tensor value {k} starts at arena byte {v.arena_offset}, not a multiple of "
                 f"{ALIGNMENT}", fld + ".arena_offset")
        if extent > v.nbytes:
            fail(f"method '{p.name}': tensor value {k} (sizes {list(v.sizes)}, strides {list(v.strides)}, offset "
                 f"{v.storage_offset}) spans {extent} bytes but its arena slot has {v.nbytes}", fld + ".nbytes")
        if k in kernel_written and _overlaps(v.sizes, v.strides):
            fail(f"method '{p.name}': planned tensor value {k} (sizes {list(v.sizes)}, strides {list(v.strides)}) "
                 "has elements sharing memory; kernels cannot write it", fld + ".strides")
    elif v.placement == PLACEMENT_CONSTANT and 0 <= v.constant_index < len(program.constants):
        size = program.constants[v.constant_index][1]
        if extent > v.nbytes:
            fail(f"method '{p.name}': tensor value {k} (sizes {list(v.sizes)}, strides {list(v.strides)}, offset "
                 f"{v.storage_offset}) spans {extent} bytes but records {v.nbytes}", fld + ".nbytes")
        if extent > size:
            fail(f"method '{p.name}': tensor value {k} (sizes {list(v.sizes)}, strides {list(v.strides)}, offset "
                 f"{v.storage_offset}) spans {extent} bytes but constant {v.constant_index} has {size}",
                 fld + ".sizes")


def _check_enum_value(p: PlanDef, k: int, v: Any, fail: Callable[[str, str], None]) -> None:
    """A dtype, layout, memory format or device argument the runtime can turn into its torch object."""
    from edgetorch.formats.dtypes import CODE_TO_LAYOUT, CODE_TO_MEMORY_FORMAT

    ok = (isinstance(v, DtypeV) and _plain_scalar_type(v.scalar_type)) \
        or (isinstance(v, LayoutV) and v.value in CODE_TO_LAYOUT) \
        or (isinstance(v, MemoryFormatV) and v.value in CODE_TO_MEMORY_FORMAT) \
        or (isinstance(v, DeviceV) and (v.value in ("cpu", "meta") or v.value.startswith("cpu:")))
    if not ok:
        fail(f"method '{p.name}': value {k} is an unknown {type(v).__name__[:-1].lower()} {v}", f"{p.name}.values[{k}]")


def _overlaps(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """True when two elements of the layout share an address (a planned tensor is written, so it must not)."""
    need = 1
    for st, n in sorted((st, n) for n, st in zip(sizes, strides) if n > 1):
        if st < need:
            return True
        need = st * n
    return False


def _check_arena(p: PlanDef, fail: Callable[[str, str], None]) -> None:
    """The arena is no larger than its planned tensors need (a corrupted size would allocate without bound)."""
    end = 0
    for v in p.values:
        if isinstance(v, TensorDef) and v.placement == PLACEMENT_PLANNED and v.nbytes:
            end = max(end, v.arena_offset + v.nbytes)
    if p.arena_size < 0 or p.arena_size > align(end):
        fail(f"method '{p.name}': arena_size {p.arena_size} does not match its planned tensors (which end at "
             f"byte {end})", f"{p.name}.arena_size")
    if not 0 <= p.debug_buffer_bytes <= MAX_TENSOR_BYTES:
        fail(f"method '{p.name}': debug_buffer_bytes {p.debug_buffer_bytes} is implausible",
             f"{p.name}.debug_buffer_bytes")


MAX_SPEC_NODES = 1 << 16


def check_spec(text: str, fld: str) -> None:
    """An ``input_spec``/``output_spec``: empty, or ``treespec_dumps`` JSON ``[protocol, node]`` whose every node
    is ``{"type": str | null, "context": str | null, "children_spec": [node, ...]}``."""
    if not text:
        return
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ProgramFormatError(f"{fld} is not valid JSON ({type(e).__name__})", field=fld) from None
    if not (isinstance(doc, list) and len(doc) == 2 and isinstance(doc[0], int) and isinstance(doc[1], dict)):
        raise ProgramFormatError(f"{fld} is not a [protocol, tree] pair", field=fld)
    stack, count = [doc[1]], 0
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_SPEC_NODES:
            raise ProgramFormatError(f"{fld} has more than {MAX_SPEC_NODES} nodes", field=fld)
        ok = isinstance(node, dict) and set(node) >= {"type", "context", "children_spec"} \
            and isinstance(node["children_spec"], list) \
            and all(node[k] is None or isinstance(node[k], str) for k in ("type", "context"))
        if not ok:
            raise ProgramFormatError(f"{fld} has a malformed node (type, context and children_spec are required)",
                                     field=fld)
        stack.extend(node["children_spec"])


Fail = Callable[[str, str], None]


def _fail(msg: str, fld: str) -> None:
    raise ProgramFormatError(msg, field=fld)


def check_consistency(program: ProgramDef, segment_size: int) -> None:
    """Checks every index, offset and size against its bounds (``Verification.InternalConsistency``)."""
    for i, (off, size) in enumerate(program.constants):
        if off % ALIGNMENT or off + size > segment_size:
            _fail(f"constant {i}: range [{off}, {off + size}) is misaligned or outside the segment area "
                  f"({segment_size} bytes)", f"constants[{i}]")
    for i, (off, size) in enumerate(program.delegate_data):
        if off % ALIGNMENT or off + size > segment_size:
            _fail(f"delegate blob {i}: range [{off}, {off + size}) is misaligned or outside the segment area "
                  f"({segment_size} bytes)", f"delegate_data[{i}]")
    _check_named_data(program, segment_size)
    names = set()
    for p in program.plans:
        if p.name in names:
            _fail(f"method '{p.name}' appears twice", "execution_plans")
        names.add(p.name)
        _check_plan(program, p)


def _check_named_data(program: ProgramDef, segment_size: int) -> None:
    """Every named-data entry: a non-empty key, unique, and an aligned range inside the segment area."""
    keys: set[str] = set()
    for i, (key, off, size) in enumerate(program.named_data):
        fld = f"named_data[{i}]"
        if not key:
            _fail(f"named data {i} has an empty key", fld)
        if key in keys:
            _fail(f"named data key '{key}' appears twice", fld)
        keys.add(key)
        if off % ALIGNMENT or off + size > segment_size:
            _fail(f"named data '{key}': range [{off}, {off + size}) is misaligned or outside the segment area "
                  f"({segment_size} bytes)", fld)


def _index_checker(p: PlanDef) -> Callable[..., None]:
    """``idx(i, what, fld, allow_none=False)``: value index ``i`` lies in ``p``'s values (-1 allowed for None)."""
    nv = len(p.values)

    def idx(i: int, what: str, fld: str, allow_none: bool = False) -> None:
        if allow_none and i == -1:
            return
        if not 0 <= i < nv:
            _fail(f"method '{p.name}': {what} refers to value {i}, but the method has {nv} values", f"{p.name}.{fld}")
    return idx


def _check_plan(program: ProgramDef, p: PlanDef) -> None:
    where = f"method '{p.name}'"
    idx = _index_checker(p)
    nv = len(p.values)
    kernel_written = frozenset(o for ins in p.instructions if isinstance(ins.call, KernelCallDef)
                               and ins.call.kind != CALL_VIEW for o in ins.call.outputs) | set(p.inputs)
    for k, ins in enumerate(p.instructions):  # weights are read-only: no instruction writes a constant
        for o in ins.call.outputs:
            v = p.values[o] if 0 <= o < nv else None
            if isinstance(v, TensorDef) and v.placement == PLACEMENT_CONSTANT:
                _fail(f"{where}: instruction {k} writes value {o}, a constant", f"{p.name}.instructions[{k}]")
    for k, v in enumerate(p.values):
        if isinstance(v, TensorDef):
            _check_tensor(program, p, k, v, kernel_written)
        elif isinstance(v, (TensorListV, OptionalTensorListV)):
            for j in v.items:
                idx(j, f"list value {k}", f"values[{k}]", allow_none=isinstance(v, OptionalTensorListV))
        elif isinstance(v, (DtypeV, LayoutV, MemoryFormatV, DeviceV)):
            _check_enum_value(p, k, v, _fail)
        elif isinstance(v, SymIntV):
            symexpr.parse_expr(v.expr, len(p.symbols), f"{p.name}.values[{k}]")
        elif isinstance(v, SymIntListV):
            symexpr.parse_expr_list(v.exprs, len(p.symbols), f"{p.name}.values[{k}]")
    _check_symbols(p, _fail)
    _check_arena(p, _fail)
    check_spec(p.input_spec, f"{p.name}.input_spec")
    check_spec(p.output_spec, f"{p.name}.output_spec")
    _check_mutable_buffers(program, p)
    for j, i in enumerate(p.inputs):
        idx(i, f"input {j}", f"inputs[{j}]")
    for j, i in enumerate(p.outputs):
        idx(i, f"output {j}", f"outputs[{j}]")
    if len(p.input_names) != len(p.inputs) or len(p.output_names) != len(p.outputs):
        _fail(f"{where}: input/output name tables do not match the input/output lists", f"{p.name}.input_names")
    _check_instructions(p, idx)
    for k, d in enumerate(p.delegates):
        if not 0 <= d.data_index < len(program.delegate_data):
            _fail(f"{where}: delegate {k} refers to blob {d.data_index}, but the program has "
                  f"{len(program.delegate_data)}", f"{p.name}.delegates[{k}].data_index")


def _check_tensor(program: ProgramDef, p: PlanDef, k: int, v: TensorDef, kernel_written: frozenset[int]) -> None:
    where = f"method '{p.name}'"
    if not _plain_scalar_type(v.scalar_type):
        _fail(f"{where}: tensor value {k} has unknown or unsupported scalar type {v.scalar_type}",
              f"{p.name}.values[{k}].scalar_type")
    if len(v.sizes) != len(v.strides):
        _fail(f"{where}: tensor value {k} has {len(v.sizes)} sizes but {len(v.strides)} strides",
              f"{p.name}.values[{k}]")
    if any(s < 0 for s in v.sizes) or v.nbytes < 0:
        _fail(f"{where}: tensor value {k} has a negative size", f"{p.name}.values[{k}]")
    _check_extent(p, k, v, program, _fail, kernel_written)
    if v.placement == PLACEMENT_PLANNED:
        if v.arena_offset < 0 or v.arena_offset + v.nbytes > p.arena_size:
            _fail(f"{where}: tensor value {k} spans arena bytes [{v.arena_offset}, "
                  f"{v.arena_offset + v.nbytes}) but the arena has {p.arena_size}",
                  f"{p.name}.values[{k}].arena_offset")
    elif v.placement == PLACEMENT_CONSTANT:
        if not 0 <= v.constant_index < len(program.constants):
            _fail(f"{where}: tensor value {k} refers to constant {v.constant_index}, but the program "
                  f"has {len(program.constants)}", f"{p.name}.values[{k}].constant_index")
        if v.nbytes > program.constants[v.constant_index][1]:
            _fail(f"{where}: tensor value {k} needs {v.nbytes} bytes but constant "
                  f"{v.constant_index} has {program.constants[v.constant_index][1]}",
                  f"{p.name}.values[{k}].nbytes")
    elif v.placement == PLACEMENT_MUTABLE:
        _check_mutable(p, k, v, _fail)
    elif v.placement not in (PLACEMENT_ALIAS, PLACEMENT_DYNAMIC):
        _fail(f"{where}: tensor value {k} has unknown placement {v.placement}", f"{p.name}.values[{k}]")
    if v.sym_shape:
        symexpr.parse_sym_shape(v.sym_shape, len(v.sizes), len(p.symbols), f"{p.name}.values[{k}]")


def _check_mutable_buffers(program: ProgramDef, p: PlanDef) -> None:
    for j, mb in enumerate(p.mutable_buffers):
        if not _plain_scalar_type(mb.scalar_type) or any(not 0 <= n <= MAX_TENSOR_BYTES for n in mb.sizes):
            _fail(f"method '{p.name}': mutable buffer '{mb.name}' has an unknown scalar type {mb.scalar_type} or a "
                  "bad size", f"{p.name}.mutable_buffers[{j}]")
        nbytes = PLAIN_CODE_TO_DTYPE[mb.scalar_type].itemsize * math.prod(mb.sizes)
        if nbytes > MAX_TENSOR_BYTES:
            _fail(f"method '{p.name}': mutable buffer '{mb.name}' would need {nbytes} bytes (more than "
                  f"{MAX_TENSOR_BYTES})", f"{p.name}.mutable_buffers[{j}].sizes")
        if mb.constant_index != MUTABLE_ZERO_INIT and not 0 <= mb.constant_index < len(program.constants):
            _fail(f"method '{p.name}': mutable buffer '{mb.name}' refers to constant {mb.constant_index}, but the "
                  f"program has {len(program.constants)}", f"{p.name}.mutable_buffers[{j}].constant_index")


def _check_instructions(p: PlanDef, idx: Callable[..., None]) -> None:
    where = f"method '{p.name}'"
    for k, ins in enumerate(p.instructions):
        c = ins.call
        if isinstance(c, KernelCallDef):
            if not 0 <= c.op_index < len(p.operators):
                _fail(f"{where}: instruction {k} calls operator {c.op_index}, but the method has "
                      f"{len(p.operators)}", f"{p.name}.instructions[{k}].op_index")
            if c.kind not in CALL_KIND_NAMES:
                _fail(f"{where}: instruction {k} has unknown call kind {c.kind}", f"{p.name}.instructions[{k}]")
        elif isinstance(c, (MoveCallDef, JumpFalseCallDef)):
            check_instruction(p, k)  # destination, condition kind, move dtypes and shapes
        else:
            if not 0 <= c.delegate_index < len(p.delegates):
                _fail(f"{where}: instruction {k} calls delegate {c.delegate_index}, but the method has "
                      f"{len(p.delegates)}", f"{p.name}.instructions[{k}].delegate_index")
        for j in c.args:
            idx(j, f"instruction {k} ({ins.node_name}) argument", f"instructions[{k}].args", allow_none=True)
        for j in c.outputs:
            idx(j, f"instruction {k} ({ins.node_name}) output", f"instructions[{k}].outputs")
