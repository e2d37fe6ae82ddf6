"""The edgetorch program file (.pte): in-memory mirror, the one writer and the one reader.

Layout of a file (all integers little-endian)::

    [0, 128)            file header (``HEADER`` below)
    [128, 128 + fb)     flatbuffer ``Program`` (schema/program.fbs, identifier "EDTP")
    [seg_base, end)     segment area: constant tensors and delegate blobs, each 64-byte aligned

The header carries the schema version, the flatbuffer and segment extents and a SHA-256 content
hash of everything after the header. Readers validate the header first (``Verification.Minimal``),
then optionally every index, offset and size (``check_consistency``).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import flatbuffers

from edgetorch.formats import symexpr
from edgetorch.formats._fbread import Table
from edgetorch.formats._generated import program_generated as fb
from edgetorch.formats.alignment import ALIGNMENT, align, debug_bytes  # also imported from here as pf.align
from edgetorch.formats.dtypes import PLAIN_CODE_TO_DTYPE, code_dtype, storage_nbytes
from edgetorch.formats.errors import ProgramFormatError

MAGIC = b"EDGTPROG"
FB_IDENTIFIER = b"EDTP"
HEADER_VERSION = 2  # 2: the content hash is chunked (``content_hash``); 1: plain SHA-256 of the body (still read)
PROGRAM_SCHEMA_VERSION = 2  # 2: bounded dynamic shapes (symbols, SymInt values) and mutable buffers
HEADER = struct.Struct("<8sIIQQQQ32s")  # magic, header ver, schema ver, fb off, fb size, seg off, seg size, hash
HEADER_SIZE = 128


# ----------------------------------------------------------------------------------------------
# In-memory mirror of the schema
# ----------------------------------------------------------------------------------------------

PLACEMENT_PLANNED = fb.TensorPlacement.PLANNED
PLACEMENT_CONSTANT = fb.TensorPlacement.CONSTANT
PLACEMENT_ALIAS = fb.TensorPlacement.ALIAS
PLACEMENT_DYNAMIC = fb.TensorPlacement.DYNAMIC
PLACEMENT_MUTABLE = fb.TensorPlacement.MUTABLE

CALL_OUT = fb.CallKind.OUT
CALL_FUNCTIONAL_COPY = fb.CallKind.FUNCTIONAL_COPY
CALL_VIEW = fb.CallKind.VIEW
CALL_FUNCTIONAL = fb.CallKind.FUNCTIONAL
CALL_KIND_NAMES = {CALL_OUT: "OUT", CALL_FUNCTIONAL_COPY: "FUNCTIONAL_COPY", CALL_VIEW: "VIEW",
                   CALL_FUNCTIONAL: "FUNCTIONAL"}


@dataclass
class TensorDef:
    scalar_type: int
    sizes: list[int]
    strides: list[int]
    storage_offset: int
    placement: int
    nbytes: int
    arena_offset: int = -1
    constant_index: int = -1
    sym_shape: str = ""  # JSON sizes/strides/offset expressions of a bounded dynamic shape ("" when static)
    buffer_index: int = -1  # MUTABLE: index into PlanDef.mutable_buffers


@dataclass(frozen=True)
class IntListV:
    items: tuple[int, ...]


@dataclass(frozen=True)
class DoubleListV:
    items: tuple[float, ...]


@dataclass(frozen=True)
class BoolListV:
    items: tuple[bool, ...]


@dataclass(frozen=True)
class TensorListV:
    items: tuple[int, ...]


@dataclass(frozen=True)
class OptionalTensorListV:
    items: tuple[int, ...]  # -1 = None


@dataclass(frozen=True)
class DtypeV:
    scalar_type: int


@dataclass(frozen=True)
class LayoutV:
    value: int


@dataclass(frozen=True)
class MemoryFormatV:
    value: int


@dataclass(frozen=True)
class DeviceV:
    value: str


@dataclass(frozen=True)
class SymIntV:
    expr: str  # one JSON expression (formats.symexpr)


@dataclass(frozen=True)
class SymIntListV:
    exprs: str  # a JSON list of expressions


@dataclass(frozen=True)
class SymbolDef:
    """A bounded dynamic dim: read from dim ``dim`` of user input ``input`` (``dim == -1``: the input is the
    int itself) and checked against ``[min, max]`` at every run."""

    name: str
    min: int
    max: int
    input: int
    dim: int


@dataclass(frozen=True)
class MutableBufferDef:
    """A buffer the method updates in place; its initial value is constant ``constant_index``."""

    name: str
    constant_index: int
    scalar_type: int
    sizes: tuple[int, ...]


# A value is one of: None, bool, int, float, str, TensorDef, or one of the *V wrappers above.
Value = Any


@dataclass(frozen=True)
class OperatorDef:
    name: str  # "aten::addmm"
    overload: str  # "out"


@dataclass
class KernelCallDef:
    op_index: int
    kind: int
    args: list[int]
    outputs: list[int]


@dataclass
class DelegateCallDef:
    delegate_index: int
    args: list[int]
    outputs: list[int]


@dataclass
class InstructionDef:
    call: KernelCallDef | DelegateCallDef
    node_name: str = ""
    debug_handle: int = 0
    source: str = ""


@dataclass
class BackendDelegateDef:
    backend_id: str
    data_index: int
    compile_specs: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class PlanDef:
    name: str
    values: list[Value]
    inputs: list[int]
    outputs: list[int]
    input_spec: str
    output_spec: str
    input_names: list[str]
    output_names: list[str]
    operators: list[OperatorDef]
    delegates: list[BackendDelegateDef]
    instructions: list[InstructionDef]
    arena_size: int
    debug_buffer_bytes: int
    symbols: list[SymbolDef] = field(default_factory=list)
    mutable_buffers: list[MutableBufferDef] = field(default_factory=list)


def value_nbytes(plan: PlanDef, vid: int) -> int:
    """The bytes of value ``vid`` when it is a tensor (at the upper bound of a dynamic shape), else 0."""
    t = plan.values[vid]
    if not isinstance(t, TensorDef):
        return 0
    n = code_dtype(t.scalar_type).itemsize
    for s in t.sizes:
        n *= s
    return n


def run_debug_bytes(plan: PlanDef, delegate_bytes: int = 0) -> int:
    """Debug-buffer bytes one traced run of ``plan`` stores (the one formula, ``alignment.debug_bytes``): its
    tensor inputs, every output of every non-view instruction (an in-place op logs its slot again), each
    program output no instruction logs, plus ``delegate_bytes``, what its delegates declare they log."""
    logged = [o for ins in plan.instructions
              if not (isinstance(ins.call, KernelCallDef) and ins.call.kind == CALL_VIEW)
              for o in ins.call.outputs]
    seen = set(logged)
    vids = [*plan.inputs, *logged, *(v for v in dict.fromkeys(plan.outputs) if v not in seen)]
    return debug_bytes(value_nbytes(plan, v) for v in vids) + delegate_bytes


@dataclass
class ProgramDef:
    plans: list[PlanDef]
    constants: list[tuple[int, int]]  # (offset, size) in the segment area
    delegate_data: list[tuple[int, int]]
    version: int = PROGRAM_SCHEMA_VERSION

    def plan(self, name: str) -> PlanDef:
        for p in self.plans:
            if p.name == name:
                return p
        raise KeyError(name)


# ----------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------

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


def _write_value(b: flatbuffers.Builder, v: Value) -> tuple[int, int]:
    """Builds the union member for ``v``; returns (union type, offset)."""
    K = fb.KernelTypes
    if v is None:
        fb.NullStart(b)
        return K.Null, fb.NullEnd(b)
    if isinstance(v, TensorDef):
        sizes = _long_vec(b, fb.TensorStartSizesVector, v.sizes)
        strides = _long_vec(b, fb.TensorStartStridesVector, v.strides)
        sym = b.CreateString(v.sym_shape) if v.sym_shape else None
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
        return K.Tensor, fb.TensorEnd(b)
    if isinstance(v, bool):
        fb.BoolStart(b)
        fb.BoolAddValue(b, v)
        return K.Bool, fb.BoolEnd(b)
    if isinstance(v, int):
        fb.IntStart(b)
        fb.IntAddValue(b, v)
        return K.Int, fb.IntEnd(b)
    if isinstance(v, float):
        fb.DoubleStart(b)
        fb.DoubleAddValue(b, v)
        return K.Double, fb.DoubleEnd(b)
    if isinstance(v, str):
        s = b.CreateString(v)
        fb.StringStart(b)
        fb.StringAddValue(b, s)
        return K.String, fb.StringEnd(b)
    if isinstance(v, IntListV):
        items = _long_vec(b, fb.IntListStartItemsVector, v.items)
        fb.IntListStart(b)
        fb.IntListAddItems(b, items)
        return K.IntList, fb.IntListEnd(b)
    if isinstance(v, DoubleListV):
        items = _vec(b, fb.DoubleListStartItemsVector, v.items, b.PrependFloat64)
        fb.DoubleListStart(b)
        fb.DoubleListAddItems(b, items)
        return K.DoubleList, fb.DoubleListEnd(b)
    if isinstance(v, BoolListV):
        items = _vec(b, fb.BoolListStartItemsVector, v.items, b.PrependBool)
        fb.BoolListStart(b)
        fb.BoolListAddItems(b, items)
        return K.BoolList, fb.BoolListEnd(b)
    if isinstance(v, TensorListV):
        items = _int_vec(b, fb.TensorListStartItemsVector, v.items)
        fb.TensorListStart(b)
        fb.TensorListAddItems(b, items)
        return K.TensorList, fb.TensorListEnd(b)
    if isinstance(v, OptionalTensorListV):
        items = _int_vec(b, fb.OptionalTensorListStartItemsVector, v.items)
        fb.OptionalTensorListStart(b)
        fb.OptionalTensorListAddItems(b, items)
        return K.OptionalTensorList, fb.OptionalTensorListEnd(b)
    if isinstance(v, DtypeV):
        fb.DtypeStart(b)
        fb.DtypeAddScalarType(b, v.scalar_type)
        return K.Dtype, fb.DtypeEnd(b)
    if isinstance(v, LayoutV):
        fb.LayoutStart(b)
        fb.LayoutAddValue(b, v.value)
        return K.Layout, fb.LayoutEnd(b)
    if isinstance(v, MemoryFormatV):
        fb.MemoryFormatStart(b)
        fb.MemoryFormatAddValue(b, v.value)
        return K.MemoryFormat, fb.MemoryFormatEnd(b)
    if isinstance(v, DeviceV):
        s = b.CreateString(v.value)
        fb.DeviceStart(b)
        fb.DeviceAddValue(b, s)
        return K.Device, fb.DeviceEnd(b)
    if isinstance(v, SymIntV):
        e = b.CreateString(v.expr)
        fb.SymIntStart(b)
        fb.SymIntAddExpr(b, e)
        return K.SymInt, fb.SymIntEnd(b)
    if isinstance(v, SymIntListV):
        e = b.CreateString(v.exprs)
        fb.SymIntListStart(b)
        fb.SymIntListAddExprs(b, e)
        return K.SymIntList, fb.SymIntListEnd(b)
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


def _write_plan(b: flatbuffers.Builder, p: PlanDef) -> int:
    value_offs = []
    for v in p.values:
        t, off = _write_value(b, v)
        fb.EValueStart(b)
        fb.EValueAddValType(b, t)
        fb.EValueAddVal(b, off)
        value_offs.append(fb.EValueEnd(b))
    values = _offset_vec(b, fb.ExecutionPlanStartValuesVector, value_offs)

    op_offs = []
    for op in p.operators:
        n, o = b.CreateString(op.name), b.CreateString(op.overload)
        fb.OperatorStart(b)
        fb.OperatorAddName(b, n)
        fb.OperatorAddOverload(b, o)
        op_offs.append(fb.OperatorEnd(b))
    operators = _offset_vec(b, fb.ExecutionPlanStartOperatorsVector, op_offs)

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
    delegates = _offset_vec(b, fb.ExecutionPlanStartDelegatesVector, del_offs)

    instr_offs = []
    for ins in p.instructions:
        c = ins.call
        if isinstance(c, KernelCallDef):
            args = _int_vec(b, fb.KernelCallStartArgsVector, c.args)
            outs = _int_vec(b, fb.KernelCallStartOutputsVector, c.outputs)
            fb.KernelCallStart(b)
            fb.KernelCallAddOpIndex(b, c.op_index)
            fb.KernelCallAddKind(b, c.kind)
            fb.KernelCallAddArgs(b, args)
            fb.KernelCallAddOutputs(b, outs)
            call_off, call_t = fb.KernelCallEnd(b), fb.InstructionArguments.KernelCall
        else:
            args = _int_vec(b, fb.DelegateCallStartArgsVector, c.args)
            outs = _int_vec(b, fb.DelegateCallStartOutputsVector, c.outputs)
            fb.DelegateCallStart(b)
            fb.DelegateCallAddDelegateIndex(b, c.delegate_index)
            fb.DelegateCallAddArgs(b, args)
            fb.DelegateCallAddOutputs(b, outs)
            call_off, call_t = fb.DelegateCallEnd(b), fb.InstructionArguments.DelegateCall
        name, src = b.CreateString(ins.node_name), b.CreateString(ins.source)
        fb.InstructionStart(b)
        fb.InstructionAddInstrArgsType(b, call_t)
        fb.InstructionAddInstrArgs(b, call_off)
        fb.InstructionAddNodeName(b, name)
        fb.InstructionAddDebugHandle(b, ins.debug_handle)
        fb.InstructionAddSource(b, src)
        instr_offs.append(fb.InstructionEnd(b))
    instructions = _offset_vec(b, fb.ExecutionPlanStartInstructionsVector, instr_offs)

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


def encode_flatbuffer(program: ProgramDef) -> bytes:
    b = flatbuffers.Builder(1 << 16)
    plans = [_write_plan(b, p) for p in program.plans]
    plans_vec = _offset_vec(b, fb.ProgramStartExecutionPlansVector, plans)
    consts = _ranges(b, fb.ProgramStartConstantsVector, program.constants)
    dels = _ranges(b, fb.ProgramStartDelegateDataVector, program.delegate_data)
    fb.ProgramStart(b)
    fb.ProgramAddVersion(b, program.version)
    fb.ProgramAddExecutionPlans(b, plans_vec)
    fb.ProgramAddConstants(b, consts)
    fb.ProgramAddDelegateData(b, dels)
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


# ----------------------------------------------------------------------------------------------
# Reader
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileHeader:
    header_version: int
    schema_version: int
    flatbuffer_offset: int
    flatbuffer_size: int
    segment_offset: int
    segment_size: int
    content_hash: str


#: flatbuffer identifiers (bytes [4, 8)) of the reference ExecuTorch's files, named when one is given as a program
_FOREIGN = {b"ET12": "an ExecuTorch program (.pte): edgetorch's runtime runs edgetorch programs only (export the "
                     "model with edgetorch; the reference's ETDump and ETRecord of it can be inspected)",
            b"BP08": "an ExecuTorch bundled program (.bpte): edgetorch's runtime runs edgetorch programs only "
                     "(devtools.bundled_program.load_bundled_program reads its test cases)"}


def read_header(buf: memoryview | bytes, what: str = "program") -> FileHeader:
    """Validates and returns the file header (the ``Minimal`` verification level)."""
    n = len(buf)
    if n < HEADER_SIZE:
        raise ProgramFormatError(f"{what}: file is truncated ({n} bytes, the header alone is {HEADER_SIZE})",
                                 field="header")
    magic, hver, sver, fb_off, fb_size, seg_off, seg_size, digest = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        kind = _FOREIGN.get(bytes(buf[4:8]), "not an edgetorch program")
        raise ProgramFormatError(f"{what}: {kind} (magic {bytes(magic)!r}, expected {MAGIC!r})",
                                 field="header.magic")
    if hver not in (1, HEADER_VERSION):
        raise ProgramFormatError(f"{what}: unsupported header version {hver} (this reader knows {HEADER_VERSION})",
                                 field="header.version")
    if sver not in (1, PROGRAM_SCHEMA_VERSION):
        raise ProgramFormatError(
            f"{what}: unsupported program schema version {sver} (this runtime reads {PROGRAM_SCHEMA_VERSION})",
            field="header.schema_version")
    if fb_off != HEADER_SIZE or fb_off + fb_size > n:
        raise ProgramFormatError(
            f"{what}: flatbuffer [{fb_off}, {fb_off + fb_size}) lies outside the file ({n} bytes): truncated?",
            field="header.flatbuffer_size")
    if seg_off < fb_off + fb_size or seg_off + seg_size > n:
        raise ProgramFormatError(
            f"{what}: segment area [{seg_off}, {seg_off + seg_size}) lies outside the file ({n} bytes): truncated?",
            field="header.segment_size")
    if fb_size < 8 or bytes(buf[fb_off + 4:fb_off + 8]) != FB_IDENTIFIER:
        raise ProgramFormatError(
            f"{what}: flatbuffer identifier is {bytes(buf[fb_off + 4:fb_off + 8])!r}, expected {FB_IDENTIFIER!r}",
            field="flatbuffer.identifier")
    return FileHeader(hver, sver, fb_off, fb_size, seg_off, seg_size, bytes(digest).hex())


_VALUE_READERS = {}


def _value_reader(kind):
    def deco(f):
        _VALUE_READERS[kind] = f
        return f
    return deco


_K = fb.KernelTypes
_value_reader(_K.Int)(lambda t: int(t.scalar(0, "q")))
_value_reader(_K.Bool)(lambda t: bool(t.scalar(0, "?")))
_value_reader(_K.Double)(lambda t: float(t.scalar(0, "d")))
_value_reader(_K.String)(lambda t: t.string(0))
_value_reader(_K.IntList)(lambda t: IntListV(tuple(t.scalars(0, "q"))))
_value_reader(_K.DoubleList)(lambda t: DoubleListV(tuple(t.scalars(0, "d"))))
_value_reader(_K.BoolList)(lambda t: BoolListV(tuple(bool(x) for x in t.scalars(0, "?"))))
_value_reader(_K.TensorList)(lambda t: TensorListV(tuple(t.scalars(0, "i"))))
_value_reader(_K.OptionalTensorList)(lambda t: OptionalTensorListV(tuple(t.scalars(0, "i"))))
_value_reader(_K.Dtype)(lambda t: DtypeV(t.scalar(0, "b")))
_value_reader(_K.Layout)(lambda t: LayoutV(t.scalar(0, "b")))
_value_reader(_K.MemoryFormat)(lambda t: MemoryFormatV(t.scalar(0, "b")))
_value_reader(_K.Device)(lambda t: DeviceV(t.string(0)))
_value_reader(_K.SymInt)(lambda t: SymIntV(t.string(0)))
_value_reader(_K.SymIntList)(lambda t: SymIntListV(t.string(0)))
_value_reader(_K.Tensor)(lambda t: TensorDef(
    t.scalar(0, "b"), t.scalars(1, "q"), t.scalars(2, "q"), t.scalar(3, "q"), t.scalar(4, "b"), t.scalar(6, "q"),
    t.scalar(5, "q", -1), t.scalar(7, "i", -1), t.string(8), t.scalar(9, "i", -1)))


def _read_value(ev: Table) -> Value:
    kind = ev.scalar(0, "B")
    if kind in (_K.NONE, _K.Null):
        return None
    reader = _VALUE_READERS.get(kind)
    if reader is None:
        raise ProgramFormatError(f"unknown value type tag {kind}", field="values")
    t = ev.table(1)
    if t is None:
        raise ProgramFormatError(f"value of type tag {kind} has no data", field="values")
    return reader(t)


def _read_instruction(ins: Table, i: int, plan: str) -> InstructionDef:
    kind = ins.scalar(0, "B")
    c = ins.table(1)
    if kind == fb.InstructionArguments.KernelCall and c is not None:
        call = KernelCallDef(c.scalar(0, "i"), c.scalar(1, "b"), c.scalars(2, "i"), c.scalars(3, "i"))
    elif kind == fb.InstructionArguments.DelegateCall and c is not None:
        call = DelegateCallDef(c.scalar(0, "i"), c.scalars(1, "i"), c.scalars(2, "i"))
    else:
        raise ProgramFormatError(f"plan '{plan}': instruction {i} has unknown type tag {kind}",
                                 field=f"{plan}.instructions[{i}]")
    return InstructionDef(call, ins.string(2), ins.scalar(3, "i"), ins.string(4))


# ExecutionPlan field indices (schema declaration order)
_P_NAME, _P_VALUES, _P_INPUTS, _P_OUTPUTS, _P_IN_SPEC, _P_OUT_SPEC, _P_IN_NAMES, _P_OUT_NAMES = range(8)
_P_OPERATORS, _P_DELEGATES, _P_INSTRUCTIONS, _P_ARENA, _P_DEBUG_BYTES, _P_SYMBOLS, _P_MUTABLE = range(8, 15)


def _read_plan(p: Table) -> PlanDef:
    name = p.string(_P_NAME)
    values = []
    for i, ev in enumerate(p.tables(_P_VALUES)):
        try:
            values.append(_read_value(ev))
        except ProgramFormatError as e:
            raise ProgramFormatError(f"plan '{name}': value {i}: {e.message}", field=f"{name}.values[{i}]") from None
    operators = [OperatorDef(op.string(0), op.string(1)) for op in p.tables(_P_OPERATORS)]
    delegates = []
    for d in p.tables(_P_DELEGATES):
        specs = [(cs.string(0), bytes(cs.scalars(1, "B"))) for cs in d.tables(2)]
        delegates.append(BackendDelegateDef(d.string(0), d.scalar(1, "i"), specs))
    instructions = [_read_instruction(ins, i, name) for i, ins in enumerate(p.tables(_P_INSTRUCTIONS))]
    return PlanDef(
        name=name, values=values, inputs=p.scalars(_P_INPUTS, "i"), outputs=p.scalars(_P_OUTPUTS, "i"),
        input_spec=p.string(_P_IN_SPEC), output_spec=p.string(_P_OUT_SPEC),
        input_names=_strings_of(p, _P_IN_NAMES),
        output_names=list(_strings_of(p, _P_OUT_NAMES)),
        operators=operators, delegates=delegates, instructions=instructions,
        arena_size=p.scalar(_P_ARENA, "q"), debug_buffer_bytes=p.scalar(_P_DEBUG_BYTES, "q"),
        symbols=[SymbolDef(t.string(0), t.scalar(1, "q"), t.scalar(2, "q"), t.scalar(3, "i"), t.scalar(4, "i"))
                 for t in p.tables(_P_SYMBOLS)],
        mutable_buffers=[MutableBufferDef(t.string(0), t.scalar(1, "i"), t.scalar(2, "b"),
                                          tuple(t.scalars(3, "q"))) for t in p.tables(_P_MUTABLE)])


def _strings_of(t: Table, i: int) -> list[str]:
    start, n = t._vector(i, 4)
    out = []
    for k in range(n):
        pos = start + 4 * k
        q = pos + struct.unpack_from("<I", t.buf, pos)[0]
        if q > len(t.buf) - 4:
            raise ProgramFormatError("string reference outside the flatbuffer", field="flatbuffer")
        ln = struct.unpack_from("<I", t.buf, q)[0]
        if q + 4 + ln > len(t.buf):
            raise ProgramFormatError("string runs past the end of the flatbuffer", field="flatbuffer")
        out.append(t.buf[q + 4:q + 4 + ln].decode("utf-8", errors="strict"))
    return out


def decode_flatbuffer(fbuf: bytes | memoryview) -> ProgramDef:
    """Parses the flatbuffer part into a ``ProgramDef``; malformed data raises ``ProgramFormatError``."""
    data = bytes(fbuf)
    try:
        if len(data) < 8:
            raise ProgramFormatError("flatbuffer is too short", field="flatbuffer")
        root = Table(data, struct.unpack_from("<I", data, 0)[0])
        version = root.scalar(0, "I")
        plans = [_read_plan(p) for p in root.tables(1)]
        consts = _ranges_of(root, 2)
        dels = _ranges_of(root, 3)
    except ProgramFormatError:
        raise
    except (struct.error, ValueError, IndexError, UnicodeDecodeError) as e:
        raise ProgramFormatError(f"malformed program flatbuffer ({type(e).__name__}: {e})",
                                 field="flatbuffer") from None
    return ProgramDef(plans, consts, dels, version)


def _ranges_of(t: Table, i: int) -> list[tuple[int, int]]:
    start, n = t._vector(i, 16)
    flat = struct.unpack_from(f"<{2 * n}Q", t.buf, start) if n else ()
    return [(flat[2 * k], flat[2 * k + 1]) for k in range(n)]


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


def check_consistency(program: ProgramDef, segment_size: int) -> None:
    """Checks every index, offset and size against its bounds (``Verification.InternalConsistency``)."""

    def fail(msg: str, fld: str) -> None:
        raise ProgramFormatError(msg, field=fld)

    for i, (off, size) in enumerate(program.constants):
        if off % ALIGNMENT or off + size > segment_size:
            fail(f"constant {i}: range [{off}, {off + size}) is misaligned or outside the segment area "
                 f"({segment_size} bytes)", f"constants[{i}]")
    for i, (off, size) in enumerate(program.delegate_data):
        if off % ALIGNMENT or off + size > segment_size:
            fail(f"delegate blob {i}: range [{off}, {off + size}) is misaligned or outside the segment area "
                 f"({segment_size} bytes)", f"delegate_data[{i}]")
    names = set()
    for p in program.plans:
        if p.name in names:
            fail(f"method '{p.name}' appears twice", "execution_plans")
        names.add(p.name)
        nv = len(p.values)
        where = f"method '{p.name}'"

        def idx(i: int, what: str, fld: str, allow_none: bool = False) -> None:
            if allow_none and i == -1:
                return
            if not 0 <= i < nv:
                fail(f"{where}: {what} refers to value {i}, but the method has {nv} values", f"{p.name}.{fld}")

        kernel_written = frozenset(o for ins in p.instructions if isinstance(ins.call, KernelCallDef)
                                   and ins.call.kind != CALL_VIEW for o in ins.call.outputs) | set(p.inputs)
        for k, ins in enumerate(p.instructions):  # weights are read-only: no instruction writes a constant
            for o in ins.call.outputs:
                v = p.values[o] if 0 <= o < nv else None
                if isinstance(v, TensorDef) and v.placement == PLACEMENT_CONSTANT:
                    fail(f"{where}: instruction {k} writes value {o}, a constant", f"{p.name}.instructions[{k}]")
        for k, v in enumerate(p.values):
            if isinstance(v, TensorDef):
                if not _plain_scalar_type(v.scalar_type):
                    fail(f"{where}: tensor value {k} has unknown or unsupported scalar type {v.scalar_type}",
                         f"{p.name}.values[{k}].scalar_type")
                if len(v.sizes) != len(v.strides):
                    fail(f"{where}: tensor value {k} has {len(v.sizes)} sizes but {len(v.strides)} strides",
                         f"{p.name}.values[{k}]")
                if any(s < 0 for s in v.sizes) or v.nbytes < 0:
                    fail(f"{where}: tensor value {k} has a negative size", f"{p.name}.values[{k}]")
                _check_extent(p, k, v, program, fail, kernel_written)
                if v.placement == PLACEMENT_PLANNED:
                    if v.arena_offset < 0 or v.arena_offset + v.nbytes > p.arena_size:
                        fail(f"{where}: tensor value {k} spans arena bytes [{v.arena_offset}, "
                             f"{v.arena_offset + v.nbytes}) but the arena has {p.arena_size}",
                             f"{p.name}.values[{k}].arena_offset")
                elif v.placement == PLACEMENT_CONSTANT:
                    if not 0 <= v.constant_index < len(program.constants):
                        fail(f"{where}: tensor value {k} refers to constant {v.constant_index}, but the program "
                             f"has {len(program.constants)}", f"{p.name}.values[{k}].constant_index")
                    if v.nbytes > program.constants[v.constant_index][1]:
                        fail(f"{where}: tensor value {k} needs {v.nbytes} bytes but constant "
                             f"{v.constant_index} has {program.constants[v.constant_index][1]}",
                             f"{p.name}.values[{k}].nbytes")
                elif v.placement == PLACEMENT_MUTABLE:
                    _check_mutable(p, k, v, fail)
                elif v.placement not in (PLACEMENT_ALIAS, PLACEMENT_DYNAMIC):
                    fail(f"{where}: tensor value {k} has unknown placement {v.placement}", f"{p.name}.values[{k}]")
                if v.sym_shape:
                    symexpr.parse_sym_shape(v.sym_shape, len(v.sizes), len(p.symbols), f"{p.name}.values[{k}]")
            elif isinstance(v, (TensorListV, OptionalTensorListV)):
                for j in v.items:
                    idx(j, f"list value {k}", f"values[{k}]", allow_none=isinstance(v, OptionalTensorListV))
            elif isinstance(v, (DtypeV, LayoutV, MemoryFormatV, DeviceV)):
                _check_enum_value(p, k, v, fail)
            elif isinstance(v, SymIntV):
                symexpr.parse_expr(v.expr, len(p.symbols), f"{p.name}.values[{k}]")
            elif isinstance(v, SymIntListV):
                symexpr.parse_expr_list(v.exprs, len(p.symbols), f"{p.name}.values[{k}]")
        _check_symbols(p, fail)
        _check_arena(p, fail)
        check_spec(p.input_spec, f"{p.name}.input_spec")
        check_spec(p.output_spec, f"{p.name}.output_spec")
        for j, mb in enumerate(p.mutable_buffers):
            if not _plain_scalar_type(mb.scalar_type) or any(not 0 <= n <= MAX_TENSOR_BYTES for n in mb.sizes):
                fail(f"{where}: mutable buffer '{mb.name}' has an unknown scalar type {mb.scalar_type} or a bad size",
                     f"{p.name}.mutable_buffers[{j}]")
            if not 0 <= mb.constant_index < len(program.constants):
                fail(f"{where}: mutable buffer '{mb.name}' refers to constant {mb.constant_index}, but the program "
                     f"has {len(program.constants)}", f"{p.name}.mutable_buffers[{j}].constant_index")
        for j, i in enumerate(p.inputs):
            idx(i, f"input {j}", f"inputs[{j}]")
        for j, i in enumerate(p.outputs):
            idx(i, f"output {j}", f"outputs[{j}]")
        if len(p.input_names) != len(p.inputs) or len(p.output_names) != len(p.outputs):
            fail(f"{where}: input/output name tables do not match the input/output lists", f"{p.name}.input_names")
        for k, ins in enumerate(p.instructions):
            c = ins.call
            if isinstance(c, KernelCallDef):
                if not 0 <= c.op_index < len(p.operators):
                    fail(f"{where}: instruction {k} calls operator {c.op_index}, but the method has "
                         f"{len(p.operators)}", f"{p.name}.instructions[{k}].op_index")
                if c.kind not in CALL_KIND_NAMES:
                    fail(f"{where}: instruction {k} has unknown call kind {c.kind}", f"{p.name}.instructions[{k}]")
            else:
                if not 0 <= c.delegate_index < len(p.delegates):
                    fail(f"{where}: instruction {k} calls delegate {c.delegate_index}, but the method has "
                         f"{len(p.delegates)}", f"{p.name}.instructions[{k}].delegate_index")
            for j in c.args:
                idx(j, f"instruction {k} ({ins.node_name}) argument", f"instructions[{k}].args", allow_none=True)
            for j in c.outputs:
                idx(j, f"instruction {k} ({ins.node_name}) output", f"instructions[{k}].outputs")
        for k, d in enumerate(p.delegates):
            if not 0 <= d.data_index < len(program.delegate_data):
                fail(f"{where}: delegate {k} refers to blob {d.data_index}, but the program has "
                     f"{len(program.delegate_data)}", f"{p.name}.delegates[{k}].data_index")
