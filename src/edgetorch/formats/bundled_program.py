"""The edgetorch bundled program file (.bpte): in-memory mirror, the one writer and the one reader.

A bundled program is a program (.pte) packaged with test cases (inputs and expected outputs per method).
Layout of a file (all integers little-endian)::

    [0, 128)            file header (``HEADER`` below)
    [128, 128 + F)      flatbuffer ``BundledProgram`` (schema/bundled_program.fbs, identifier "EDBP")
    [P, P + N)          the embedded .pte, verbatim; P is 64-byte aligned
    [D, D + T)          test-data segment: raw bytes of every test-case tensor, each 64-byte aligned;
                        D is 64-byte aligned

Because the .pte keeps its own alignment rules relative to its first byte and P is a multiple of 64, a
runtime that maps the .bpte can run the embedded program in place (``embedded_program`` returns a
zero-copy view). The header carries a SHA-256 of the flatbuffer and the test data (the embedded .pte has
its own content hash in its own header). Every malformed input raises ``BundledProgramFormatError``
naming the field at fault.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers

from edgetorch.errors import FormatError
from edgetorch.formats._generated import bundled_program_generated as fb
from edgetorch.formats.alignment import ALIGNMENT, align

__all__ = ["MAGIC", "FB_IDENTIFIER", "HEADER_VERSION", "BUNDLE_SCHEMA_VERSION", "HEADER", "HEADER_SIZE", "PTE_MAGIC",
           "ITEMSIZE", "BundledProgramFormatError", "TensorData", "Value", "TestCaseDef", "TestSuiteDef", "BundleDef",
           "BundleHeader", "encode_flatbuffer", "build_file_parts", "serialize_bundle", "write_bundle",
           "is_bundled_program", "read_header", "embedded_program", "read_bundle", "tensor_to_torch",
           "tensor_from_torch"]

MAGIC = b"EDGTBNDL"
FB_IDENTIFIER = b"EDBP"
HEADER_VERSION = 1
BUNDLE_SCHEMA_VERSION = 1
# magic, header version, schema version, fb offset, fb size, program offset, program size, data offset,
# data size, SHA-256 of [fb offset, program offset) + [data offset, data offset + data size)
HEADER = struct.Struct("<8sIIQQQQQQ32s")
HEADER_SIZE = 128
PTE_MAGIC = b"EDGTPROG"  # first bytes of a .pte (edgetorch.formats.program.MAGIC)
# bytes per element of each scalar-type code (formats/dtypes.py), so that reading needs no torch import
ITEMSIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 12: 1, 13: 1, 14: 4, 15: 2,
            27: 2, 28: 4, 29: 8}


class BundledProgramFormatError(FormatError):
    """A bundled program (.bpte) is malformed, truncated or of an unsupported version; ``field`` names the
    part at fault."""


# ----------------------------------------------------------------------------------------------
# In-memory mirror of the schema
# ----------------------------------------------------------------------------------------------

@dataclass
class TensorData:
    """A tensor as stored: contiguous row-major bytes (``numel * itemsize``), its scalar type and sizes."""

    scalar_type: int
    sizes: list[int]
    data: bytes | memoryview
    dim_order: list[int] | None = None  # None: 0..ndim-1

    def __post_init__(self) -> None:
        if self.dim_order is None:
            self.dim_order = list(range(len(self.sizes)))


# A value is a TensorData, or a Python int, float or bool.
Value = Any


@dataclass
class TestCaseDef:
    __test__ = False  # not a pytest test class

    inputs: list[Value]
    expected_outputs: list[Value] | None = None  # None: no expected outputs (profiling only)


@dataclass
class TestSuiteDef:
    __test__ = False  # not a pytest test class

    method_name: str
    test_cases: list[TestCaseDef] = field(default_factory=list)


@dataclass
class BundleDef:
    """A whole bundled program: the .pte bytes and the test suites."""

    program: bytes | memoryview
    suites: list[TestSuiteDef]
    version: int = BUNDLE_SCHEMA_VERSION
    program_content_hash: str = ""  # filled in by the writer from the embedded .pte's header

    def suite(self, method_name: str) -> TestSuiteDef:
        for s in self.suites:
            if s.method_name == method_name:
                return s
        raise KeyError(method_name)


@dataclass(frozen=True)
class BundleHeader:
    header_version: int
    schema_version: int
    flatbuffer_offset: int
    flatbuffer_size: int
    program_offset: int
    program_size: int
    data_offset: int
    data_size: int
    digest: bytes


# ----------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------

def _pte_content_hash(program: bytes | memoryview) -> str:
    mv = memoryview(program)
    if mv.nbytes < 80 or bytes(mv[:8]) != PTE_MAGIC:
        raise BundledProgramFormatError("the program to bundle is not an edgetorch .pte (magic "
                                        f"{bytes(mv[:8])!r}, expected {PTE_MAGIC!r})", field="program")
    return bytes(mv[48:80]).hex()  # the .pte header's SHA-256 (formats/program.py, offset 48)


class _DataSegment:
    def __init__(self) -> None:
        self.blobs: list[tuple[int, memoryview]] = []
        self.size = 0

    def add(self, data: bytes | memoryview) -> tuple[int, int]:
        mv = memoryview(data).cast("B")
        off = align(self.size)
        if mv.nbytes:
            self.blobs.append((off, mv))
            self.size = off + mv.nbytes
        return off, mv.nbytes

    def chunks(self) -> Iterable[bytes | memoryview]:
        pos = 0
        for off, mv in self.blobs:
            if off > pos:
                yield b"\0" * (off - pos)
            yield mv
            pos = off + mv.nbytes


def _write_value(b: flatbuffers.Builder, v: Value, seg: _DataSegment, where: str) -> int:
    U = fb.ValueUnion
    if isinstance(v, TensorData):
        sizes = list(v.sizes)
        b.StartVector(8, len(sizes), 8)
        for s in reversed(sizes):
            b.PrependInt64(int(s))
        sizes_off = b.EndVector()
        dim_order = list(v.dim_order or [])
        b.StartVector(1, len(dim_order), 1)
        for d in reversed(dim_order):
            b.PrependUint8(int(d))
        dim_off = b.EndVector()
        off, size = seg.add(v.data)
        fb.TensorStart(b)
        fb.TensorAddScalarType(b, v.scalar_type)
        fb.TensorAddSizes(b, sizes_off)
        fb.TensorAddDimOrder(b, dim_off)
        fb.TensorAddData(b, fb.CreateDataRange(b, off, size))
        member, t = fb.TensorEnd(b), U.Tensor
    elif isinstance(v, bool):
        fb.BoolStart(b)
        fb.BoolAddValue(b, v)
        member, t = fb.BoolEnd(b), U.Bool
    elif isinstance(v, int):
        fb.IntStart(b)
        fb.IntAddValue(b, v)
        member, t = fb.IntEnd(b), U.Int
    elif isinstance(v, float):
        fb.DoubleStart(b)
        fb.DoubleAddValue(b, v)
        member, t = fb.DoubleEnd(b), U.Double
    else:
        raise BundledProgramFormatError(f"{where}: cannot store a value of type {type(v).__name__} (tensors, "
                                        "ints, floats and bools only)", field=where)
    fb.ValueStart(b)
    fb.ValueAddValType(b, t)
    fb.ValueAddVal(b, member)
    return fb.ValueEnd(b)


def _offset_vec(b: flatbuffers.Builder, offsets: Sequence[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for o in reversed(offsets):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def encode_flatbuffer(bundle: BundleDef, seg: _DataSegment) -> bytes:
    """Builds the flatbuffer part, placing every tensor's bytes in ``seg``."""
    b = flatbuffers.Builder(1 << 12)
    names = [s.method_name for s in bundle.suites]
    if len(set(names)) != len(names):
        raise BundledProgramFormatError(f"method test suites must have unique method names, got {names}",
                                        field="method_test_suites")
    suite_offs = []
    for s in bundle.suites:
        case_offs = []
        for i, tc in enumerate(s.test_cases):
            where = f"{s.method_name}.test_cases[{i}]"
            ins = [_write_value(b, v, seg, f"{where}.inputs[{j}]") for j, v in enumerate(tc.inputs)]
            outs = [_write_value(b, v, seg, f"{where}.expected_outputs[{j}]")
                    for j, v in enumerate(tc.expected_outputs or [])]
            ins_vec, outs_vec = _offset_vec(b, ins), _offset_vec(b, outs)
            fb.MethodTestCaseStart(b)
            fb.MethodTestCaseAddInputs(b, ins_vec)
            fb.MethodTestCaseAddExpectedOutputs(b, outs_vec)
            fb.MethodTestCaseAddHasExpectedOutputs(b, tc.expected_outputs is not None)
            case_offs.append(fb.MethodTestCaseEnd(b))
        cases = _offset_vec(b, case_offs)
        name = b.CreateString(s.method_name)
        fb.MethodTestSuiteStart(b)
        fb.MethodTestSuiteAddMethodName(b, name)
        fb.MethodTestSuiteAddTestCases(b, cases)
        suite_offs.append(fb.MethodTestSuiteEnd(b))
    suites = _offset_vec(b, suite_offs)
    phash = b.CreateString(bundle.program_content_hash)
    fb.BundledProgramStart(b)
    fb.BundledProgramAddVersion(b, bundle.version)
    fb.BundledProgramAddMethodTestSuites(b, suites)
    fb.BundledProgramAddProgramContentHash(b, phash)
    b.Finish(fb.BundledProgramEnd(b), file_identifier=FB_IDENTIFIER)
    return bytes(b.Output())


