"""The onnxruntime delegate's debug tables in a program: stored compressed (container version 3) and read back
exactly as ``preprocess`` made them (the ETRecord's delegate map is made from the same tables); a program whose
blob stores them the old way (version 2, header JSON) still loads and logs the same delegate values; and a
hostile program (one field of the tables edited, the blob and the program re-sealed with valid checksums and
hash, as an attacker makes it) is refused at load with a typed error naming the field."""

from __future__ import annotations

import json
import struct
import types
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from edgetorch.backends.onnxruntime import _blob, _debug_tables
from edgetorch.errors import ExportError, ProgramFormatError
from edgetorch.exir.backend import lowered_module_of
from edgetorch.formats.alignment import align
from edgetorch.models import get_model
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import delegate_calls, lower_ort, traced_delegate_outputs
from tests.fuzz.pte_edit import decode, encode

_FIXED = struct.Struct("<8sIIQII")  # the blob's fixed header (magic, version, H, total, header CRC, payload CRC)


@pytest.fixture(scope="module")
def cnn():
    model, inputs = get_model("small_cnn")
    low = lower_ort(model, inputs)
    return low, lowered_module_of(delegate_calls(low.lowered)[0])


def _parts(blob: bytes) -> tuple[int, dict[str, Any], bytes]:
    """(version, header JSON as stored, payload) of a blob, read by hand."""
    _, version, head_len, _, _, _ = _FIXED.unpack_from(blob, 0)
    return version, json.loads(blob[_FIXED.size:_FIXED.size + head_len]), blob[align(_FIXED.size + head_len):]


def _seal(version: int, header: dict[str, Any], payload: bytes) -> bytes:
    """A blob with valid lengths and CRCs around ``header`` and ``payload`` (written by hand, as an attacker or
    an older edgetorch would)."""
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    start = align(_FIXED.size + len(head))
    fixed = _FIXED.pack(_blob.MAGIC, version, len(head), start + len(payload), zlib.crc32(head),
                        zlib.crc32(payload))
    return fixed + head + bytes(start - _FIXED.size - len(head)) + payload


def _with_section(blob: bytes, section: bytes, raw_nbytes: int, **entry: Any) -> bytes:
    """``blob`` whose ``debug_tables`` entry points at ``section``, appended to the payload."""
    version, header, payload = _parts(blob)
    at = align(len(payload))
    header["debug_tables"] = {**header["debug_tables"], "offset": at, "nbytes": len(section),
                              "raw_nbytes": raw_nbytes, **entry}
    return _seal(version, header, payload + bytes(at - len(payload)) + section)


def _stored_doc(blob: bytes) -> dict[str, Any]:
    _, header, payload = _parts(blob)
    e = header["debug_tables"]
    return json.loads(zlib.decompress(payload[e["offset"]:e["offset"] + e["nbytes"]]))


def _in_program(pte: bytes, blob: bytes) -> bytes:
    """``pte`` with its delegate blob 0 replaced by ``blob`` (appended to the segment area), re-encoded with a
    valid content hash."""
    prog, seg = decode(pte)
    at = align(len(seg))
    prog.delegate_data[0] = (at, len(blob))
    return encode(prog, seg + bytes(at - len(seg)) + blob)


def test_tables_are_stored_compressed_and_read_back_unchanged(cnn):
    _, lowered = cnn
    blob = lowered.processed_bytes
    version, stored, _ = _parts(blob)
    assert version == _blob.CONTAINER_VERSION == 3
    assert not set(_debug_tables.KEYS) & set(stored)  # none of them in the header JSON any more
    header = _blob.unpack(blob, named_data=lowered.named_data).header
    groups, values, nodes = header["groups"], header["values"], header["nodes"]
    assert groups and nodes and header["shapes"]
    assert header["intermediates"] == [v for _, names in groups for v in names]
    assert [gid for gid, _ in groups] == list(values)
    # the ETRecord's link (the lowered module's debug handle map): every key is an ONNX node or a group id
    dmap = lowered.debug_handle_map
    assert set(dmap) == set(nodes) | set(values)
    for name, hs in dmap.items():
        assert set(hs) == set(nodes.get(name, ())) | set(values.get(name, ())), name
    as_json = len(json.dumps({k: header[k] for k in _debug_tables.KEYS}, separators=(",", ":")))
    assert stored["debug_tables"]["nbytes"] * 3 < as_json
    # re-packing an unpacked header (tests do) gives the same tables
    again = _blob.unpack(_blob.pack({k: v for k, v in header.items() if k not in ("model", "initializers")},
                                    b"model", []), verify_payload=True).header
    assert all(again[k] == header[k] for k in _debug_tables.KEYS)


