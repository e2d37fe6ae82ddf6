"""The ETRecord reader: validates the zip (marker, manifest checksums, entry sizes, local headers), reads the
small tables at once and the programs, reference graphs and handle tables on first use (``ArchiveSource``). No
entry is ever unpickled; every problem raises ``ETRecordFormatError`` naming the entry."""

from __future__ import annotations

import hashlib
import json
import mmap
import re
import struct
import threading
import warnings
import zipfile
import zlib
from collections import Counter
from typing import IO, Any

import torch
from torch.export import ExportedProgram

from edgetorch.devtools.etrecord._archive import (
    _ANY_MARKER,
    _LOCAL_HEADER,
    _MAX_DEFLATE_RATIO,
    _UPSTREAM_MARKER,
    DEBUG_HANDLE_MAP,
    DELEGATE_MAP,
    DELEGATE_OUTPUTS,
    EDGE_REFERENCE_GRAPH,
    EDGE_REFERENCE_INDEX,
    FORMAT_NAME,
    FORMAT_VERSION,
    GRAPH_MAP_REFERENCE_GRAPH,
    GRAPH_MAP_REFERENCE_INDEX,
    HANDLE_TABLE,
    HANDLES_INDEX,
    INPUTS,
    MANIFEST,
    MARKER,
    OUTPUTS,
    PROGRAM_DIR,
    PROGRAM_GRAPH,
    PROGRAM_INDEX,
    PROGRAMS,
    RECORD,
    REFERENCE_GRAPH,
    REFERENCE_INDEX,
    TENSORS,
)
from edgetorch.devtools.etrecord._handle_tables import (
    HANDLE_GROUPS_FORMAT,
    decode_groups,
    groups_from_legacy,
    norm_debug_handle_map,
    norm_delegate_map,
    norm_delegate_outputs,
)
from edgetorch.devtools.etrecord._program_serde import ProgramDataError, deserialize_program
from edgetorch.devtools.etrecord._reference import GraphDataError, NodeInfo, build_handles, build_reference
from edgetorch.devtools.etrecord._tensors import (
    TensorDataError,
    TensorReader,
    check_byteorder,
    decode_tree,
)
from edgetorch.errors import ETRecordFormatError, artifact_io_error
from edgetorch.formats.handles import HandleGroup

__all__ = ["ArchiveSource", "read_archive"]


class _BufferFile:
    """A read-only, seekable file over a buffer (mmap, bytearray), for ``zipfile`` (which reads no more than
    the entries asked for). Holds no OS file handle."""

    def __init__(self, buf: Any) -> None:
        self._mv = memoryview(buf)
        self._pos = 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._mv.nbytes}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._mv.nbytes if n is None or n < 0 else min(self._pos + n, self._mv.nbytes)
        data = self._mv[self._pos:end].tobytes() if end > self._pos else b""
        self._pos = max(self._pos, end)
        return data

    def close(self) -> None:
        pass


class _Reader:
    def __init__(self, zf: zipfile.ZipFile, path: str | None) -> None:
        self.zf = zf
        self.path = path
        self.infos = {i.filename: i for i in zf.infolist()}
        self.sums: dict[str, str] | None = None  # MANIFEST's checksums (None: a record written without them)
        self._checked: set[str] = set()

    def verify(self, name: str, data: Any) -> None:
        """Checks ``data`` (the bytes of entry ``name``) against the manifest, once per entry."""
        if self.sums is None or name in self._checked:
            return
        algo, _, want = self.sums[name].partition(":")
        got = hashlib.sha256(data).hexdigest() if algo == "sha256" else f"{zlib.crc32(data):08x}"
        if got != want:
            raise self.error(name, f"does not match its {algo} checksum in {MANIFEST!r} (the entry is corrupted)")
        self._checked.add(name)

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
            data = self.zf.read(info)
        except Exception as e:  # truncated, bad CRC, encrypted, unsupported compression
            raise self.error(name, f"cannot be read ({type(e).__name__}: {e})") from None
        self.verify(name, data)
        return data

    def json(self, name: str) -> Any:
        data = self.bytes(name)
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:
            raise self.error(name, f"is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None

    def stored_region(self, name: str, buf: Any) -> tuple[int, int] | None:
        """(start, length) of an uncompressed entry's bytes inside the archive buffer ``buf``, validated
        against its local header; None when the entry is compressed (it must then be read)."""
        info = self.infos[name]
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            return None
        if info.compress_size != info.file_size:
            raise self.error(name, f"stored entry with compressed size {info.compress_size} != size "
                                   f"{info.file_size}")
        mv = memoryview(buf).cast("B")
        off = info.header_offset
        head = mv[off:off + _LOCAL_HEADER.size].tobytes()
        if len(head) != _LOCAL_HEADER.size:
            raise self.error(name, "local header runs past the end of the file")
        magic, _, _, method, _, _, _, _, _, n_name, n_extra = _LOCAL_HEADER.unpack(head)
        if magic != b"PK\x03\x04" or method != zipfile.ZIP_STORED:
            raise self.error(name, "bad local header (magic or compression method)")
        name_at = off + _LOCAL_HEADER.size
        if mv[name_at:name_at + n_name].tobytes() != name.encode():
            raise self.error(name, "local header names another entry")
        start = name_at + n_name + n_extra
        if start + info.file_size > mv.nbytes:
            raise self.error(name, f"bytes [{start}, {start + info.file_size}) run past the end of the file "
                                   f"({mv.nbytes} bytes)")
        return start, info.file_size


def _open_zip(source: Any, path: str | None) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(source, "r")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, NotImplementedError, OverflowError,
            struct.error, UnicodeDecodeError) as e:  # NotImplementedError: "zip file version 18.9"
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