def build_file_parts(bundle: BundleDef) -> list[bytes | memoryview]:
    """The chunks of a complete .bpte file (header first). The program and tensor bytes are not copied."""
    bundle.program_content_hash = _pte_content_hash(bundle.program)
    seg = _DataSegment()
    fbuf = encode_flatbuffer(bundle, seg)
    prog = memoryview(bundle.program).cast("B")
    prog_off = align(HEADER_SIZE + len(fbuf))
    data_off = align(prog_off + prog.nbytes)
    pad1 = b"\0" * (prog_off - HEADER_SIZE - len(fbuf))
    pad2 = b"\0" * (data_off - prog_off - prog.nbytes)
    data = list(seg.chunks())
    h = hashlib.sha256()
    h.update(fbuf)
    h.update(pad1)
    for c in data:
        h.update(c)
    header = HEADER.pack(MAGIC, HEADER_VERSION, bundle.version, HEADER_SIZE, len(fbuf), prog_off, prog.nbytes,
                         data_off, seg.size, h.digest())
    header += b"\0" * (HEADER_SIZE - len(header))
    return [header, fbuf, pad1, prog, pad2, *data]


def serialize_bundle(bundle: BundleDef) -> bytes:
    """The whole .bpte file as bytes."""
    return b"".join(build_file_parts(bundle))


