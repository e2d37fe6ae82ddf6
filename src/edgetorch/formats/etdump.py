"""The edgetorch ETDump file (.etdp): in-memory mirror, the one writer and the one reader.

An .etdp file is one size-prefixed flatbuffer (schema/etdump.fbs, identifier "EDD1" at bytes [8, 12)):
a 4-byte little-endian length, then the ``ETDump`` root. Tensor payloads live in a separate *debug buffer*
file; a ``Tensor`` records where (``offset``, 64-byte aligned, -1 when no bytes were stored) and how much
(``nbytes``). ``deserialize_etdump`` turns every malformed, truncated or foreign input into an
``ETDumpFormatError`` that names the field at fault.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
import torch

from edgetorch.errors import ETDumpFormatError
from edgetorch.formats._fbread import Table
from edgetorch.formats._generated import etdump_generated as fb
from edgetorch.formats.alignment import ALIGNMENT
from edgetorch.formats.dtypes import CODE_TO_DTYPE, code_dtype

__all__ = ["FB_IDENTIFIER", "ETDUMP_SCHEMA_VERSION", "DEBUG_BUFFER_ALIGNMENT", "NO_OFFSET", "METHOD_EXECUTE",
           "PROGRAM_LOAD_METHOD", "METHOD_INIT", "DELEGATE_CALL", "LOAD_BLOCK", "EXECUTE_BLOCK", "OBSERVER_EFFECT_ID",
           "OBSERVER_EFFECT_TOLERANCE", "INPUT_EVENT_PREFIX", "INPUT_INSTRUCTION_ID", "is_input_event",
           "OPERATOR_CALL", "ValueType", "Tensor", "Value", "ProfileEvent", "DebugEvent", "Event", "RunData", "ETDump",
           "TRAILER_MAGIC", "TRAILER_VERSION", "TRAILER_SIZE", "DebugBufferTrailer", "new_run_id", "encode_trailer",
           "read_trailer", "sealed_chunks", "seal_in_place", "serialize_etdump", "check_header", "deserialize_etdump"]

FB_IDENTIFIER = b"EDD1"
ETDUMP_SCHEMA_VERSION = 1
DEBUG_BUFFER_ALIGNMENT = ALIGNMENT  # every tensor in a debug buffer starts at a multiple of this
NO_OFFSET = -1

# Well-known profile event names.
METHOD_EXECUTE = "Method::execute"
PROGRAM_LOAD_METHOD = "Program::load_method"
METHOD_INIT = "Method::init"
DELEGATE_CALL = "DELEGATE_CALL"
LOAD_BLOCK = "load"
EXECUTE_BLOCK = "Execute"

# Reserved delegate debug identifier: a backend that exposes its intermediates logs, per checked run, a float
# debug event under this id: the largest relative difference between the delegate call's final outputs computed
# with and without its intermediates exposed (max |a - b| / max |b| over the outputs). Readers report values above
# OBSERVER_EFFECT_TOLERANCE: the logged intermediates are then not exactly what a plain run computes.
OBSERVER_EFFECT_ID = "observer_effect"
OBSERVER_EFFECT_TOLERANCE = 1e-6

# Method inputs: with a debug buffer, each execute block starts with one debug event per flat input of the call,
# named INPUT_EVENT_PREFIX + the input's name, with chain_index and instruction_id INPUT_INSTRUCTION_ID (-1),
# output_index = the input's position and ``output`` false.
INPUT_EVENT_PREFIX = "input:"
INPUT_INSTRUCTION_ID = -1


def is_input_event(d: DebugEvent) -> bool:
    """True for the debug event logging one of a method's inputs (see ``INPUT_EVENT_PREFIX``)."""
    return (d.instruction_id == INPUT_INSTRUCTION_ID and not d.debug_entry.output
            and d.name.startswith(INPUT_EVENT_PREFIX))

_KNOWN_IDENTIFIERS = {b"ED00": "an ExecuTorch ETDump: read it with formats.etdump_executorch.read_any_etdump "
                               "(as the Inspector and devtools.etdump.read_etdump do)",
                      b"EDTP": "an edgetorch program (.pte)"}
OPERATOR_CALL = "OPERATOR_CALL"  # the reference's scope around a kernel: its time, never its values


