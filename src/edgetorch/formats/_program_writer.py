"""The one writer of the program file (.pte): the flatbuffer ``Program`` from a ``ProgramDef``, the segment
area (``SegmentLayout``) and the header with its chunked content hash. Re-exported by ``formats.program``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO

import flatbuffers

from edgetorch.formats._generated import program_generated as fb
from edgetorch.formats._program_defs import (
    FB_IDENTIFIER,
    HEADER,
    HEADER_SIZE,
    HEADER_VERSION,
    MAGIC,
    BoolListV,
    DelegateCallDef,
    DeviceV,
    DoubleListV,
    DtypeV,
    IntListV,
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
    Value,
)
from edgetorch.formats.alignment import ALIGNMENT, align


def _vec(b: flatbuffers.Builder, start, items: Sequence, prepend) -> int:
    start(b, len(items))
    for x in reversed(items):
        prepend(x)
    return b.EndVector()


def _long_vec(b, start, items):
    return _vec(b, start, items, b.PrependInt64)


def _int_vec(b, start, items):
    return _vec(b, start, items, b.PrependInt32)


def _offset_vec(b, start, offsets):
    return _vec(b, start, offsets, b.PrependUOffsetTRelative)


def _strings(b, start, strings):
    offs = [b.CreateString(s) for s in strings]
    return _offset_vec(b, start, offs)


def _scalar(start, add, end, kind):
    """A writer for a one-field union member (``Bool``, ``Int``, ``Double``, ``Dtype``, ...)."""
    def write(b: flatbuffers.Builder, x) -> tuple[int, int]:
        start(b)
        add(b, x)
        return kind, end(b)
    return write


def _string_member(start, add, end, kind):
    """A writer for a union member holding one string (``String``, ``Device``, ``SymInt``, ``SymIntList``)."""
    def write(b: flatbuffers.Builder, x: str) -> tuple[int, int]:
        s = b.CreateString(x)
        start(b)
        add(b, s)
        return kind, end(b)
    return write


def _list_member(start_vector, prepend, start, add, end, kind):
    """A writer for a union member holding one vector of scalars (``IntList``, ``TensorList``, ...)."""
    def write(b: flatbuffers.Builder, items) -> tuple[int, int]:
        vec = _vec(b, start_vector, items, getattr(b, prepend))
        start(b)
        add(b, vec)
        return kind, end(b)
    return write


def _write_tensor(b: flatbuffers.Builder, v: TensorDef) -> tuple[int, int]:
    sizes = _long_vec(b, fb.TensorStartSizesVector, v.sizes)
    strides = _long_vec(b, fb.TensorStartStridesVector, v.strides)
    sym = b.CreateSharedString(v.sym_shape) if v.sym_shape else None
    fb.TensorStart(b)
    fb.TensorAddScalarType(b, v.scalar_type)
    fb.TensorAddSizes(b, sizes)
    fb.TensorAddStrides(b, strides)
    fb.TensorAddStorageOffset(b, v.storage_offset)
    fb.TensorAddPlacement(b, v.placement)
    fb.TensorAddArenaOffset(b, v.arena_offset)
    fb.TensorAddNbytes(b, v.nbytes)
    fb.TensorAddConstantIndex(b, v.constant_index)
    if sym is not None:
        fb.TensorAddSymShape(b, sym)
    fb.TensorAddBufferIndex(b, v.buffer_index)
    return fb.KernelTypes.Tensor, fb.TensorEnd(b)


_K = fb.KernelTypes
#: (Python type, the field of it written, writer), tried in order: ``bool`` before ``int``, as ``isinstance`` sees
_VALUE_WRITERS: list[tuple[type, str | None, Callable[[flatbuffers.Builder, Any], tuple[int, int]]]] = [
    (TensorDef, None, _write_tensor),
    (bool, None, _scalar(fb.BoolStart, fb.BoolAddValue, fb.BoolEnd, _K.Bool)),
    (int, None, _scalar(fb.IntStart, fb.IntAddValue, fb.IntEnd, _K.Int)),
    (float, None, _scalar(fb.DoubleStart, fb.DoubleAddValue, fb.DoubleEnd, _K.Double)),
    (str, None, _string_member(fb.StringStart, fb.StringAddValue, fb.StringEnd, _K.String)),
    (IntListV, "items", _list_member(fb.IntListStartItemsVector, "PrependInt64", fb.IntListStart,
                                     fb.IntListAddItems, fb.IntListEnd, _K.IntList)),
    (DoubleListV, "items", _list_member(fb.DoubleListStartItemsVector, "PrependFloat64", fb.DoubleListStart,
                                        fb.DoubleListAddItems, fb.DoubleListEnd, _K.DoubleList)),
    (BoolListV, "items", _list_member(fb.BoolListStartItemsVector, "PrependBool", fb.BoolListStart,
                                      fb.BoolListAddItems, fb.BoolListEnd, _K.BoolList)),
    (TensorListV, "items", _list_member(fb.TensorListStartItemsVector, "PrependInt32", fb.TensorListStart,
                                        fb.TensorListAddItems, fb.TensorListEnd, _K.TensorList)),
    (OptionalTensorListV, "items", _list_member(
        fb.OptionalTensorListStartItemsVector, "PrependInt32", fb.OptionalTensorListStart,
        fb.OptionalTensorListAddItems, fb.OptionalTensorListEnd, _K.OptionalTensorList)),
    (DtypeV, "scalar_type", _scalar(fb.DtypeStart, fb.DtypeAddScalarType, fb.DtypeEnd, _K.Dtype)),
    (LayoutV, "value", _scalar(fb.LayoutStart, fb.LayoutAddValue, fb.LayoutEnd, _K.Layout)),
    (MemoryFormatV, "value", _scalar(fb.MemoryFormatStart, fb.MemoryFormatAddValue, fb.MemoryFormatEnd,
                                     _K.MemoryFormat)),
    (DeviceV, "value", _string_member(fb.DeviceStart, fb.DeviceAddValue, fb.DeviceEnd, _K.Device)),
    (SymIntV, "expr", _string_member(fb.SymIntStart, fb.SymIntAddExpr, fb.SymIntEnd, _K.SymInt)),
    (SymIntListV, "exprs", _string_member(fb.SymIntListStart, fb.SymIntListAddExprs, fb.SymIntListEnd,
                                          _K.SymIntList)),
]


def _write_value(b: flatbuffers.Builder, v: Value) -> tuple[int, int]:
    """Builds the union member for ``v``; returns (union type, offset)."""
    if v is None:
        fb.NullStart(b)
        return _K.Null, fb.NullEnd(b)
    for cls, attr, write in _VALUE_WRITERS:
        if isinstance(v, cls):
            return write(b, v if attr is None else getattr(v, attr))
    raise TypeError(f"cannot serialize value of type {type(v).__name__}: {v!r}")


def _write_symbols(b: flatbuffers.Builder, p: PlanDef) -> tuple[int, int]:
    offs = []
    for sym in p.symbols:
        n = b.CreateString(sym.name)
        fb.SymbolStart(b)
        fb.SymbolAddName(b, n)
        fb.SymbolAddMin(b, sym.min)
        fb.SymbolAddMax(b, sym.max)
        fb.SymbolAddInput(b, sym.input)
        fb.SymbolAddDim(b, sym.dim)
        offs.append(fb.SymbolEnd(b))
    symbols = _offset_vec(b, fb.ExecutionPlanStartSymbolsVector, offs)
    offs = []
    for mb in p.mutable_buffers:
        n = b.CreateString(mb.name)
        sizes = _long_vec(b, fb.MutableBufferStartSizesVector, mb.sizes)
        fb.MutableBufferStart(b)
        fb.MutableBufferAddName(b, n)
        fb.MutableBufferAddConstantIndex(b, mb.constant_index)
        fb.MutableBufferAddScalarType(b, mb.scalar_type)
        fb.MutableBufferAddSizes(b, sizes)
        offs.append(fb.MutableBufferEnd(b))
    return symbols, _offset_vec(b, fb.ExecutionPlanStartMutableBuffersVector, offs)


def _write_values(b: flatbuffers.Builder, p: PlanDef) -> int:
    value_offs = []
    for v in p.values:
        t, off = _write_value(b, v)
        fb.EValueStart(b)
        fb.EValueAddValType(b, t)
        fb.EValueAddVal(b, off)
        value_offs.append(fb.EValueEnd(b))
    return _offset_vec(b, fb.ExecutionPlanStartValuesVector, value_offs)


def _write_operators(b: flatbuffers.Builder, p: PlanDef) -> int:
    op_offs = []
    for op in p.operators:
        n, o = b.CreateString(op.name), b.CreateString(op.overload)
        fb.OperatorStart(b)
        fb.OperatorAddName(b, n)
        fb.OperatorAddOverload(b, o)
        op_offs.append(fb.OperatorEnd(b))
    return _offset_vec(b, fb.ExecutionPlanStartOperatorsVector, op_offs)


def _write_delegates(b: flatbuffers.Builder, p: PlanDef) -> int:
    del_offs = []
    for d in p.delegates:
        spec_offs = []
        for key, value in d.compile_specs:
            k = b.CreateString(key)
            val = b.CreateByteVector(bytes(value))
            fb.CompileSpecStart(b)
            fb.CompileSpecAddKey(b, k)
            fb.CompileSpecAddValue(b, val)
            spec_offs.append(fb.CompileSpecEnd(b))
        specs = _offset_vec(b, fb.BackendDelegateStartCompileSpecsVector, spec_offs)
        bid = b.CreateString(d.backend_id)
        fb.BackendDelegateStart(b)
        fb.BackendDelegateAddBackendId(b, bid)
        fb.BackendDelegateAddDataIndex(b, d.data_index)
        fb.BackendDelegateAddCompileSpecs(b, specs)
        del_offs.append(fb.BackendDelegateEnd(b))
    return _offset_vec(b, fb.ExecutionPlanStartDelegatesVector, del_offs)


def _write_call(b: flatbuffers.Builder, c: KernelCallDef | DelegateCallDef | MoveCallDef | JumpFalseCallDef
                ) -> tuple[int, int]:
    """An instruction's call: (offset, union type)."""
    if isinstance(c, KernelCallDef):
        args = _int_vec(b, fb.KernelCallStartArgsVector, c.args)
        outs = _int_vec(b, fb.KernelCallStartOutputsVector, c.outputs)
        fb.KernelCallStart(b)
        fb.KernelCallAddOpIndex(b, c.op_index)
        fb.KernelCallAddKind(b, c.kind)
        fb.KernelCallAddArgs(b, args)
        fb.KernelCallAddOutputs(b, outs)
        return fb.KernelCallEnd(b), fb.InstructionArguments.KernelCall
    if isinstance(c, MoveCallDef):
        fb.MoveCallStart(b)
        fb.MoveCallAddMoveFrom(b, c.move_from)
        fb.MoveCallAddMoveTo(b, c.move_to)
        return fb.MoveCallEnd(b), fb.InstructionArguments.MoveCall
    if isinstance(c, JumpFalseCallDef):
        fb.JumpFalseCallStart(b)
        fb.JumpFalseCallAddCondValueIndex(b, c.cond_value_index)
        fb.JumpFalseCallAddDestinationInstruction(b, c.destination_instruction)
        return fb.JumpFalseCallEnd(b), fb.InstructionArguments.JumpFalseCall
    args = _int_vec(b, fb.DelegateCallStartArgsVector, c.args)
    outs = _int_vec(b, fb.DelegateCallStartOutputsVector, c.outputs)
    fb.DelegateCallStart(b)
    fb.DelegateCallAddDelegateIndex(b, c.delegate_index)
    fb.DelegateCallAddArgs(b, args)
    fb.DelegateCallAddOutputs(b, outs)
    return fb.DelegateCallEnd(b), fb.InstructionArguments.DelegateCall