def test_old_encoding_still_loads_and_logs_the_same_delegate_values(cnn, tmp_path):
    low, lowered = cnn
    new = traced_delegate_outputs(low.et, low.inputs, str(tmp_path), "new")
    version, stored, payload = _parts(lowered.processed_bytes)
    header = _blob.unpack(lowered.processed_bytes, named_data=lowered.named_data).header
    old_header = {k: v for k, v in stored.items() if k != "debug_tables"}
    old_header.update({k: header[k] for k in _debug_tables.KEYS})  # version 2: the tables are header JSON
    old_blob = _seal(2, old_header, payload)
    assert _blob.unpack(old_blob, named_data=lowered.named_data).header["groups"] == header["groups"]
    pte = _in_program(low.et.buffer, old_blob)
    old = traced_delegate_outputs(types.SimpleNamespace(buffer=pte), low.inputs, str(tmp_path), "old")
    assert [d for d, _ in old] == [d for d, _ in new] and len(new) >= len(header["groups"])
    for (_, a), (_, b) in zip(old, new, strict=True):
        assert torch.equal(a, b)


def _doc_edit(change: Callable[[dict], Any]) -> Callable[[bytes], bytes]:
    def edit(blob: bytes) -> bytes:
        doc = _stored_doc(blob)
        change(doc)
        raw = json.dumps(doc, separators=(",", ":")).encode()
        return _with_section(blob, zlib.compress(raw), len(raw))
    return edit


def _bomb(blob: bytes) -> bytes:
    """Valid tables followed by 8 MiB of JSON whitespace, declared as the tables' own size."""
    raw = json.dumps(_stored_doc(blob), separators=(",", ":")).encode()
    return _with_section(blob, zlib.compress(raw + b" " * (8 << 20), 9), len(raw))


def _first(table: dict) -> str:
    return next(iter(table))


HOSTILE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "group handle": (_doc_edit(lambda d: d["groups"][1].__setitem__(2, [-1])), "debug_tables.groups[1]"),
    "group names": (_doc_edit(lambda d: d["groups"][0].__setitem__(1, "relu")), "debug_tables.groups[0]"),
    "duplicate id": (_doc_edit(lambda d: d["groups"][1].__setitem__(0, d["groups"][0][0])),
                     "debug_tables.groups[1]"),
    "node handle": (_doc_edit(lambda d: d["nodes"].__setitem__(_first(d["nodes"]), ["7"])), "debug_tables.nodes["),
    "shape dtype": (_doc_edit(lambda d: d["shapes"][_first(d["shapes"])].__setitem__("dtype", "O")),
                    "debug_tables.shapes["),
    "shape of no value": (_doc_edit(lambda d: d["shapes"].__setitem__("evil", {"dtype": "<f4", "shape": [1]})),
                          "debug_tables.shapes['evil']"),
    "extra table": (_doc_edit(lambda d: d.__setitem__("evil", 1)), "debug_tables"),
    "bomb": (_bomb, "debug_tables.raw_nbytes"),
    "huge declared size": (lambda b: _with_section(b, b"x", _debug_tables.MAX_RAW_BYTES + 1),
                           "debug_tables.raw_nbytes"),
    "truncated stream": (lambda b: _with_section(b, zlib.compress(b'{"groups":[]}' * 50)[:-6], 650),
                         "debug_tables.raw_nbytes"),
    "garbage stream": (lambda b: _with_section(b, b"not zlib at all", 10), "debug_tables"),
    "encoding": (lambda b: _with_section(b, zlib.compress(b"{}"), 2, encoding="zlib+json/9"),
                 "debug_tables.encoding"),
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_debug_table_is_refused_naming_the_field(cnn, attack):
    low, lowered = cnn
    edit, field = HOSTILE[attack]
    bad = edit(lowered.processed_bytes)
    with pytest.raises(_blob.OrtBlobError) as direct:
        _blob.unpack(bad, named_data=lowered.named_data)
    assert direct.value.field.startswith(field), (direct.value.field, str(direct.value))
    with pytest.raises(ProgramFormatError) as at_load:
        Runtime.get().load_program(_in_program(low.et.buffer, bad)).load_method("forward")
    cause = at_load.value.__cause__
    assert isinstance(cause, _blob.OrtBlobError) and cause.field == direct.value.field
    assert "onnxruntime" in str(at_load.value) and field.split(".")[-1].split("[")[0] in str(at_load.value)


def test_a_version_3_header_with_inline_tables_is_refused(cnn):
    _, lowered = cnn
    version, header, payload = _parts(lowered.processed_bytes)
    header["groups"] = [["x", ["x"]]]
    with pytest.raises(_blob.OrtBlobError, match="inline") as e:
        _blob.unpack(_seal(version, header, payload), named_data=lowered.named_data)
    assert e.value.field == "debug_tables"


def test_tables_the_stored_form_would_lose_are_refused_at_export():
    tables = {"groups": [["a", ["a", "b"]]], "values": {"a": [1], "c": [2]}, "intermediates": ["a", "b"]}
    with pytest.raises(ExportError, match="values"):
        _blob.pack(dict(tables, inputs=[], outputs=[]), b"", [])
    with pytest.raises(ExportError, match="intermediates"):
        _blob.pack(dict(tables, values={"a": [1]}, intermediates=["b"], inputs=[], outputs=[]), b"", [])