class ValueType(enum.IntEnum):
    """Which member of a ``Value`` is set (numbered as in the schema)."""

    Null = 0
    Int = 1
    Bool = 2
    Float = 3
    Double = 4
    Tensor = 5
    TensorList = 6
    String = 7


@dataclass
class Tensor:
    """A tensor stored contiguously in the debug buffer at ``offset`` (-1: no bytes stored)."""

    scalar_type: int
    sizes: list[int]
    strides: list[int]
    offset: int = NO_OFFSET
    nbytes: int = 0

    @property
    def dtype(self) -> torch.dtype:
        return code_dtype(self.scalar_type)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


@dataclass
class Value:
    val: ValueType = ValueType.Null
    tensor: Tensor | None = None
    tensor_list: list[Tensor] | None = None
    int_value: int = 0
    float_value: float = 0.0
    double_value: float = 0.0
    bool_value: bool = False
    string_value: str = ""
    output: bool = False  # a program output (logged after the last instruction)


@dataclass
class ProfileEvent:
    name: str
    chain_index: int = -1
    instruction_id: int = -1
    delegate_debug_id_int: int = -1
    delegate_debug_id_str: str = ""
    delegate_debug_metadata: bytes = b""
    start_time: int = 0  # ns
    end_time: int = 0  # ns


@dataclass
class DebugEvent:
    chain_index: int = -1
    instruction_id: int = -1
    delegate_debug_id_int: int = -1
    delegate_debug_id_str: str = ""
    debug_entry: Value = field(default_factory=Value)
    output_index: int = 0
    name: str = ""


@dataclass
class Event:
    """Exactly one of ``profile_event`` and ``debug_event`` is set."""

    profile_event: ProfileEvent | None = None
    debug_event: DebugEvent | None = None


@dataclass
class RunData:
    name: str
    method: str = ""
    bundled_input_index: int = -1
    events: list[Event] = field(default_factory=list)


@dataclass
class ETDump:
    version: int = ETDUMP_SCHEMA_VERSION
    program_hash: str = ""
    run_data: list[RunData] = field(default_factory=list)
    debug_buffer_bytes: int = 0  # size of the debug buffer data the tensors point into
    run_id: str = ""  # hex id of the recording, also in the debug buffer's trailer ("": written before run ids)
    debug_buffer_crc32: int = -1  # CRC-32 of the debug buffer data [0, debug_buffer_bytes) (-1: unknown)
    producer: str = "edgetorch"  # "executorch": read from the reference's ETDump (formats.etdump_executorch)
    dropped_allocation_events: int = 0  # allocation events of a reference ETDump (not part of this model)


# ----------------------------------------------------------------------------------------------
# Debug buffer trailer: the identity of the recording that wrote a debug buffer
# ----------------------------------------------------------------------------------------------

TRAILER_MAGIC = b"EDGTDBGT"
TRAILER_VERSION = 1
TRAILER_SIZE = 128
_TRAILER = struct.Struct("<8sIIQ32s16sI")  # magic, version, size, data bytes, program hash, run id, CRC-32


@dataclass(frozen=True)
class DebugBufferTrailer:
    """The last ``TRAILER_SIZE`` bytes of a debug buffer file: which program and recording wrote the data
    before it, how many bytes that data has and their CRC-32."""

    data_bytes: int
    program_hash: str
    run_id: str
    crc32: int


def new_run_id() -> str:
    """A random 128-bit recording id (hex)."""
    import os

    return os.urandom(16).hex()


def encode_trailer(t: DebugBufferTrailer) -> bytes:
    try:
        phash, rid = bytes.fromhex(t.program_hash), bytes.fromhex(t.run_id)
    except ValueError:
        raise ETDumpFormatError("program hash and run id must be hex strings", field="trailer") from None
    head = _TRAILER.pack(TRAILER_MAGIC, TRAILER_VERSION, TRAILER_SIZE, t.data_bytes, phash, rid, t.crc32)
    return head + bytes(TRAILER_SIZE - len(head))


