"""The edgetorch program file (.pte): in-memory mirror, the one writer and the one reader.

Layout of a file (all integers little-endian)::

    [0, 128)            file header (``HEADER``)
    [128, 128 + fb)     flatbuffer ``Program`` (schema/program.fbs, identifier "EDTP")
    [seg_base, end)     segment area: constant tensors and delegate blobs, each 64-byte aligned

The header carries the schema version, the flatbuffer and segment extents and a SHA-256 content
hash of everything after the header. Readers validate the header first (``Verification.Minimal``),
then optionally every index, offset and size (``check_consistency``).

This module is the format's one public face (``from edgetorch.formats import program as pf``) and holds the
reader; it re-exports the schema mirror (``_program_defs``), the writer (``_program_writer``) and the
consistency checks (``_program_checks``), split by concern.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from edgetorch.formats._fbread import Table
from edgetorch.formats._generated import program_generated as fb
from edgetorch.formats._program_checks import (
    MAX_SPEC_NODES,
    MAX_TENSOR_BYTES,
    check_consistency,
    check_spec,
)
from edgetorch.formats._program_defs import (
    CALL_FUNCTIONAL,
    CALL_FUNCTIONAL_COPY,
    CALL_KIND_NAMES,
    CALL_OUT,
    CALL_VIEW,
    CONTROL_FLOW_VERSION,
    FB_IDENTIFIER,
    HEADER,
    HEADER_SIZE,
    HEADER_VERSION,
    MAGIC,
    MUTABLE_ZERO_INIT,
    PLACEMENT_ALIAS,
    PLACEMENT_CONSTANT,
    PLACEMENT_DYNAMIC,
    PLACEMENT_MUTABLE,
    PLACEMENT_PLANNED,
    PROGRAM_SCHEMA_VERSION,
    READABLE_SCHEMA_VERSIONS,
    BackendDelegateDef,
    BoolListV,
    DelegateCallDef,
    DeviceV,
    DoubleListV,
    DtypeV,
    InstructionDef,
    IntListV,
    JumpFalseCallDef,
    KernelCallDef,
    LayoutV,
    MemoryFormatV,
    MoveCallDef,
    MutableBufferDef,
    OperatorDef,
    OptionalTensorListV,
    PlanDef,
    ProgramDef,
    SymbolDef,
    SymIntListV,
    SymIntV,
    TensorDef,
    TensorListV,
    Value,
    is_control,
    is_view,
    logged_values,
    run_debug_bytes,
    value_nbytes,
)
from edgetorch.formats._program_writer import (
    HASH_CHUNKS,
    SegmentLayout,
    build_file_parts,
    combine_digests,
    encode_flatbuffer,
    hash_boundaries,
    write_program,
)
from edgetorch.formats.alignment import ALIGNMENT, align, debug_bytes
from edgetorch.formats.errors import ProgramFormatError

__all__ = [
    "ALIGNMENT",
    "BackendDelegateDef",
    "BoolListV",
    "CALL_FUNCTIONAL",
    "CALL_FUNCTIONAL_COPY",
    "CALL_KIND_NAMES",
    "CALL_OUT",
    "CALL_VIEW",
    "CONTROL_FLOW_VERSION",
    "DelegateCallDef",
    "DeviceV",
    "DoubleListV",
    "DtypeV",
    "FB_IDENTIFIER",
    "FileHeader",
    "HASH_CHUNKS",
    "HEADER",
    "HEADER_SIZE",
    "HEADER_VERSION",
    "InstructionDef",
    "IntListV",
    "JumpFalseCallDef",
    "KernelCallDef",
    "LayoutV",
    "MAGIC",
    "MAX_SPEC_NODES",
    "MAX_TENSOR_BYTES",
    "MUTABLE_ZERO_INIT",
    "MemoryFormatV",
    "MoveCallDef",
    "MutableBufferDef",
    "OperatorDef",
    "OptionalTensorListV",
    "PLACEMENT_ALIAS",
    "PLACEMENT_CONSTANT",
    "PLACEMENT_DYNAMIC",
    "PLACEMENT_MUTABLE",
    "PLACEMENT_PLANNED",
    "PROGRAM_SCHEMA_VERSION",
    "READABLE_SCHEMA_VERSIONS",
    "PlanDef",
    "ProgramDef",
    "ProgramFormatError",
    "SegmentLayout",
    "SymIntListV",
    "SymIntV",
    "SymbolDef",
    "TensorDef",
    "TensorListV",
    "Value",
    "align",
    "build_file_parts",
    "check_consistency",
    "check_spec",
    "combine_digests",
    "debug_bytes",
    "decode_flatbuffer",
    "encode_flatbuffer",
    "hash_boundaries",
    "is_control",
    "is_view",
    "logged_values",
    "read_header",
    "run_debug_bytes",
    "value_nbytes",
    "write_program",
]


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
    if sver not in READABLE_SCHEMA_VERSIONS:
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
    elif kind == fb.InstructionArguments.MoveCall and c is not None:
        call = MoveCallDef(c.scalar(0, "i"), c.scalar(1, "i"))
    elif kind == fb.InstructionArguments.JumpFalseCall and c is not None:
        call = JumpFalseCallDef(c.scalar(0, "i"), c.scalar(1, "i"))
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
        named = [(t.string(0), t.scalar(1, "Q"), t.scalar(2, "Q")) for t in root.tables(4)]
    except ProgramFormatError:
        raise
    except (struct.error, ValueError, IndexError, UnicodeDecodeError) as e:
        raise ProgramFormatError(f"malformed program flatbuffer ({type(e).__name__}: {e})",
                                 field="flatbuffer") from None
    if version < CONTROL_FLOW_VERSION:
        for p in plans:
            k = next((k for k, ins in enumerate(p.instructions) if is_control(ins)), None)
            if k is not None:
                raise ProgramFormatError(f"plan '{p.name}': instruction {k} jumps or moves, which schema version "
                                         f"{version} does not have (from version {CONTROL_FLOW_VERSION})",
                                         field=f"{p.name}.instructions[{k}]")
    return ProgramDef(plans, consts, dels, version, named)


def _ranges_of(t: Table, i: int) -> list[tuple[int, int]]:
    start, n = t._vector(i, 16)
    flat = struct.unpack_from(f"<{2 * n}Q", t.buf, start) if n else ()
    return [(flat[2 * k], flat[2 * k + 1]) for k in range(n)]