def write_bundle(path: Any, bundle: BundleDef) -> None:
    """Writes a .bpte atomically (temp file + rename), streaming the program and tensor bytes."""
    from edgetorch._fileio import atomic_write

    atomic_write(path, build_file_parts(bundle))


# ----------------------------------------------------------------------------------------------
# Reader
# ----------------------------------------------------------------------------------------------

def _fail(what: str, msg: str, fld: str) -> BundledProgramFormatError:
    return BundledProgramFormatError(f"{what}: {msg}", field=fld)


def is_bundled_program(buffer: Any) -> bool:
    """True when ``buffer`` starts like a .bpte (magic only; ``read_header`` validates the rest)."""
    mv = memoryview(buffer)
    return mv.nbytes >= 8 and bytes(mv[:8]) == MAGIC


def read_header(buffer: Any, path: str | None = None) -> BundleHeader:
    """Validates and returns the header: magic, versions and the extents of the three parts."""
    what = path or "bundled program"
    mv = memoryview(buffer)
    n = mv.nbytes
    if n < HEADER_SIZE:
        raise _fail(what, f"file is truncated ({n} bytes, the header alone is {HEADER_SIZE})", "header")
    magic, hver, sver, fb_off, fb_size, p_off, p_size, d_off, d_size, digest = HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        kind = "an edgetorch program (.pte)" if magic == PTE_MAGIC else "not an edgetorch bundled program"
        raise _fail(what, f"{kind} (magic {bytes(magic)!r}, expected {MAGIC!r})", "header.magic")
    if hver != HEADER_VERSION:
        raise _fail(what, f"unsupported header version {hver} (this reader knows {HEADER_VERSION})",
                    "header.version")
    if sver != BUNDLE_SCHEMA_VERSION:
        raise _fail(what, f"unsupported bundled program schema version {sver} (this reader reads "
                    f"{BUNDLE_SCHEMA_VERSION})", "header.schema_version")
    if fb_off != HEADER_SIZE or fb_size < 8 or fb_off + fb_size > n:
        raise _fail(what, f"flatbuffer [{fb_off}, {fb_off + fb_size}) lies outside the file ({n} bytes): "
                    "truncated?", "header.flatbuffer_size")
    if p_off % ALIGNMENT or p_off < fb_off + fb_size or p_off + p_size > n:
        raise _fail(what, f"embedded program [{p_off}, {p_off + p_size}) is misaligned or lies outside the file "
                    f"({n} bytes): truncated?", "header.program_size")
    if d_off % ALIGNMENT or d_off < p_off + p_size or d_off + d_size > n:
        raise _fail(what, f"test-data segment [{d_off}, {d_off + d_size}) is misaligned or lies outside the file "
                    f"({n} bytes): truncated?", "header.data_size")
    ident = bytes(mv[fb_off + 4:fb_off + 8])
    if ident != FB_IDENTIFIER:
        raise _fail(what, f"flatbuffer identifier is {ident!r}, expected {FB_IDENTIFIER!r}", "flatbuffer.identifier")
    if p_size < 8 or bytes(mv[p_off:p_off + 8]) != PTE_MAGIC:
        raise _fail(what, f"the embedded program does not start like a .pte (magic {bytes(mv[p_off:p_off + 8])!r})",
                    "program")
    return BundleHeader(hver, sver, fb_off, fb_size, p_off, p_size, d_off, d_size, bytes(digest))


