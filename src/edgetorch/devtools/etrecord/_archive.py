"""The ETRecord zip layout: entry names, writer and validating reader (no entry is ever unpickled)."""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections import Counter
from typing import IO, TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram

import edgetorch
from edgetorch.devtools.etrecord._program_serde import ProgramDataError, deserialize_program, serialize_program
from edgetorch.devtools.etrecord._tensors import (
    TensorBlobWriter,
    TensorDataError,
    TensorReader,
    UnsupportedValueError,
    check_byteorder,
    decode_tree,
    encode_tree,
)
from edgetorch.errors import ETRecordError, ETRecordFormatError

if TYPE_CHECKING:
    from edgetorch.devtools.etrecord._etrecord import ETRecord

FORMAT_NAME = "edgetorch.etrecord"
FORMAT_VERSION = 1
MARKER = "ETRECORD_EDGETORCH_V1"
RECORD = "record.json"
PROGRAMS = "programs.json"
PROGRAM_DIR = "programs/{}/"
PROGRAM_GRAPH = "exported_program.json"
PROGRAM_INDEX = "tensors.json"
TENSORS = "tensors.bin"
DEBUG_HANDLE_MAP = "debug_handle_map.json"
DELEGATE_MAP = "delegate_map.json"
NUM_OUTS_MAP = "instruction_id_to_num_outs_map.json"
INPUTS = "representative_inputs.json"
OUTPUTS = "reference_outputs.json"

_UPSTREAM_MARKER = "ETRECORD_V0"
_ANY_MARKER = re.compile(r"^ETRECORD_EDGETORCH_V(\d+)$")
_MAX_DEFLATE_RATIO = 200
_FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # identical records give identical bytes


# --- normalisation of the emitter side tables (shared by capture and parse) --------------------------------

def _int_key(k: Any) -> int:
    if isinstance(k, int) and not isinstance(k, bool) and k >= 0:
        return k
    if isinstance(k, str) and re.fullmatch(r"0|[1-9][0-9]{0,17}", k):
        return int(k)
    raise ValueError(f"instruction id {k!r} is not a non-negative integer")


def _handle(h: Any) -> int:
    if isinstance(h, int) and not isinstance(h, bool):
        return h
    raise ValueError(f"debug handle {h!r} is not an integer")


def _handles(v: Any) -> int | list[int]:
    if isinstance(v, (list, tuple)):
        return [_handle(h) for h in v]
    return _handle(v)


def _per_method(m: Any, what: str) -> dict[str, Any]:
    if not isinstance(m, dict) or not all(isinstance(k, str) for k in m):
        raise ValueError(f"{what} must map method names to per-instruction maps")
    for k, v in m.items():
        if not isinstance(v, dict):
            raise ValueError(f"{what}[{k!r}] must be a map keyed by instruction id")
    return m


def norm_debug_handle_map(m: Any) -> dict[str, dict[int, int | list[int]]]:
    return {meth: {_int_key(i): _handles(v) for i, v in d.items()}
            for meth, d in _per_method(m, "debug_handle_map").items()}


def norm_num_outs_map(m: Any) -> dict[str, dict[int, int]]:
    def n(v: Any) -> int:
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
        raise ValueError(f"number of outputs {v!r} is not a non-negative integer")
    return {meth: {_int_key(i): n(v) for i, v in d.items()}
            for meth, d in _per_method(m, "instruction_id_to_num_outs_map").items()}


def _delegate_id(k: Any) -> int | str:
    if isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool)):
        return k
    raise ValueError(f"delegate debug id {k!r} is neither an int nor a string")


def norm_delegate_entry(e: Any, pairs: bool = False) -> dict[str, Any]:
    if not isinstance(e, dict) or set(e) != {"name", "delegate_map"} or not isinstance(e["name"], str):
        raise ValueError("delegate entry must be {'name': backend id, 'delegate_map': ...}")
    dm = e["delegate_map"]
    if pairs:  # file form: [[id, [handles]], ...] keeps int ids ints
        if not isinstance(dm, list) or not all(isinstance(p, list) and len(p) == 2 for p in dm):
            raise ValueError("delegate_map must be a list of [delegate debug id, handles] pairs")
        items = [(p[0], p[1]) for p in dm]
    else:
        if not isinstance(dm, dict):
            raise ValueError("delegate_map must be a dict")
        items = list(dm.items())
    out: dict[int | str, list[int]] = {}
    for k, v in items:
        hs = _handles(v)
        out[_delegate_id(k)] = hs if isinstance(hs, list) else [hs]
    return {"name": e["name"], "delegate_map": out}


