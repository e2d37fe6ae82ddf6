"""The onnxruntime delegate blob: a small versioned container holding an ONNX model and its large weights.

Layout (little endian)::

    0   magic  b"ETORTDLG"
    8   u32    container version (1; 2 when some initializers lie in the program's named data; 3 when the
               debug tables are a compressed payload section)
    12  u32    header length H (bytes of UTF-8 JSON)
    16  u64    total blob length (catches truncation)
    24  u32    CRC-32 of the header bytes
    28  u32    CRC-32 of the payload (everything after the padded header)
    32  header JSON (H bytes), zero padding to a multiple of 64
    P   payload: the ONNX ModelProto bytes, then each large initializer's raw bytes, each 64-byte aligned

The header records where the model and every external initializer lie (offsets relative to the payload start
P) plus everything the runtime needs without parsing the model: input/output names, dtypes and shapes, and
where the debug tables (ONNX value/node name -> edge debug handles) lie. Large initializers are stored outside the
ModelProto (marked as external data) so that the runtime can hand ONNX Runtime zero-copy views of the mapped
program file, shared by every session it builds for the delegate. No pickle anywhere.

Version 2: an initializer entry with a ``key`` (and no ``offset``) is not in the payload: its bytes are the
program's named data under that key (``PreprocessResult.data_store_output``), shared by every delegate of every
method that stores the same content; the key is ``"onnxruntime/sha256:<hex>"`` of the bytes. ``unpack`` resolves
it through the ``named_data`` lookup the runtime hands the backend at init.

Version 3: the debug tables (``values``, ``groups``, ``nodes``, ``intermediates``, ``shapes``, ``stats``) are no
longer header JSON but one payload section, the header's ``debug_tables`` entry (``offset``, ``nbytes``,
``raw_nbytes``, ``encoding`` ``"zlib+json/1"``): zlib-compressed compact JSON ``{"groups": [[id, [value names],
[handles]], ...], "nodes": {...}, "shapes": {...}, "stats": {...}}`` (``values`` and ``intermediates`` are derived
from ``groups``), about a sixth of the JSON bytes (_debug_tables.py). ``unpack`` returns the same header dict for every
version: the tables expanded, each checked (``OrtBlobError`` naming ``debug_tables.<table>[...]``).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetorch.backends.onnxruntime import _debug_tables
from edgetorch.errors import FormatError
from edgetorch.formats.alignment import align

MAGIC = b"ETORTDLG"
CONTAINER_VERSION = 3
#: container versions this reader reads (1: every initializer in the payload; 2: named data; 3: compressed
#: debug tables)
READABLE_VERSIONS = (1, 2, 3)
#: prefix of the named-data keys of this backend's weights
NAMED_KEY_PREFIX = "onnxruntime/sha256:"
_FIXED = struct.Struct("<8sIIQII")
#: the ``location`` every external initializer of the stored ModelProto names
EXTERNAL_LOCATION = "edgetorch-onnxruntime-blob"


class OrtBlobError(FormatError):
    """A delegate blob of the onnxruntime backend is malformed, truncated or of an unknown version."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(f"onnxruntime delegate blob: {message}", field=field)


@dataclass
class UnpackedBlob:
    header: dict[str, Any]
    model: memoryview  # the serialized ModelProto (external initializers not inline)
    initializers: dict[str, np.ndarray]  # read-only views into the blob


def named_key(raw: memoryview | bytes) -> str:
    """The named-data key of a weight's bytes (its content hash: equal bytes in two delegates share one entry)."""
    return NAMED_KEY_PREFIX + hashlib.sha256(raw).hexdigest()