def embedded_program(buffer: Any, path: str | None = None) -> Any:
    """The program bytes to run: ``buffer`` itself for a .pte (or anything that is not a .bpte), a zero-copy
    ``memoryview`` of the embedded .pte for a .bpte. Only the header is read (O(1))."""
    try:
        mv = memoryview(buffer)
    except TypeError:
        return buffer
    if not is_bundled_program(mv):
        mv.release()
        return buffer
    h = read_header(mv, path)
    return mv[h.program_offset:h.program_offset + h.program_size]


def _ints(getter, length) -> list[int]:
    n = length()
    return [int(getter(i)) for i in range(n)]


class _Reader:
    def __init__(self, mv: memoryview, h: BundleHeader, what: str, copy: bool) -> None:
        self.mv, self.h, self.what, self.copy = mv, h, what, copy

    def value(self, v: Any, fld: str) -> Value:
        U = fb.ValueUnion
        t = v.ValType()
        tab = v.Val()
        if tab is None or t == U.NONE:
            raise _fail(self.what, f"{fld} holds no value", fld)
        if t == U.Tensor:
            x = fb.Tensor()
            x.Init(tab.Bytes, tab.Pos)
            sizes = _ints(x.Sizes, x.SizesLength)
            dim_order = _ints(x.DimOrder, x.DimOrderLength)
            itemsize = ITEMSIZE.get(x.ScalarType())
            if itemsize is None:
                raise _fail(self.what, f"{fld}: unknown scalar type {x.ScalarType()}", f"{fld}.scalar_type")
            if any(s < 0 for s in sizes):
                raise _fail(self.what, f"{fld}: negative size in {sizes}", f"{fld}.sizes")
            if sorted(dim_order) != list(range(len(sizes))):
                raise _fail(self.what, f"{fld}: dim order {dim_order} is not a permutation of {len(sizes)} dims",
                            f"{fld}.dim_order")
            if dim_order != list(range(len(sizes))):
                raise _fail(self.what, f"{fld}: non-contiguous dim order {dim_order} is not supported (version 1 "
                            "stores tensors contiguously)", f"{fld}.dim_order")
            numel = 1
            for s in sizes:
                numel *= s
            r = x.Data()
            off, size = (r.Offset(), r.Size()) if r is not None else (0, 0)
            if size != numel * itemsize:
                raise _fail(self.what, f"{fld}: {size} data bytes for a tensor of scalar type {x.ScalarType()} and "
                            f"sizes {sizes} (expected {numel * itemsize})", f"{fld}.data")
            if size and (off % ALIGNMENT or off + size > self.h.data_size):
                raise _fail(self.what, f"{fld}: data range [{off}, {off + size}) is misaligned or outside the "
                            f"test-data segment ({self.h.data_size} bytes)", f"{fld}.data")
            base = self.h.data_offset + off
            data = self.mv[base:base + size]
            return TensorData(x.ScalarType(), sizes, bytes(data) if self.copy else data, dim_order)
        if t == U.Int:
            x = fb.Int()
            x.Init(tab.Bytes, tab.Pos)
            return int(x.Value())
        if t == U.Bool:
            x = fb.Bool()
            x.Init(tab.Bytes, tab.Pos)
            return bool(x.Value())
        if t == U.Double:
            x = fb.Double()
            x.Init(tab.Bytes, tab.Pos)
            return float(x.Value())
        raise _fail(self.what, f"{fld} has unknown value type tag {t}", fld)

    def read(self, root: Any) -> tuple[list[TestSuiteDef], int, str]:
        suites = []
        for i in range(root.MethodTestSuitesLength()):
            s = root.MethodTestSuites(i)
            name = s.MethodName()
            name = name.decode("utf-8") if isinstance(name, (bytes, bytearray)) else (name or "")
            cases = []
            for j in range(s.TestCasesLength()):
                tc = s.TestCases(j)
                fld = f"{name}.test_cases[{j}]"
                ins = [self.value(tc.Inputs(k), f"{fld}.inputs[{k}]") for k in range(tc.InputsLength())]
                outs = [self.value(tc.ExpectedOutputs(k), f"{fld}.expected_outputs[{k}]")
                        for k in range(tc.ExpectedOutputsLength())]
                cases.append(TestCaseDef(ins, outs if tc.HasExpectedOutputs() else None))
            suites.append(TestSuiteDef(name, cases))
        phash = root.ProgramContentHash()
        phash = phash.decode("utf-8") if isinstance(phash, (bytes, bytearray)) else (phash or "")
        return suites, root.Version(), phash