def norm_delegate_map(m: Any, pairs: bool = False) -> dict[str, dict[int, dict[str, Any]]]:
    return {meth: {_int_key(i): norm_delegate_entry(e, pairs) for i, e in d.items()}
            for meth, d in _per_method(m, "delegate_map").items()}


# --- write ---------------------------------------------------------------------------------------------------

def _json_bytes(obj: Any) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise ETRecordError(f"cannot save the ETRecord: a table holds a value JSON cannot store ({e})") from e


def _encode_samples(samples: dict[str, list[Any]], blobs: TensorBlobWriter, what: str) -> bytes:
    return _json_bytes({m: [encode_tree(s, blobs, f"{what}[{m!r}][{i}]") for i, s in enumerate(lst)]
                        for m, lst in samples.items()})


Entry = tuple[str, bytes | list[bytes]]


def build_entries(rec: ETRecord) -> list[Entry]:
    """Every entry of the zip, in write order (tensor bytes as a list of chunks, written last). Raises
    ``ETRecordError`` for content the format cannot store."""
    check_byteorder()
    blobs = TensorBlobWriter()
    roles: dict[str, dict[str, int]] = {"aten": {}, "edge": {}, "graph_map": {}}
    unique: list[tuple[ExportedProgram, str]] = []
    slot: dict[int, int] = {}
    for role, progs in (("aten", rec.exported_programs), ("edge", rec.edge_programs), ("graph_map", rec.graph_map)):
        for key, ep in progs.items():
            if not isinstance(ep, ExportedProgram):
                raise ETRecordError(f"{role} program {key!r} is a {type(ep).__name__}, not an ExportedProgram")
            if id(ep) not in slot:  # one copy for a program recorded under several roles
                slot[id(ep)] = len(unique)
                unique.append((ep, f"{role} program {key!r}"))
            roles[role][key] = slot[id(ep)]
    entries: list[Entry] = [(PROGRAMS, _json_bytes({"count": len(unique), **roles}))]
    for i, (ep, what) in enumerate(unique):
        try:
            graph, index = serialize_program(ep, what, blobs)
        except (UnsupportedValueError, ProgramDataError) as e:
            raise ETRecordError(f"cannot save the ETRecord: {e}") from e
        d = PROGRAM_DIR.format(i)
        entries += [(d + PROGRAM_GRAPH, graph), (d + PROGRAM_INDEX, index)]
    entries.append((DEBUG_HANDLE_MAP, _json_bytes(
        {m: {str(i): v for i, v in d.items()} for m, d in (rec._debug_handle_map or {}).items()})))
    if rec._delegate_map is not None:
        entries.append((DELEGATE_MAP, _json_bytes(
            {m: {str(i): {"name": e["name"], "delegate_map": [[k, list(v)] for k, v in e["delegate_map"].items()]}
                 for i, e in d.items()} for m, d in rec._delegate_map.items()})))
    if rec._instruction_id_to_num_outs_map is not None:
        entries.append((NUM_OUTS_MAP, _json_bytes(
            {m: {str(i): v for i, v in d.items()} for m, d in rec._instruction_id_to_num_outs_map.items()})))
    for data, name, what in ((rec._representative_inputs, INPUTS, "representative inputs"),
                             (rec._reference_outputs, OUTPUTS, "reference outputs")):
        if data is not None:
            try:
                entries.append((name, _encode_samples(data, blobs, what)))
            except UnsupportedValueError as e:
                raise ETRecordError(f"cannot save the ETRecord: {e}") from e
    head: list[Entry] = [
        (MARKER, _json_bytes({"format": FORMAT_NAME, "version": FORMAT_VERSION,
                              "producer": f"edgetorch {edgetorch.__version__}", "torch_version": torch.__version__,
                              "byteorder": "little"})),
        (RECORD, _json_bytes({"program_hash": rec.program_hash, "memory_plan": rec.memory_plan,
                              "tensor_bytes": blobs.nbytes})),
    ]
    return head + entries + [(TENSORS, blobs.chunks)]