def pack(header: dict[str, Any], model: bytes, initializers: list[tuple[str, np.ndarray]],
         named: dict[str, bytes] | None = None, named_min_bytes: int = 0) -> bytes:
    """Builds a blob; ``header`` gets ``model`` and ``initializers`` entries (payload offsets) added. With
    ``named`` (a dict filled here), initializers of at least ``named_min_bytes`` bytes go there under their
    content key instead of into the payload (container version 2). The debug tables of ``header``
    (``_debug_tables.KEYS``) are stored compressed in the payload (container version 3)."""
    header = dict(header)
    header.pop("debug_tables", None)  # an unpacked header's entry: its offsets are the old payload's
    tables = {k: header.pop(k) for k in _debug_tables.KEYS if k in header}
    parts: list[Any] = []
    pos = 0

    def put(data: Any, nbytes: int) -> int:
        nonlocal pos
        off = pos
        parts.append(data)
        pad = align(nbytes) - nbytes
        if pad:
            parts.append(bytes(pad))
        pos += nbytes + pad
        return off

    header["model"] = {"offset": put(model, len(model)), "nbytes": len(model)}
    if tables:
        packed, raw_nbytes = _debug_tables.encode(tables)
        header["debug_tables"] = {"encoding": _debug_tables.ENCODING, "offset": put(packed, len(packed)),
                                  "nbytes": len(packed), "raw_nbytes": raw_nbytes}
    table = []
    for name, arr in initializers:
        arr = np.ascontiguousarray(arr)
        raw = memoryview(arr.reshape(-1).view(np.uint8))
        entry: dict[str, Any] = {"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape),
                                 "nbytes": int(arr.nbytes)}
        if named is not None and arr.nbytes >= max(named_min_bytes, 1):
            entry["key"] = named_key(raw)
            named[entry["key"]] = raw.tobytes()
        else:
            entry["offset"] = put(raw, arr.nbytes)
        table.append(entry)
    header["initializers"] = table
    version = 3 if tables else 2 if any("key" in e for e in table) else 1
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    payload_start = align(_FIXED.size + len(head))
    payload_crc = 0
    for p in parts:
        payload_crc = zlib.crc32(p, payload_crc)
    fixed = _FIXED.pack(MAGIC, version, len(head), payload_start + pos, zlib.crc32(head), payload_crc)
    return b"".join([fixed, head, bytes(payload_start - _FIXED.size - len(head)), *parts])


def unpack(blob: memoryview | bytes, verify_payload: bool = True,
           named_data: Callable[[str], memoryview] | Mapping[str, bytes] | None = None) -> UnpackedBlob:
    """Parses and checks a blob; raises ``OrtBlobError`` naming what is wrong. ``named_data``: the program's
    lookup (key -> bytes), needed by a blob whose initializers lie in the program's named data."""
    mv = memoryview(blob).cast("B") if not isinstance(blob, memoryview) or blob.format != "B" else blob
    n = mv.nbytes
    if n < _FIXED.size:
        raise OrtBlobError(f"truncated: {n} bytes, shorter than the {_FIXED.size}-byte fixed header", field="header")
    magic, version, head_len, total, head_crc, payload_crc = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise OrtBlobError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r}): this is not an onnxruntime delegate "
                           "blob, or its first bytes are corrupted", field="magic")
    if version not in READABLE_VERSIONS:
        raise OrtBlobError(f"container version {version} is not supported (this runtime reads versions "
                           f"{list(READABLE_VERSIONS)}); re-export the program with this edgetorch", field="version")
    if total != n:
        what = "truncated" if n < total else "has trailing bytes"
        raise OrtBlobError(f"{what}: the header says {total} bytes, the blob has {n}", field="total_length")
    if _FIXED.size + head_len > n:
        raise OrtBlobError(f"header length {head_len} runs past the end of the blob ({n} bytes)", field="header")
    head = mv[_FIXED.size:_FIXED.size + head_len]
    if zlib.crc32(head) != head_crc:
        raise OrtBlobError("header checksum mismatch: the JSON header is corrupted", field="header")
    try:
        header = json.loads(bytes(head))
    except (ValueError, RecursionError) as e:
        raise OrtBlobError(f"header is not valid JSON: {e}", field="header") from None
    if not isinstance(header, dict):
        raise OrtBlobError(f"header is a JSON {type(header).__name__}, not an object", field="header")
    payload_start = align(_FIXED.size + head_len)
    payload = mv[payload_start:]
    if verify_payload and zlib.crc32(payload) != payload_crc:
        raise OrtBlobError("payload checksum mismatch: the ONNX model or its weights are corrupted", field="payload")
    for key in ("model", "initializers", "inputs", "outputs"):
        if key not in header:
            raise OrtBlobError(f"header lacks the '{key}' entry", field=key)

    def span(entry: dict, what: str) -> memoryview:
        try:
            off, size = int(entry["offset"]), int(entry["nbytes"])
        except (KeyError, TypeError, ValueError):
            raise OrtBlobError(f"{what} has no valid offset/nbytes", field=what) from None
        if off < 0 or size < 0 or off + size > payload.nbytes:
            raise OrtBlobError(f"{what} [{off}, {off + size}) lies outside the payload ({payload.nbytes} bytes)",
                               field=what)
        return payload[off:off + size]

    model = span(header["model"], "model")
    header.update(_tables(header, version, span))
    inits: dict[str, np.ndarray] = {}
    for i, e in enumerate(header["initializers"]):
        what = f"initializers[{i}]"
        raw = _named_span(e, what, named_data, version) if "key" in e else span(e, what)
        try:
            dtype = np.dtype(e["dtype"])
            shape = tuple(int(s) for s in e["shape"])
        except (KeyError, TypeError, ValueError):
            raise OrtBlobError(f"{what} has no valid dtype/shape", field=what) from None
        count = int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize != raw.nbytes:
            raise OrtBlobError(f"{what} ('{e.get('name')}'): {raw.nbytes} bytes do not hold {dtype} {list(shape)}",
                               field=what)
        inits[str(e["name"])] = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
    return UnpackedBlob(header, model, inits)