def read_trailer(buf: bytes | memoryview, size: int, path: str | None = None) -> DebugBufferTrailer | None:
    """The trailer at the end of a debug buffer of ``size`` bytes, or None when it has none (a buffer written
    before trailers existed, or not a debug buffer at all)."""
    if size < TRAILER_SIZE:
        return None
    tail = bytes(memoryview(buf)[size - TRAILER_SIZE:size])
    magic, version, tsize, nbytes, phash, rid, crc = _TRAILER.unpack_from(tail, 0)
    if magic != TRAILER_MAGIC:
        return None
    if version != TRAILER_VERSION or tsize != TRAILER_SIZE or nbytes != size - TRAILER_SIZE \
            or any(tail[_TRAILER.size:]):
        raise ETDumpFormatError(f"{path or 'debug buffer'}: corrupted trailer (version {version}, size {tsize}, "
                                f"data bytes {nbytes} of a {size}-byte file)", field="trailer", path=path)
    return DebugBufferTrailer(nbytes, phash.hex(), rid.hex(), crc)


def sealed_chunks(chunks, program_hash: str, run_id: str, result: list[int]):
    """Yields ``chunks`` (the data of a debug buffer) then the trailer sealing them; appends the CRC-32 of the
    data to ``result`` once all chunks went by."""
    import zlib

    crc, n = 0, 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
        n += memoryview(c).nbytes
        yield c
    result.append(crc)
    yield encode_trailer(DebugBufferTrailer(n, program_hash, run_id, crc))


def seal_in_place(path: str, data_bytes: int, program_hash: str, run_id: str) -> int:
    """Writes the trailer after the first ``data_bytes`` bytes of the debug buffer file ``path`` (a file the
    runtime streams into) and cuts the file there; returns the CRC-32 of the data."""
    import os
    import zlib

    crc = 0
    with open(path, "r+b") as f:
        fd = f.fileno()
        for off in range(0, data_bytes, 1 << 22):
            crc = zlib.crc32(os.pread(fd, min(1 << 22, data_bytes - off), off), crc)
        f.seek(data_bytes)
        f.write(encode_trailer(DebugBufferTrailer(data_bytes, program_hash, run_id, crc)))
        f.truncate()
    return crc


# ----------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------