def _write_instructions(b: flatbuffers.Builder, p: PlanDef) -> int:
    instr_offs = []
    for ins in p.instructions:
        call_off, call_t = _write_call(b, ins.call)
        name, src = b.CreateString(ins.node_name), b.CreateSharedString(ins.source)
        fb.InstructionStart(b)
        fb.InstructionAddInstrArgsType(b, call_t)
        fb.InstructionAddInstrArgs(b, call_off)
        fb.InstructionAddNodeName(b, name)
        fb.InstructionAddDebugHandle(b, ins.debug_handle)
        fb.InstructionAddSource(b, src)
        instr_offs.append(fb.InstructionEnd(b))
    return _offset_vec(b, fb.ExecutionPlanStartInstructionsVector, instr_offs)


def _write_plan(b: flatbuffers.Builder, p: PlanDef) -> int:
    values = _write_values(b, p)
    operators = _write_operators(b, p)
    delegates = _write_delegates(b, p)
    instructions = _write_instructions(b, p)
    inputs = _int_vec(b, fb.ExecutionPlanStartInputsVector, p.inputs)
    outputs = _int_vec(b, fb.ExecutionPlanStartOutputsVector, p.outputs)
    in_names = _strings(b, fb.ExecutionPlanStartInputNamesVector, p.input_names)
    out_names = _strings(b, fb.ExecutionPlanStartOutputNamesVector, p.output_names)
    name = b.CreateString(p.name)
    in_spec = b.CreateString(p.input_spec)
    out_spec = b.CreateString(p.output_spec)
    symbols, mutable = _write_symbols(b, p)
    fb.ExecutionPlanStart(b)
    fb.ExecutionPlanAddName(b, name)
    fb.ExecutionPlanAddValues(b, values)
    fb.ExecutionPlanAddInputs(b, inputs)
    fb.ExecutionPlanAddOutputs(b, outputs)
    fb.ExecutionPlanAddInputSpec(b, in_spec)
    fb.ExecutionPlanAddOutputSpec(b, out_spec)
    fb.ExecutionPlanAddInputNames(b, in_names)
    fb.ExecutionPlanAddOutputNames(b, out_names)
    fb.ExecutionPlanAddOperators(b, operators)
    fb.ExecutionPlanAddDelegates(b, delegates)
    fb.ExecutionPlanAddInstructions(b, instructions)
    fb.ExecutionPlanAddArenaSize(b, p.arena_size)
    fb.ExecutionPlanAddDebugBufferBytes(b, p.debug_buffer_bytes)
    fb.ExecutionPlanAddSymbols(b, symbols)
    fb.ExecutionPlanAddMutableBuffers(b, mutable)
    return fb.ExecutionPlanEnd(b)


