"""The ETRecord zip layout (entry names) and its writer; :mod:`._archive_read` is the validating reader (no
entry is ever unpickled) and :mod:`._handle_tables` the handle-group table."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import torch
from torch.export import ExportedProgram

from edgetorch._version import __version__
from edgetorch.devtools.etrecord._handle_tables import encode_groups
from edgetorch.devtools.etrecord._program_serde import ProgramDataError, serialize_program
from edgetorch.devtools.etrecord._reference import ControlFlowProgram, encode_handles, encode_reference
from edgetorch.devtools.etrecord._tensors import (
    ALIGNMENT,
    TensorBlobWriter,
    UnsupportedValueError,
    check_byteorder,
    encode_tree,
)
from edgetorch.errors import ETRecordError
from edgetorch.formats.handles import HandleGroup

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MARKER", "Entry", "RecordContents", "build_entries", "to_bytes",
           "write_entries"]

FORMAT_NAME = "edgetorch.etrecord"
FORMAT_VERSION = 1
MARKER = "ETRECORD_EDGETORCH_V1"
RECORD = "record.json"
PROGRAMS = "programs.json"
PROGRAM_DIR = "programs/{}/"
PROGRAM_GRAPH = "exported_program.json"
PROGRAM_INDEX = "tensors.json"
TENSORS = "tensors.bin"
#: the handle groups ({"format": HANDLE_GROUPS_FORMAT, "version": 1, "methods": {method: [group row]}}); records
#: written before held the old debug handle map here, with delegate_map.json and delegate_outputs.json beside it
DEBUG_HANDLE_MAP = "debug_handle_map.json"
DELEGATE_MAP = "delegate_map.json"  # old records only
DELEGATE_OUTPUTS = "delegate_outputs.json"  # old records only
INPUTS = "representative_inputs.json"
OUTPUTS = "reference_outputs.json"
REFERENCE_INDEX = "reference/index.json"
REFERENCE_GRAPH = "reference/{}.json"
EDGE_REFERENCE_INDEX = "edge_reference/index.json"
EDGE_REFERENCE_GRAPH = "edge_reference/{}.json"
GRAPH_MAP_REFERENCE_INDEX = "graph_map_reference/index.json"  # {graph_map key: entry number}
GRAPH_MAP_REFERENCE_GRAPH = "graph_map_reference/{}.json"
HANDLES_INDEX = "handles/index.json"
HANDLE_TABLE = "handles/{}.json"
MANIFEST = "manifest.json"  # {"version": 1, "entries": {name: "sha256:<hex>" | "crc32:<hex>"}}, written last

_UPSTREAM_MARKER = "ETRECORD_V0"
_ANY_MARKER = re.compile(r"^ETRECORD_EDGETORCH_V(\d+)$")
_MAX_DEFLATE_RATIO = 200
_FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # identical records give identical bytes
_PAD_EXTRA_ID = 0xD935  # local-header extra field used only as padding (as Android's zipalign does)
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
log = logging.getLogger(__name__)




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


@dataclass(frozen=True)
class RecordContents:
    """What the writer stores of an ETRecord (``ETRecord`` hands it over: the writer never sees the record)."""

    exported_programs: Mapping[str, ExportedProgram]
    edge_programs: Mapping[str, ExportedProgram]
    graph_map: Mapping[str, ExportedProgram]
    handle_groups: dict[str, list[HandleGroup]] | None
    representative_inputs: dict[str, list[Any]] | None
    reference_outputs: dict[str, list[Any]] | None
    program_hash: str | None
    memory_plan: dict[str, dict[str, Any]] | None


def _views(rec: RecordContents, blobs: TensorBlobWriter) -> list[Entry]:
    """The reference graphs (ATen programs, edge programs and the ``graph_map`` programs such as the float
    program of quantization debugging) and handle tables (edge programs), one entry per method. A method
    whose program the compact schema cannot express gets no entry (and a warning): readers then fall back to
    the full program."""
    out: list[Entry] = []
    for index_name, entry_name, progs, encode, what in (
            (REFERENCE_INDEX, REFERENCE_GRAPH, rec.exported_programs,
             lambda ep, m: encode_reference(ep, m, blobs.add), "reference graph"),
            (EDGE_REFERENCE_INDEX, EDGE_REFERENCE_GRAPH, rec.edge_programs,
             lambda ep, m: encode_reference(ep, m, blobs.add), "edge reference graph"),
            (HANDLES_INDEX, HANDLE_TABLE, rec.edge_programs, encode_handles, "handle table"),
            (GRAPH_MAP_REFERENCE_INDEX, GRAPH_MAP_REFERENCE_GRAPH, rec.graph_map,
             lambda ep, m: encode_reference(ep, m, blobs.add), "graph_map reference graph")):
        index: dict[str, int] = {}
        docs: list[Entry] = []
        for m, ep in progs.items():
            try:
                data = _json_bytes(encode(ep, m))
            except Exception as e:  # an optional view never makes saving fail
                quiet = index_name == GRAPH_MAP_REFERENCE_INDEX or isinstance(e, ControlFlowProgram)  # expected
                say = log.debug if quiet else log.warning  # graph_map: any program; torch.cond: read in full
                say("ETRecord: no %s stored for method %r (%s: %s); readers will rebuild it from the full program",
                    what, m, type(e).__name__, e)
                continue
            index[m] = len(docs)
            docs.append((entry_name.format(len(docs)), data))
        out += [(index_name, _json_bytes(index)), *docs]
    return out


def build_entries(rec: RecordContents) -> list[Entry]:
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
    entries += _views(rec, blobs)
    entries.append((DEBUG_HANDLE_MAP, _json_bytes(encode_groups(rec.handle_groups or {}))))
    for data, name, what in ((rec.representative_inputs, INPUTS, "representative inputs"),
                             (rec.reference_outputs, OUTPUTS, "reference outputs")):
        if data is not None:
            try:
                entries.append((name, _encode_samples(data, blobs, what)))
            except UnsupportedValueError as e:
                raise ETRecordError(f"cannot save the ETRecord: {e}") from e
    head: list[Entry] = [
        (MARKER, _json_bytes({"format": FORMAT_NAME, "version": FORMAT_VERSION,
                              "producer": f"edgetorch {__version__}", "torch_version": torch.__version__,
                              "byteorder": "little", "checksums": MANIFEST})),
        (RECORD, _json_bytes({"program_hash": rec.program_hash, "memory_plan": rec.memory_plan,
                              "tensor_bytes": blobs.nbytes})),
    ]
    return head + entries + [(TENSORS, blobs.chunks)]


def _padding(header_offset: int, name: str, zip64: bool) -> bytes:
    """A local-header extra field that puts the entry's data at a multiple of ``ALIGNMENT`` in the file, so a
    reader can map the file and build tensors in place."""
    fixed = header_offset + _LOCAL_HEADER.size + len(name.encode()) + (20 if zip64 else 0) + 4
    return struct.pack("<HH", _PAD_EXTRA_ID, (-fixed) % ALIGNMENT) + b"\0" * ((-fixed) % ALIGNMENT)


def write_entries(f: IO[bytes], entries: list[Entry]) -> None:
    """Writes the zip: ``entries`` in order, then ``MANIFEST`` with the checksum of each of them."""
    sums: dict[str, str] = {}
    with zipfile.ZipFile(f, "w", allowZip64=True) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_FIXED_DATE)
            info.compress_type = zipfile.ZIP_STORED if name.endswith(".bin") else zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            if isinstance(data, bytes):
                zf.writestr(info, data)
                sums[name] = "sha256:" + hashlib.sha256(data).hexdigest()
                continue
            info.file_size = sum(memoryview(c).nbytes for c in data)
            # tensors.bin: stored, its data aligned in the file (zipfile adds zip64 sizes to the local header
            # by this same rule)
            zip64 = info.file_size * 1.05 > zipfile.ZIP64_LIMIT
            start = getattr(zf, "start_dir", None)  # where the local header goes
            if isinstance(start, int):
                info.extra = _padding(start, name, zip64)
            crc = 0
            with zf.open(info, "w", force_zip64=zip64) as out:
                for c in data:
                    out.write(c)
                    crc = zlib.crc32(c, crc)
            sums[name] = f"crc32:{crc:08x}"  # tensor bytes: CRC-32 (4x faster than SHA-256 on big records)
        info = zipfile.ZipInfo(MANIFEST, date_time=_FIXED_DATE)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o644 << 16
        zf.writestr(info, _json_bytes({"version": 1, "entries": sums}))


def to_bytes(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    write_entries(buf, entries)
    return buf.getvalue()
