"""Reader of the reference ExecuTorch's ETDump (.etdp, flatbuffer identifier "ED00"), mapped onto edgetorch's
in-memory ETDump model (``formats.etdump``), so the Inspector's event blocks, perf tables and numeric gaps work on
what the reference's C++ or Python runtime recorded on a device.

Layout (schema ``etdump_schema_flatcc.fbs``, version 0): a size-prefixed flatbuffer (4-byte little-endian length,
root offset, "ED00"); root ``ETDump{version, run_data}``; ``RunData{name, bundled_input_index, allocators,
events}``; ``Event{profile_event, allocation_event, debug_event}``; ``ProfileEvent{name, chain_index,
instruction_id, delegate_debug_id_int, delegate_debug_id_str, delegate_debug_metadata, start_time, end_time}``;
``DebugEvent{chain_index (unsigned), instruction_id, debug_entry: Value, delegate_debug_id_int,
delegate_debug_id_str, name}``; ``Value{val, tensor, tensor_list, int_value, float_value, double_value,
bool_value, output}`` whose scalars are one-field tables; ``Tensor{scalar_type, sizes, strides, offset}``, the
offset pointing into the separate debug buffer (unaligned for a file sink, -1 for a zero-byte tensor).

The mapping: framework events (chain -1: ``Method::execute``, ``Program::load_method``, program outputs), which
the reference records with instruction 0, get instruction -1 as in edgetorch; a debug event's ``output_index``
is its position among the values its instruction (and delegate debug id) logged in that run (a delegate call
logs its inputs, then its outputs: ``trim_delegate_call_inputs`` keeps the outputs once an ETRecord says how
many there are); a tensor's ``nbytes`` is derived from its dtype and sizes; ``debug_buffer_bytes`` is the end of
the last stored tensor, so a short buffer is refused before any tensor is read; allocation events, which the
reference's runtime never emits, are counted and dropped. Every offset is bounds-checked; nothing is read from
the debug buffer here (the Inspector maps it, see ``devtools.etdump.DebugBuffer``).
"""

from __future__ import annotations

import struct

from edgetorch.errors import ETDumpFormatError
from edgetorch.formats import etdump as ed
from edgetorch.formats._fbread import Table
from edgetorch.formats.dtypes import CODE_TO_DTYPE
from edgetorch.formats.errors import ProgramFormatError

__all__ = ["FB_IDENTIFIER", "SCHEMA_VERSION", "PRODUCER", "OPERATOR_CALL", "is_executorch_etdump",
           "deserialize_executorch_etdump", "read_any_etdump", "trim_delegate_call_inputs"]

FB_IDENTIFIER = b"ED00"
SCHEMA_VERSION = 0  #: ETDUMP_VERSION of the reference's runtime
PRODUCER = "executorch"  #: ``ETDump.producer`` of a dump this module read
OPERATOR_CALL = ed.OPERATOR_CALL
_BITS16, _UINT16 = 22, 27  # the reference logs Bits16 tensors; read as uint16
_MAX_RANK = 64
_U64_SIGN = 1 << 63


def is_executorch_etdump(data: bytes | bytearray | memoryview) -> bool:
    """True when ``data`` carries the reference's ETDump identifier (size-prefixed: bytes [8, 12))."""
    return len(data) >= 12 and bytes(data[8:12]) == FB_IDENTIFIER