def _tables(header: dict[str, Any], version: int, span: Callable[[dict, str], memoryview]) -> dict[str, Any]:
    """The debug tables of a blob, checked: version 3's compressed section (the header holds none of them
    inline), or the header's own (versions 1 and 2)."""
    try:
        if version < 3:
            _debug_tables.check(header)
            return {}
        inline = sorted(k for k in _debug_tables.KEYS if k in header)
        if inline:
            raise _debug_tables.DebugTableError(f"debug_tables: the header holds the debug table(s) {inline} "
                                                "inline, which a version-3 blob stores compressed",
                                                field="debug_tables")
        entry = header.get("debug_tables")
        if entry is None:
            return {}
        if not isinstance(entry, dict) or entry.get("encoding") != _debug_tables.ENCODING:
            enc = entry.get("encoding") if isinstance(entry, dict) else entry
            raise _debug_tables.DebugTableError(f"debug_tables.encoding: unknown encoding {str(enc)[:40]!r} (this "
                                                f"runtime reads {_debug_tables.ENCODING!r})",
                                                field="debug_tables.encoding")
        return _debug_tables.inflate(span(entry, "debug_tables"), entry.get("raw_nbytes"))
    except _debug_tables.DebugTableError as e:
        raise OrtBlobError(e.message, field=e.field) from None


def _named_span(e: dict, what: str, named_data: Callable[[str], memoryview] | Mapping[str, bytes] | None,
                version: int) -> memoryview:
    """The bytes of an initializer stored in the program's named data (container version 2)."""
    key = e.get("key")
    if version < 2 or not isinstance(key, str) or not key.startswith(NAMED_KEY_PREFIX):
        raise OrtBlobError(f"{what} has an invalid named-data key {key!r}", field=what)
    if named_data is None:
        raise OrtBlobError(f"{what} ('{e.get('name')}') lies in the program's named data '{key}': load the blob "
                           "through its program (the runtime hands the backend the named_data lookup)", field=what)
    try:
        raw = memoryview(named_data[key] if isinstance(named_data, Mapping) else named_data(key)).cast("B")
    except KeyError:
        raise OrtBlobError(f"{what} ('{e.get('name')}'): no named data '{key}'", field=what) from None
    except FormatError as err:
        raise OrtBlobError(f"{what} ('{e.get('name')}'): {err}", field=what) from None
    if raw.nbytes != e.get("nbytes"):
        raise OrtBlobError(f"{what} ('{e.get('name')}'): named data '{key}' holds {raw.nbytes} bytes, the blob "
                           f"expects {e.get('nbytes')}", field=what)
    return raw