def _ranges(b, start, ranges):
    start(b, len(ranges))
    for off, size in reversed(ranges):
        fb.CreateDataRange(b, off, size)
    return b.EndVector()


def _named_data(b: flatbuffers.Builder, entries: Sequence[tuple[str, int, int]]) -> int:
    tables = []
    for key, off, size in entries:
        k = b.CreateString(key)
        fb.NamedDataStart(b)
        fb.NamedDataAddKey(b, k)
        fb.NamedDataAddOffset(b, off)
        fb.NamedDataAddSize(b, size)
        tables.append(fb.NamedDataEnd(b))
    return _offset_vec(b, fb.ProgramStartNamedDataVector, tables)


def encode_flatbuffer(program: ProgramDef) -> bytes:
    b = flatbuffers.Builder(1 << 16)
    plans = [_write_plan(b, p) for p in program.plans]
    plans_vec = _offset_vec(b, fb.ProgramStartExecutionPlansVector, plans)
    consts = _ranges(b, fb.ProgramStartConstantsVector, program.constants)
    dels = _ranges(b, fb.ProgramStartDelegateDataVector, program.delegate_data)
    named = _named_data(b, program.named_data) if program.named_data else None
    fb.ProgramStart(b)
    fb.ProgramAddVersion(b, program.version)
    fb.ProgramAddExecutionPlans(b, plans_vec)
    fb.ProgramAddConstants(b, consts)
    fb.ProgramAddDelegateData(b, dels)
    if named is not None:
        fb.ProgramAddNamedData(b, named)
    root = fb.ProgramEnd(b)
    b.Finish(root, file_identifier=FB_IDENTIFIER)
    return bytes(b.Output())