def _read_manifest(r: _Reader) -> None:
    """Loads ``MANIFEST`` (a checksum for every other entry) into ``r.sums``; refuses a manifest that does not
    list exactly the archive's entries, or a record whose marker promises one that is missing. A record written
    before manifests existed is read with a warning: its corruption cannot be detected."""
    marker = r.json(MARKER)  # not yet verified: it is checked against the manifest below
    if not r.has(MANIFEST):
        if isinstance(marker, dict) and marker.get("checksums") == MANIFEST:
            raise ETRecordFormatError(f"ETRecord is missing the entry {MANIFEST!r} its marker names", field=MANIFEST,
                                      path=r.path)
        warnings.warn(f"ETRecord {r.path or ''} has no {MANIFEST!r} (written before entry checksums existed): "
                      "corrupted entries cannot be detected; regenerate it to have them checked", stacklevel=4)
        return
    try:
        doc = json.loads(r.zf.read(r.infos[MANIFEST]))
    except Exception as e:  # noqa: BLE001 - bad CRC, truncated, not JSON
        raise r.error(MANIFEST, f"cannot be read ({type(e).__name__}: {str(e)[:200]})") from None
    sums = doc.get("entries") if isinstance(doc, dict) and doc.get("version") == 1 else None
    ok = isinstance(sums, dict) and all(
        isinstance(v, str) and re.fullmatch(r"sha256:[0-9a-f]{64}|crc32:[0-9a-f]{8}", v) for v in sums.values())
    if not ok:
        raise r.error(MANIFEST, "must be {\"version\": 1, \"entries\": {name: \"sha256:<hex>\" | \"crc32:<hex>\"}}")
    names = set(r.infos) - {MANIFEST}
    for extra in sorted(names - set(sums)):
        raise r.error(extra, f"is not listed in {MANIFEST!r} (an entry added or renamed after writing)")
    for missing in sorted(set(sums) - names):
        raise ETRecordFormatError(f"ETRecord is missing the entry {missing!r} (listed in {MANIFEST!r})",
                                  field=missing, path=r.path)
    r.sums = sums
    r.bytes(MARKER)  # now verified