class _Writer:
    def __init__(self) -> None:
        self.b = flatbuffers.Builder(1 << 16)
        self._long_vecs: dict[tuple[int, ...], int] = {}

    def string(self, s: str) -> int:
        return self.b.CreateSharedString(s)

    def longs(self, items: list[int]) -> int:
        key = tuple(items)
        off = self._long_vecs.get(key)
        if off is None:  # identical vectors (sizes/strides repeat across runs) are stored once
            off = self.b.CreateNumpyVector(np.asarray(key, dtype=np.int64))
            self._long_vecs[key] = off
        return off

    def offsets(self, start, offs: list[int]) -> int:
        b = self.b
        start(b, len(offs))
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    def tensor(self, t: Tensor) -> int:
        b = self.b
        sizes, strides = self.longs(t.sizes), self.longs(t.strides)
        fb.TensorStart(b)
        fb.TensorAddScalarType(b, t.scalar_type)
        fb.TensorAddSizes(b, sizes)
        fb.TensorAddStrides(b, strides)
        fb.TensorAddOffset(b, t.offset)
        fb.TensorAddNbytes(b, t.nbytes)
        return fb.TensorEnd(b)

    def value(self, v: Value) -> int:
        b = self.b
        tensor = tensor_list = string = None
        if v.val == ValueType.Tensor:
            if v.tensor is None:
                raise ValueError("Value of type Tensor has no tensor")
            tensor = self.tensor(v.tensor)
        elif v.val == ValueType.TensorList:
            offs = [self.tensor(t) for t in v.tensor_list or []]
            vec = self.offsets(fb.TensorListStartTensorsVector, offs)
            fb.TensorListStart(b)
            fb.TensorListAddTensors(b, vec)
            tensor_list = fb.TensorListEnd(b)
        elif v.val == ValueType.String:
            string = self.string(v.string_value)
        fb.ValueStart(b)
        fb.ValueAddVal(b, int(v.val))
        if tensor is not None:
            fb.ValueAddTensor(b, tensor)
        if tensor_list is not None:
            fb.ValueAddTensorList(b, tensor_list)
        if string is not None:
            fb.ValueAddStringValue(b, string)
        if v.val == ValueType.Int:
            fb.ValueAddIntValue(b, v.int_value)
        elif v.val == ValueType.Float:
            fb.ValueAddFloatValue(b, v.float_value)
        elif v.val == ValueType.Double:
            fb.ValueAddDoubleValue(b, v.double_value)
        elif v.val == ValueType.Bool:
            fb.ValueAddBoolValue(b, v.bool_value)
        if v.output:
            fb.ValueAddOutput(b, True)
        return fb.ValueEnd(b)

    def profile_event(self, e: ProfileEvent) -> int:
        b = self.b
        name = self.string(e.name)
        dstr = self.string(e.delegate_debug_id_str) if e.delegate_debug_id_str else None
        meta = b.CreateByteVector(bytes(e.delegate_debug_metadata)) if e.delegate_debug_metadata else None
        fb.ProfileEventStart(b)
        fb.ProfileEventAddName(b, name)
        fb.ProfileEventAddChainIndex(b, e.chain_index)
        fb.ProfileEventAddInstructionId(b, e.instruction_id)
        fb.ProfileEventAddDelegateDebugIdInt(b, e.delegate_debug_id_int)
        if dstr is not None:
            fb.ProfileEventAddDelegateDebugIdStr(b, dstr)
        if meta is not None:
            fb.ProfileEventAddDelegateDebugMetadata(b, meta)
        fb.ProfileEventAddStartTime(b, e.start_time)
        fb.ProfileEventAddEndTime(b, e.end_time)
        return fb.ProfileEventEnd(b)

    def debug_event(self, e: DebugEvent) -> int:
        b = self.b
        entry = self.value(e.debug_entry)
        name = self.string(e.name) if e.name else None
        dstr = self.string(e.delegate_debug_id_str) if e.delegate_debug_id_str else None
        fb.DebugEventStart(b)
        if name is not None:
            fb.DebugEventAddName(b, name)
        fb.DebugEventAddChainIndex(b, e.chain_index)
        fb.DebugEventAddInstructionId(b, e.instruction_id)
        fb.DebugEventAddDelegateDebugIdInt(b, e.delegate_debug_id_int)
        if dstr is not None:
            fb.DebugEventAddDelegateDebugIdStr(b, dstr)
        fb.DebugEventAddOutputIndex(b, e.output_index)
        fb.DebugEventAddDebugEntry(b, entry)
        return fb.DebugEventEnd(b)

    def event(self, e: Event) -> int:
        if (e.profile_event is None) == (e.debug_event is None):
            raise ValueError("an Event needs exactly one of profile_event and debug_event")
        b = self.b
        if e.profile_event is not None:
            p = self.profile_event(e.profile_event)
            fb.EventStart(b)
            fb.EventAddProfileEvent(b, p)
        else:
            d = self.debug_event(e.debug_event)
            fb.EventStart(b)
            fb.EventAddDebugEvent(b, d)
        return fb.EventEnd(b)

    def run(self, r: RunData) -> int:
        b = self.b
        events = self.offsets(fb.RunDataStartEventsVector, [self.event(e) for e in r.events])
        name, method = self.string(r.name), self.string(r.method)
        fb.RunDataStart(b)
        fb.RunDataAddName(b, name)
        fb.RunDataAddMethod(b, method)
        fb.RunDataAddBundledInputIndex(b, r.bundled_input_index)
        fb.RunDataAddEvents(b, events)
        return fb.RunDataEnd(b)


def serialize_etdump(etdump: ETDump) -> bytes:
    """Encodes ``etdump`` as the bytes of an .etdp file (size-prefixed flatbuffer, identifier "EDD1")."""
    w = _Writer()
    b = w.b
    runs = w.offsets(fb.ETDumpStartRunDataVector, [w.run(r) for r in etdump.run_data])
    phash = w.string(etdump.program_hash)
    run_id = w.string(etdump.run_id) if etdump.run_id else None
    fb.ETDumpStart(b)
    fb.ETDumpAddVersion(b, etdump.version)
    fb.ETDumpAddProgramHash(b, phash)
    fb.ETDumpAddDebugBufferBytes(b, etdump.debug_buffer_bytes)
    fb.ETDumpAddRunData(b, runs)
    if run_id is not None:
        fb.ETDumpAddRunId(b, run_id)
    fb.ETDumpAddDebugBufferCrc32(b, etdump.debug_buffer_crc32)
    b.FinishSizePrefixed(fb.ETDumpEnd(b), file_identifier=FB_IDENTIFIER)
    return bytes(b.Output())