def write_entries(f: IO[bytes], entries: list[Entry]) -> None:
    with zipfile.ZipFile(f, "w", allowZip64=True) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_FIXED_DATE)
            info.compress_type = zipfile.ZIP_STORED if name.endswith(".bin") else zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            if isinstance(data, bytes):
                zf.writestr(info, data)
                continue
            info.file_size = sum(len(c) for c in data)
            with zf.open(info, "w", force_zip64=info.file_size > 0x7FFFFFFF) as out:
                for c in data:
                    out.write(c)


# --- read ----------------------------------------------------------------------------------------------------

class _Reader:
    def __init__(self, zf: zipfile.ZipFile, path: str | None) -> None:
        self.zf = zf
        self.path = path
        self.infos = {i.filename: i for i in zf.infolist()}

    def error(self, entry: str, msg: str) -> ETRecordFormatError:
        return ETRecordFormatError(f"ETRecord entry {entry!r}: {msg}", field=entry, path=self.path)

    def has(self, name: str) -> bool:
        return name in self.infos

    def bytes(self, name: str) -> bytes:
        info = self.infos.get(name)
        if info is None:
            raise ETRecordFormatError(f"ETRecord is missing the entry {name!r}", field=name, path=self.path)
        if info.compress_type != zipfile.ZIP_STORED and info.file_size > _MAX_DEFLATE_RATIO * info.compress_size \
                + (1 << 20):
            raise self.error(name, f"compression ratio {info.file_size}/{info.compress_size} is implausible")
        try:
            return self.zf.read(info)
        except Exception as e:  # truncated, bad CRC, encrypted, unsupported compression
            raise self.error(name, f"cannot be read ({type(e).__name__}: {e})") from None

    def json(self, name: str) -> Any:
        data = self.bytes(name)
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:
            raise self.error(name, f"is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None


def _open_zip(source: Any, path: str | None) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(source, "r")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as e:
        raise ETRecordFormatError(f"not an ETRecord file: not a readable zip archive ({e})",
                                  field="<archive>", path=path) from None


def _check_marker(r: _Reader) -> None:
    names = list(r.infos)
    if MARKER not in r.infos:
        other = sorted(n for n in names if _ANY_MARKER.match(n))
        if other:
            raise ETRecordFormatError(f"unsupported ETRecord format version (marker {other[0]!r}); this edgetorch "
                                      f"reads version {FORMAT_VERSION}", field=other[0], path=r.path)
        if _UPSTREAM_MARKER in r.infos:
            raise ETRecordFormatError(f"this is an ExecuTorch ETRecord ({_UPSTREAM_MARKER}); edgetorch reads only "
                                      f"its own format ({MARKER}): regenerate it with edgetorch",
                                      field=_UPSTREAM_MARKER, path=r.path)
        raise ETRecordFormatError(f"not an ETRecord file: the zip has no {MARKER!r} marker entry",
                                  field=MARKER, path=r.path)
    marker = r.json(MARKER)
    if not isinstance(marker, dict) or marker.get("format") != FORMAT_NAME:
        raise r.error(MARKER, f"marker must be a JSON object with format {FORMAT_NAME!r}")
    version = marker.get("version")
    if version != FORMAT_VERSION:
        raise r.error(MARKER, f"unsupported ETRecord format version {version!r}; this edgetorch reads version "
                              f"{FORMAT_VERSION}")
    if marker.get("byteorder", "little") != "little":
        raise r.error(MARKER, "tensor data must be little-endian")


def _program_indices(r: _Reader) -> tuple[int, dict[str, dict[str, int]]]:
    doc = r.json(PROGRAMS)
    if not isinstance(doc, dict) or set(doc) != {"count", "aten", "edge", "graph_map"}:
        raise r.error(PROGRAMS, "must hold exactly count, aten, edge and graph_map")
    count = doc["count"]
    if not (isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 100_000):
        raise r.error(PROGRAMS, f"bad program count {count!r}")
    roles: dict[str, dict[str, int]] = {}
    for role in ("aten", "edge", "graph_map"):
        m = doc[role]
        if not isinstance(m, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < count
                                              for v in m.values()):
            raise r.error(PROGRAMS, f"{role!r} must map names to program numbers below {count}")
        roles[role] = m
    for key in roles["graph_map"]:
        if "/" not in key:
            raise r.error(PROGRAMS, f"graph_map key {key!r} is not 'name/method'")
    return count, roles


def _read_program(r: _Reader, i: int, reader: TensorReader) -> ExportedProgram:
    d = PROGRAM_DIR.format(i)
    names = (d + PROGRAM_GRAPH, d + PROGRAM_INDEX)
    graph, index = (r.bytes(n) for n in names)
    try:
        return deserialize_program(graph, index, reader, names)
    except ProgramDataError as e:
        entry = e.args[1] if len(e.args) > 1 else names[0]
        raise r.error(entry, str(e.args[0])) from None


def _read_samples(r: _Reader, name: str, reader: TensorReader) -> dict[str, list[Any]] | None:
    if not r.has(name):
        return None
    doc = r.json(name)
    if not isinstance(doc, dict):
        raise r.error(name, "must map method names to lists of samples")
    out: dict[str, list[Any]] = {}
    try:
        for m, lst in doc.items():
            if not isinstance(lst, list):
                raise TensorDataError(f"method {m!r} must map to a list")
            out[m] = [decode_tree(s, reader, f"[{m!r}][{i}]") for i, s in enumerate(lst)]
    except (TensorDataError, RecursionError) as e:
        raise r.error(name, str(e)) from None
    return out


def read_archive(source: str | IO[bytes], path: str | None) -> dict[str, Any]:
    """Parses and validates a whole ETRecord; returns the constructor fields of ``ETRecord``."""
    check_byteorder()
    zf = _open_zip(source, path)
    with zf:
        dup = [n for n, c in Counter(i.filename for i in zf.infolist()).items() if c > 1]
        if dup:
            raise ETRecordFormatError(f"ETRecord zip holds the entry {dup[0]!r} more than once", field=dup[0],
                                      path=path)
        r = _Reader(zf, path)
        _check_marker(r)
        record = r.json(RECORD)
        if not isinstance(record, dict) or set(record) != {"program_hash", "memory_plan", "tensor_bytes"}:
            raise r.error(RECORD, "must hold exactly program_hash, memory_plan and tensor_bytes")
        ph, mp = record["program_hash"], record["memory_plan"]
        if ph is not None and not (isinstance(ph, str) and re.fullmatch(r"[0-9a-f]{1,128}", ph)):
            raise r.error(RECORD, f"program_hash {ph!r} is not a hex string")
        if mp is not None and not (isinstance(mp, dict) and all(isinstance(v, dict) for v in mp.values())):
            raise r.error(RECORD, "memory_plan must map method names to dicts")
        blob = r.bytes(TENSORS)
        if record["tensor_bytes"] != len(blob):
            raise r.error(TENSORS, f"holds {len(blob)} bytes, {RECORD!r} expects {record['tensor_bytes']!r}")
        reader = TensorReader(blob)
        count, roles = _program_indices(r)
        programs = [_read_program(r, i, reader) for i in range(count)]
        fields: dict[str, Any] = {
            "exported_programs": {k: programs[i] for k, i in roles["aten"].items()},
            "edge_dialect_program": {k: programs[i] for k, i in roles["edge"].items()} or None,
            "graph_map": {k: programs[i] for k, i in roles["graph_map"].items()},
            "program_hash": ph, "memory_plan": mp,
        }
        for name, key, norm in ((DEBUG_HANDLE_MAP, "_debug_handle_map", norm_debug_handle_map),
                                (DELEGATE_MAP, "_delegate_map", lambda m: norm_delegate_map(m, pairs=True)),
                                (NUM_OUTS_MAP, "_instruction_id_to_num_outs_map", norm_num_outs_map)):
            if not r.has(name):
                if name == DEBUG_HANDLE_MAP:
                    r.bytes(name)  # raises: required
                fields[key] = None
                continue
            try:
                fields[key] = norm(r.json(name))
            except ValueError as e:
                if isinstance(e, ETRecordFormatError):
                    raise
                raise r.error(name, str(e)) from None
        fields["_representative_inputs"] = _read_samples(r, INPUTS, reader)
        fields["_reference_outputs"] = _read_samples(r, OUTPUTS, reader)
    return fields


def to_bytes(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    write_entries(buf, entries)
    return buf.getvalue()