class SegmentLayout:
    """Places byte blobs in the segment area, 64-byte aligned, deduplicating identical blobs by hash."""

    def __init__(self) -> None:
        self.blobs: list[memoryview] = []
        self.ranges: list[tuple[int, int]] = []
        self.size = 0
        self._by_hash: dict[bytes, int] = {}

    def add(self, data: memoryview | bytes, dedup_key: bytes | None = None) -> int:
        """Adds a blob; returns its index into ``ranges`` (shared with an identical earlier blob)."""
        if dedup_key is not None and dedup_key in self._by_hash:
            return self._by_hash[dedup_key]
        mv = memoryview(data).cast("B")
        off = align(self.size)
        self.blobs.append(mv)
        self.ranges.append((off, mv.nbytes))
        self.size = off + mv.nbytes
        idx = len(self.ranges) - 1
        if dedup_key is not None:
            self._by_hash[dedup_key] = idx
        return idx

    def chunks(self) -> Iterable[bytes | memoryview]:
        """The segment area as consecutive chunks (blobs and zero padding)."""
        pos = 0
        for (off, size), mv in zip(self.ranges, self.blobs):
            if size == 0:
                continue
            if off > pos:
                yield b"\0" * (off - pos)
            yield mv
            pos = off + size


def build_file_parts(program: ProgramDef, segments: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """Returns the chunks of a complete .pte file (header first) for ``program`` and its segment data."""
    fbuf = encode_flatbuffer(program)
    seg_off = align(HEADER_SIZE + len(fbuf))
    seg_size = sum(memoryview(s).nbytes for s in segments)
    pad = b"\0" * (seg_off - HEADER_SIZE - len(fbuf))
    body = [memoryview(fbuf), memoryview(pad), *(memoryview(s).cast("B") for s in segments)]
    digest = _chunked_digest(body, sum(m.nbytes for m in body))
    header = HEADER.pack(MAGIC, HEADER_VERSION, program.version, HEADER_SIZE, len(fbuf), seg_off, seg_size, digest)
    header += b"\0" * (HEADER_SIZE - len(header))
    return [header, fbuf, pad, *segments]


HASH_CHUNKS = 2  # header version 2: the body is hashed in this many pieces (one thread each when verifying)


def hash_boundaries(n: int) -> list[int]:
    """Where header version 2 cuts a body of ``n`` bytes: ``HASH_CHUNKS`` pieces, each boundary a multiple of
    64 bytes (the last piece takes the rest)."""
    cuts = [n * i // HASH_CHUNKS // ALIGNMENT * ALIGNMENT for i in range(HASH_CHUNKS)]
    return cuts + [n]


def combine_digests(digests: Sequence[bytes]) -> bytes:
    """The version-2 content hash: SHA-256 of the concatenated SHA-256 digests of the pieces, in order."""
    return hashlib.sha256(b"".join(digests)).digest()


def _chunked_digest(body: Sequence[memoryview], n: int) -> bytes:
    """The version-2 content hash of the concatenation of ``body`` (``n`` bytes), computed in one pass."""
    cuts = hash_boundaries(n)
    hashers = [hashlib.sha256() for _ in range(HASH_CHUNKS)]
    pos, k = 0, 0
    for m in body:
        start = 0
        while start < m.nbytes:
            while pos + start >= cuts[k + 1] and k < HASH_CHUNKS - 1:
                k += 1
            take = min(m.nbytes - start, cuts[k + 1] - pos - start)
            hashers[k].update(m[start:start + take])
            start += take
        pos += m.nbytes
    return combine_digests([h.digest() for h in hashers])


def write_program(f: BinaryIO, program: ProgramDef, segments: Sequence[bytes | memoryview]) -> str:
    """Writes a .pte to an open binary file; returns the content hash (hex)."""
    parts = build_file_parts(program, segments)
    for p in parts:
        f.write(p)
    return parts[0][HEADER.size - 32:HEADER.size].hex()