class _Reader:
    def __init__(self, buf: bytes, path: str | None) -> None:
        self.buf, self.path = buf, path
        self.at = "root"
        self.end = 0  # end of the last stored tensor in the debug buffer
        self.allocation_events = 0

    def fail(self, msg: str, fld: str) -> ETDumpFormatError:
        return ETDumpFormatError(f"{self.path or 'ETDump'}: ExecuTorch ETDump: {fld}: {msg}", field=fld,
                                 path=self.path)

    def tensor(self, x: Table, at: str) -> ed.Tensor:
        self.at = at
        code = x.scalar(0, "b")
        code = _UINT16 if code == _BITS16 else code
        if code not in CODE_TO_DTYPE:
            raise self.fail(f"unknown scalar type code {code}", f"{at}.scalar_type")
        sizes, strides = x.scalars(1, "q"), x.scalars(2, "q")
        if len(sizes) > _MAX_RANK or any(s < 0 for s in sizes):
            raise self.fail(f"sizes {sizes[:8]} are not a shape", f"{at}.sizes")
        if strides and len(strides) != len(sizes):
            raise self.fail(f"{len(sizes)} sizes but {len(strides)} strides", f"{at}.strides")
        offset = x.scalar(3, "q")
        numel = 1
        for s in sizes:
            numel *= s
        nbytes = numel * CODE_TO_DTYPE[code].itemsize
        if nbytes >= 1 << 62:
            raise self.fail(f"sizes {sizes} describe {nbytes} bytes", f"{at}.sizes")
        if nbytes == 0:
            offset = ed.NO_OFFSET
        elif offset < 0:
            raise self.fail(f"debug-buffer offset {offset} of a {nbytes}-byte tensor", f"{at}.offset")
        else:
            self.end = max(self.end, offset + nbytes)
        return ed.Tensor(code, sizes, strides, offset, nbytes)

    def value(self, x: Table | None, at: str) -> ed.Value:
        self.at = at
        if x is None:
            raise self.fail("missing", at)
        tag = x.scalar(0, "b")
        try:
            vt = ed.ValueType(tag)
        except ValueError:
            raise self.fail(f"unknown value type tag {tag}", f"{at}.val") from None
        out = x.table(7)
        v = ed.Value(vt, output=bool(out.scalar(0, "?")) if out is not None else False)
        if vt == ed.ValueType.Tensor:
            t = x.table(1)
            if t is None:
                raise self.fail("value of type Tensor has no tensor", f"{at}.tensor")
            v.tensor = self.tensor(t, f"{at}.tensor")
        elif vt == ed.ValueType.TensorList:
            tl = x.table(2)
            if tl is None:
                raise self.fail("value of type TensorList has no tensor_list", f"{at}.tensor_list")
            v.tensor_list = [self.tensor(t, f"{at}.tensor_list[{i}]") for i, t in enumerate(tl.tables(0))]
        elif vt in _SCALAR_FIELDS:
            index, fmt, attr = _SCALAR_FIELDS[vt]
            sub = x.table(index)
            if sub is None:
                raise self.fail(f"value of type {vt.name} has no {attr}", f"{at}.{attr}")
            setattr(v, attr, _cast(vt, sub.scalar(0, fmt)))
        elif vt == ed.ValueType.String:
            raise self.fail("a String value (the schema has no field to hold it)", f"{at}.val")
        return v

    def profile(self, p: Table) -> ed.ProfileEvent:
        chain = p.scalar(1, "i")
        name = p.string(0)
        iid = p.scalar(2, "i", -1)
        return ed.ProfileEvent(name, chain, -1 if chain < 0 else iid, p.scalar(3, "i", -1), p.string(4), p.raw(5),
                               int(p.scalar(6, "Q")), int(p.scalar(7, "Q")))

    def debug(self, d: Table, at: str) -> ed.DebugEvent:
        chain = d.scalar(0, "Q")
        chain = -1 if chain >= _U64_SIGN else chain
        iid = d.scalar(1, "i", -1)
        entry = self.value(d.table(2), f"{at}.debug_entry")
        self.at = at
        return ed.DebugEvent(chain, -1 if chain < 0 else iid, d.scalar(3, "i", -1), d.string(4), entry, 0,
                             d.string(5))

    def run(self, r: Table, at: str) -> ed.RunData:
        self.at = at
        run = ed.RunData(r.string(0), "", r.scalar(1, "i", -1))
        positions: dict[tuple, int] = {}
        for j, e in enumerate(r.tables(3)):
            where = f"{at}.events[{j}]"
            self.at = where
            p, a, d = e.table(0), e.table(1), e.table(2)
            if (p is not None) + (a is not None) + (d is not None) != 1:
                raise self.fail("an event must hold exactly one of profile_event, allocation_event and "
                                "debug_event", where)
            if a is not None:
                self.allocation_events += 1
            elif p is not None:
                self.at = f"{where}.profile_event"
                run.events.append(ed.Event(profile_event=self.profile(p)))
            else:
                ev = self.debug(d, f"{where}.debug_event")
                if not ev.debug_entry.output:
                    key = (ev.instruction_id, ev.delegate_debug_id_int, ev.delegate_debug_id_str)
                    ev.output_index = positions.get(key, 0)
                    positions[key] = ev.output_index + 1
                run.events.append(ed.Event(debug_event=ev))
        return run