class _CheckedTensorReader(TensorReader):
    """A ``TensorReader`` over ``tensors.bin`` that checks the entry's checksum before the first tensor is read
    (a mapped entry is never read through zipfile, whose CRC check would otherwise cover it)."""

    def __init__(self, r: _Reader, blob: Any, start: int, size: int) -> None:
        super().__init__(blob, start, size)
        self._r = r
        self._verified = r.sums is None
        self._vlock = threading.Lock()

    def read(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not self._verified:
            with self._vlock:
                if not self._verified:
                    self._r.verify(TENSORS, memoryview(self.blob).cast("B")[self.start:self.start + self.size])
                    self._verified = True
        return super().read(*args, **kwargs)


def _read_groups(r: _Reader) -> dict[str, list[HandleGroup]]:
    """The handle groups: the current entry, or the old tables of an earlier record (read by the same parser
    as in-memory tables); ``ETRecordFormatError`` naming the entry at fault."""
    doc = r.json(DEBUG_HANDLE_MAP)  # required
    name = DEBUG_HANDLE_MAP
    try:
        if isinstance(doc, dict) and doc.get("format") == HANDLE_GROUPS_FORMAT:
            return decode_groups(doc)
        norm_debug_handle_map(doc)
        tables: dict[str, Any] = {}
        for name, key, check in ((DELEGATE_MAP, "delegate_map", lambda t: norm_delegate_map(t, pairs=True)),
                                 (DELEGATE_OUTPUTS, "delegate_outputs", norm_delegate_outputs)):
            if r.has(name):
                tables[key] = r.json(name)
                check(tables[key])
        return groups_from_legacy(doc, pairs=True, **tables) or {}
    except ValueError as e:
        if isinstance(e, ETRecordFormatError):
            raise
        raise r.error(name, str(e)) from None


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
    for i in range(count):  # the entries themselves are read when a program is first used
        for n in (PROGRAM_DIR.format(i) + PROGRAM_GRAPH, PROGRAM_DIR.format(i) + PROGRAM_INDEX):
            if not r.has(n):
                r.bytes(n)  # raises: missing
    return count, roles


def _view_index(r: _Reader, index_name: str, entry_name: str) -> dict[str, int]:
    """{method: entry number} of the reference graphs / handle tables; {} for a file written without them."""
    if not r.has(index_name):
        return {}
    doc = r.json(index_name)
    if not isinstance(doc, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100_000
                                            for v in doc.values()) or len(set(doc.values())) != len(doc):
        raise r.error(index_name, "must map method names to distinct entry numbers")
    for m, v in doc.items():
        if not r.has(entry_name.format(v)):
            raise r.error(index_name, f"method {m!r} refers to {entry_name.format(v)!r}, which the ETRecord is "
                                      "missing")
    return doc


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


class ArchiveSource:
    """The parts of a parsed ETRecord that are read on first use: the programs (torch's deserializer is
    slow), the reference graphs and the handle tables. Keeps the archive buffer (the file mapping) alive; a
    problem found then still raises ``ETRecordFormatError`` naming the entry."""

    def __init__(self, r: _Reader, reader: TensorReader, roles: dict[str, dict[str, int]],
                 references: dict[str, int], handles: dict[str, int], mapped: bool,
                 edge_references: dict[str, int] | None = None,
                 graph_map_references: dict[str, int] | None = None) -> None:
        self._r = r
        self.reader = reader
        self.roles = roles
        self.references = references
        self.edge_references = edge_references or {}
        self.graph_map_references = graph_map_references or {}  # {graph_map key: entry}; {} in older files
        self.handles = handles
        self.mapped = mapped  # tensors are views of a read-only (copy-on-write) mapping of the file
        self._programs: dict[int, ExportedProgram] = {}
        self._lock = threading.RLock()

    def __copy__(self) -> ArchiveSource:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ArchiveSource:
        return self  # read-only: copies of a record share it (a deep copy still copies loaded programs)

    def keys(self, role: str) -> list[str]:
        return list(self.roles[role])

    def program(self, i: int) -> ExportedProgram:
        with self._lock:
            if i not in self._programs:
                self._programs[i] = _read_program(self._r, i, self.reader)
            return self._programs[i]

    def programs(self, role: str) -> dict[str, ExportedProgram]:
        return {k: self.program(i) for k, i in self.roles[role].items()}

    def is_stored(self, role: str, key: str, ep: Any) -> bool:
        """True when ``ep`` is the program loaded from the file for ``role``/``key``."""
        i = self.roles[role].get(key)
        return i is not None and ep is not None and self._programs.get(i) is ep

    def _view(self, name: str, method: str, build: Any) -> Any:
        with self._lock:
            doc = self._r.json(name)
            if not isinstance(doc, dict) or doc.get("method") != method:
                raise self._r.error(name, f"does not describe method {method!r}")
            try:
                return build(doc)
            except (GraphDataError, TensorDataError, RecursionError) as e:
                raise self._r.error(name, str(e)[:500]) from None

    def reference_graph(self, method: str) -> torch.fx.GraphModule:
        return self._view(REFERENCE_GRAPH.format(self.references[method]), method,
                          lambda doc: build_reference(doc, self.reader.read))

    def edge_reference_graph(self, method: str) -> torch.fx.GraphModule:
        return self._view(EDGE_REFERENCE_GRAPH.format(self.edge_references[method]), method,
                          lambda doc: build_reference(doc, self.reader.read))

    def graph_map_reference_graph(self, key: str) -> torch.fx.GraphModule:
        return self._view(GRAPH_MAP_REFERENCE_GRAPH.format(self.graph_map_references[key]), key,
                          lambda doc: build_reference(doc, self.reader.read))

    def handle_table(self, method: str) -> dict[int, list[NodeInfo]]:
        return self._view(HANDLE_TABLE.format(self.handles[method]), method, build_handles)


def _in_memory(data: Any) -> Any:
    """A writable copy of ``data`` in memory from torch's allocator (64-byte aligned, like the file layout),
    so that tensors can be views of it."""
    src = memoryview(data).cast("B")
    buf = torch.empty(src.nbytes, dtype=torch.uint8).numpy()
    memoryview(buf)[:] = src
    return buf


def _load_buffer(source: Any, path: str | None) -> tuple[Any, bool]:
    """The whole file as a buffer: a copy-on-write memory map for a path, else a copy in memory."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _in_memory(source), False
    if path is not None:
        try:
            f = open(path, "rb")
        except (IsADirectoryError, PermissionError) as e:  # a typed error naming the path (not found: the caller's)
            raise artifact_io_error(e, "ETRecord file", path) from None
        with f:
            try:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), True
            except (ValueError, OSError):  # empty file, or a file that cannot be mapped (a pipe)
                return _in_memory(f.read()), False
    return _in_memory(source.read()), False


def read_archive(source: str | IO[bytes] | bytes, path: str | None) -> tuple[dict[str, Any], ArchiveSource]:
    """Validates an ETRecord's structure and reads its small tables; returns the constructor fields of
    ``ETRecord`` (programs excluded) and the ``ArchiveSource`` that loads the rest on demand."""
    check_byteorder()
    buf, mapped = _load_buffer(source, path)
    zf = _open_zip(_BufferFile(buf), path)
    dup = [n for n, c in Counter(i.filename for i in zf.infolist()).items() if c > 1]
    if dup:
        raise ETRecordFormatError(f"ETRecord zip holds the entry {dup[0]!r} more than once", field=dup[0],
                                  path=path)
    r = _Reader(zf, path)
    _check_marker(r)
    _read_manifest(r)
    record = r.json(RECORD)
    if not isinstance(record, dict) or set(record) != {"program_hash", "memory_plan", "tensor_bytes"}:
        raise r.error(RECORD, "must hold exactly program_hash, memory_plan and tensor_bytes")
    ph, mp = record["program_hash"], record["memory_plan"]
    if ph is not None and not (isinstance(ph, str) and re.fullmatch(r"[0-9a-f]{1,128}", ph)):
        raise r.error(RECORD, f"program_hash {ph!r} is not a hex string")
    if mp is not None and not (isinstance(mp, dict) and all(isinstance(v, dict) for v in mp.values())):
        raise r.error(RECORD, "memory_plan must map method names to dicts")
    if not r.has(TENSORS):
        r.bytes(TENSORS)  # raises: missing
    region = r.stored_region(TENSORS, buf)
    if region is None:  # compressed by some other writer: decompress into memory
        buf, mapped = _in_memory(r.bytes(TENSORS)), False
        region = (0, buf.nbytes)
    elif not mapped and zlib.crc32(memoryview(buf)[region[0]:region[0] + region[1]]) != r.infos[TENSORS].CRC:
        raise r.error(TENSORS, "cannot be read (Bad CRC-32: the bytes are corrupted)")
    if record["tensor_bytes"] != region[1]:
        raise r.error(TENSORS, f"holds {region[1]} bytes, {RECORD!r} expects {record['tensor_bytes']!r}")
    try:
        reader = _CheckedTensorReader(r, buf, *region)
    except TensorDataError as e:
        raise r.error(TENSORS, str(e)) from None
    _, roles = _program_indices(r)
    fields: dict[str, Any] = {"program_hash": ph, "memory_plan": mp, "handle_groups": _read_groups(r)}
    fields["_representative_inputs"] = _read_samples(r, INPUTS, reader)
    fields["_reference_outputs"] = _read_samples(r, OUTPUTS, reader)
    source_ = ArchiveSource(r, reader, roles, _view_index(r, REFERENCE_INDEX, REFERENCE_GRAPH),
                            _view_index(r, HANDLES_INDEX, HANDLE_TABLE), mapped,
                            _view_index(r, EDGE_REFERENCE_INDEX, EDGE_REFERENCE_GRAPH),
                            _view_index(r, GRAPH_MAP_REFERENCE_INDEX, GRAPH_MAP_REFERENCE_GRAPH))
    return fields, source_