def read_bundle(buffer: Any, path: str | None = None, copy: bool = False, check_digest: bool = True) -> BundleDef:
    """Parses a whole .bpte. ``program`` and tensor ``data`` are zero-copy views of ``buffer`` unless
    ``copy``; ``check_digest`` recomputes the SHA-256 of the flatbuffer and test data (not of the program)."""
    what = path or "bundled program"
    mv = memoryview(buffer)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    h = read_header(mv, path)
    fbuf = bytes(mv[h.flatbuffer_offset:h.flatbuffer_offset + h.flatbuffer_size])
    if check_digest:
        d = hashlib.sha256()
        d.update(mv[h.flatbuffer_offset:h.program_offset])
        d.update(mv[h.data_offset:h.data_offset + h.data_size])
        if d.digest() != h.digest:
            raise _fail(what, "checksum mismatch: the test cases (flatbuffer or test data) are corrupt",
                        "header.digest")
    try:
        root = fb.BundledProgram.GetRootAs(fbuf, 0)
        suites, version, phash = _Reader(mv, h, what, copy).read(root)
    except BundledProgramFormatError:
        raise
    except Exception as e:  # the generated accessors do no bounds checks
        raise _fail(what, f"malformed bundled program flatbuffer ({type(e).__name__}: {e})", "flatbuffer") from None
    if version != h.schema_version:
        raise _fail(what, f"flatbuffer version {version} differs from the header's {h.schema_version}", "version")
    program = mv[h.program_offset:h.program_offset + h.program_size]
    if phash and bytes(program[48:80]).hex() != phash:
        raise _fail(what, "the embedded program's content hash differs from the one recorded in the bundle",
                    "program_content_hash")
    return BundleDef(bytes(program) if copy else program, suites, version, phash)


def tensor_to_torch(t: TensorData, copy: bool = True) -> Any:
    """A ``torch.Tensor`` with the stored dtype, sizes and bytes (a copy unless ``copy=False``)."""
    import torch

    from edgetorch.formats.dtypes import code_dtype

    dtype = code_dtype(t.scalar_type)
    mv = memoryview(t.data)
    if mv.nbytes == 0:
        return torch.empty(t.sizes, dtype=dtype)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frombuffer on a read-only buffer
        raw = torch.frombuffer(mv, dtype=torch.uint8)
    out = raw.view(dtype).reshape(t.sizes)
    return out.clone() if copy else out


def tensor_from_torch(t: Any) -> TensorData:
    """The stored form of a tensor: its contiguous bytes (no copy when it is already contiguous on CPU)."""
    import torch

    from edgetorch.formats.dtypes import dtype_code

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    sizes = list(t.shape)
    if t.numel() == 0:
        return TensorData(dtype_code(t.dtype), sizes, b"")
    raw = t.reshape(-1).view(torch.uint8)
    return TensorData(dtype_code(t.dtype), sizes, memoryview(raw.numpy()))