_SCALAR_FIELDS = {ed.ValueType.Int: (3, "q", "int_value"), ed.ValueType.Float: (4, "f", "float_value"),
                  ed.ValueType.Double: (5, "d", "double_value"), ed.ValueType.Bool: (6, "?", "bool_value")}


def _cast(vt: ed.ValueType, x: object) -> object:
    return bool(x) if vt == ed.ValueType.Bool else float(x) if vt in (ed.ValueType.Float, ed.ValueType.Double) \
        else int(x)


def deserialize_executorch_etdump(data: bytes | bytearray | memoryview, path: str | None = None) -> ed.ETDump:
    """Decodes the bytes of a reference ETDump into edgetorch's model (``ETDump.producer == "executorch"``);
    a malformed, truncated or unknown-version input raises ``ETDumpFormatError`` naming the field."""
    buf = bytes(data)
    n = len(buf)
    where = path or "ETDump"
    if n < 12 or buf[8:12] != FB_IDENTIFIER:
        raise ETDumpFormatError(f"{where}: not an ExecuTorch ETDump (identifier {buf[8:12]!r})",
                                field="file_identifier", path=path)
    (declared,) = struct.unpack_from("<I", buf, 0)
    if declared + 4 > n:
        raise ETDumpFormatError(f"{where}: ExecuTorch ETDump is truncated: it declares {declared + 4} bytes, the "
                                f"data has {n}", field="size_prefix", path=path)
    buf = buf[:declared + 4]  # flatcc may pad a file; what follows the declared size is not read
    r = _Reader(buf, path)
    try:
        (root_off,) = struct.unpack_from("<I", buf, 4)
        root = Table(buf, 4 + root_off)
        version = root.scalar(0, "I")
        if version != SCHEMA_VERSION:
            raise r.fail(f"unsupported schema version {version} (this reader reads {SCHEMA_VERSION})", "version")
        runs = [r.run(t, f"run_data[{i}]") for i, t in enumerate(root.tables(1))]
    except ETDumpFormatError:
        raise
    except (ProgramFormatError, struct.error, UnicodeDecodeError, ValueError, OverflowError) as e:
        raise r.fail(f"malformed data ({e})", r.at) from None
    dump = ed.ETDump(SCHEMA_VERSION, "", runs, r.end)
    dump.producer = PRODUCER
    dump.dropped_allocation_events = r.allocation_events
    return dump


def read_any_etdump(data: bytes | bytearray | memoryview, path: str | None = None) -> ed.ETDump:
    """An edgetorch or a reference ETDump, told apart by content (the flatbuffer identifier)."""
    if isinstance(data, (bytes, bytearray, memoryview)) and is_executorch_etdump(data):
        return deserialize_executorch_etdump(data, path)
    return ed.deserialize_etdump(data, path)


def trim_delegate_call_inputs(dump: ed.ETDump, num_outputs: dict[int, int], method: str = "forward") -> None:
    """The reference's runtime logs every argument of a delegate call, inputs then outputs; keeps, per run and
    delegate call instruction of ``method`` (``num_outputs``: instruction id -> its number of outputs, from the
    ETRecord), only the last ``num_outputs`` values, renumbered from 0. In place."""
    for run in dump.run_data:
        if (run.method or "forward") != method:
            continue
        logged: dict[int, list[ed.DebugEvent]] = {}
        for e in run.events:
            d = e.debug_event
            if d is not None and not d.debug_entry.output and d.instruction_id in num_outputs \
                    and d.delegate_debug_id_int < 0 and not d.delegate_debug_id_str:
                logged.setdefault(d.instruction_id, []).append(d)
        drop: set[int] = set()
        for iid, ds in logged.items():
            keep = min(max(num_outputs[iid], 0), len(ds))
            drop.update(id(d) for d in ds[:len(ds) - keep])
            for k, d in enumerate(ds[len(ds) - keep:]):
                d.output_index = k
        if drop:
            run.events = [e for e in run.events if e.debug_event is None or id(e.debug_event) not in drop]