# ----------------------------------------------------------------------------------------------
# Reader
# ----------------------------------------------------------------------------------------------

# field indices of the tables (schema declaration order), read with formats._fbread.Table
_T_SCALAR, _T_SIZES, _T_STRIDES, _T_OFFSET, _T_NBYTES = range(5)
_V_VAL, _V_TENSOR, _V_LIST, _V_INT, _V_FLOAT, _V_DOUBLE, _V_BOOL, _V_STRING, _V_OUTPUT = range(9)


class _Reader:
    """Decodes the tables with bounds-checked direct reads (``_fbread.Table``): a debug run of an LLM logs
    tens of thousands of events, which the generated accessors read several times slower."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.at = "root"  # the field being decoded, for error messages

    def fail(self, msg: str, fld: str) -> ETDumpFormatError:
        return ETDumpFormatError(f"ETDump: {fld}: {msg}", field=fld, path=self.path)

    def tensor(self, x: Table, at: str) -> Tensor:
        self.at = at
        code = x.scalar(_T_SCALAR, "b")
        if code not in CODE_TO_DTYPE:
            raise self.fail(f"unknown scalar type code {code}", f"{at}.scalar_type")
        sizes = x.scalars(_T_SIZES, "q")
        strides = x.scalars(_T_STRIDES, "q")
        if len(sizes) != len(strides):
            raise self.fail(f"{len(sizes)} sizes but {len(strides)} strides", f"{at}.strides")
        if any(s < 0 for s in sizes):
            raise self.fail(f"negative size in {sizes}", f"{at}.sizes")
        t = Tensor(code, sizes, strides, x.scalar(_T_OFFSET, "q", NO_OFFSET), x.scalar(_T_NBYTES, "q"))
        want = t.numel * CODE_TO_DTYPE[code].itemsize
        if t.nbytes != want:
            raise self.fail(f"nbytes is {t.nbytes}, but {CODE_TO_DTYPE[code]} {sizes} has {want} bytes",
                            f"{at}.nbytes")
        if t.offset != NO_OFFSET and (t.offset < 0 or t.offset % DEBUG_BUFFER_ALIGNMENT):
            raise self.fail(f"debug-buffer offset {t.offset} is neither -1 nor a non-negative multiple of "
                            f"{DEBUG_BUFFER_ALIGNMENT}", f"{at}.offset")
        return t

    def value(self, x: Table | None, at: str) -> Value:
        self.at = at
        if x is None:
            raise self.fail("missing", at)
        tag = x.scalar(_V_VAL, "B")
        try:
            vt = ValueType(tag)
        except ValueError:
            raise self.fail(f"unknown value type tag {tag}", f"{at}.val") from None
        v = Value(vt, output=bool(x.scalar(_V_OUTPUT, "?")))
        if vt == ValueType.Tensor:
            t = x.table(_V_TENSOR)
            if t is None:
                raise self.fail("value of type Tensor has no tensor", f"{at}.tensor")
            v.tensor = self.tensor(t, f"{at}.tensor")
        elif vt == ValueType.TensorList:
            tl = x.table(_V_LIST)
            if tl is None:
                raise self.fail("value of type TensorList has no tensor_list", f"{at}.tensor_list")
            v.tensor_list = [self.tensor(t, f"{at}.tensor_list[{i}]") for i, t in enumerate(tl.tables(0))]
        elif vt == ValueType.Int:
            v.int_value = int(x.scalar(_V_INT, "q"))
        elif vt == ValueType.Float:
            v.float_value = float(x.scalar(_V_FLOAT, "f"))
        elif vt == ValueType.Double:
            v.double_value = float(x.scalar(_V_DOUBLE, "d"))
        elif vt == ValueType.Bool:
            v.bool_value = bool(x.scalar(_V_BOOL, "?"))
        elif vt == ValueType.String:
            v.string_value = x.string(_V_STRING)
        return v

    def event(self, e: Table, at: str) -> Event:
        self.at = at
        p, d = e.table(0), e.table(1)
        if (p is None) == (d is None):
            raise self.fail("an event must hold exactly one of profile_event and debug_event", at)
        if p is not None:
            self.at = f"{at}.profile_event"
            return Event(profile_event=ProfileEvent(
                p.string(0), p.scalar(1, "i", -1), p.scalar(2, "i", -1), p.scalar(3, "i", -1), p.string(4),
                p.raw(5), int(p.scalar(6, "Q")), int(p.scalar(7, "Q"))))
        self.at = f"{at}.debug_event"
        entry = self.value(d.table(6), f"{at}.debug_event.debug_entry")
        self.at = f"{at}.debug_event"
        return Event(debug_event=DebugEvent(d.scalar(1, "i", -1), d.scalar(2, "i", -1), d.scalar(3, "i", -1),
                                            d.string(4), entry, d.scalar(5, "i"), d.string(0)))

    def run(self, r: Table, at: str) -> RunData:
        self.at = at
        run = RunData(r.string(0), r.string(1), r.scalar(2, "i", -1))
        run.events = [self.event(e, f"{at}.events[{j}]") for j, e in enumerate(r.tables(3))]
        return run


def check_header(data: bytes | bytearray | memoryview, path: str | None = None) -> int:
    """Validates size prefix, identifier and version; returns the schema version."""
    n = len(data)
    if n < 12:
        raise ETDumpFormatError(f"ETDump is truncated: {n} bytes, the size prefix, root offset and identifier "
                                "alone take 12", field="size_prefix", path=path)
    ident = bytes(data[8:12])
    (declared,) = struct.unpack_from("<I", data, 0)
    if ident != FB_IDENTIFIER:
        what = _KNOWN_IDENTIFIERS.get(ident, "not an edgetorch ETDump")
        raise ETDumpFormatError(f"file identifier is {ident!r}, expected {FB_IDENTIFIER!r}: {what}",
                                field="file_identifier", path=path)
    if declared + 4 > n:
        raise ETDumpFormatError(f"ETDump is truncated: it declares {declared + 4} bytes, the data has {n}",
                                field="size_prefix", path=path)
    if declared + 4 < n:
        raise ETDumpFormatError(f"ETDump has {n - declared - 4} unexpected trailing bytes after its "
                                f"{declared + 4} declared bytes", field="size_prefix", path=path)
    try:
        version = fb.ETDump.GetRootAs(data, 4).Version()
    except Exception as e:
        raise ETDumpFormatError(f"malformed ETDump root ({type(e).__name__}: {e})", field="version",
                                path=path) from None
    if version != ETDUMP_SCHEMA_VERSION:
        raise ETDumpFormatError(f"unsupported ETDump schema version {version} (this reader reads "
                                f"{ETDUMP_SCHEMA_VERSION})", field="version", path=path)
    return version


def deserialize_etdump(data: bytes | bytearray | memoryview, path: str | None = None) -> ETDump:
    """Decodes the bytes of an .etdp file; any malformed, truncated or foreign input raises
    ``ETDumpFormatError`` naming the field (``path`` only labels the messages)."""
    if isinstance(data, memoryview):
        data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        data = bytes(data)
    elif not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"deserialize_etdump expects bytes, bytearray or memoryview, got {type(data).__name__}")
    version = check_header(data, path)
    r = _Reader(path)
    try:
        root = Table(bytes(data), 4 + struct.unpack_from("<I", data, 4)[0])
        r.at = "program_hash"
        phash = root.string(1)
        r.at = "debug_buffer_bytes"
        dbb = root.scalar(2, "q")
        if dbb < 0:
            raise r.fail(f"negative size {dbb}", "debug_buffer_bytes")
        r.at = "run_data"
        runs = [r.run(t, f"run_data[{i}]") for i, t in enumerate(root.tables(3))]
        r.at = "run_id"
        run_id = root.string(4)
        crc = root.scalar(5, "q", -1)
        if run_id and (len(run_id) != 32 or any(c not in "0123456789abcdef" for c in run_id)):
            raise r.fail(f"run id {run_id[:40]!r} is not 32 hex digits", "run_id")
        if not -1 <= crc < 1 << 32:
            raise r.fail(f"debug buffer CRC-32 {crc} out of range", "debug_buffer_crc32")
    except ETDumpFormatError:
        raise
    except Exception as e:  # the generated accessors do no bounds checks
        raise ETDumpFormatError(f"ETDump: {r.at}: malformed data ({type(e).__name__}: {e})", field=r.at,
                                path=path) from None
    return ETDump(version, phash, runs, dbb, run_id, crc)
