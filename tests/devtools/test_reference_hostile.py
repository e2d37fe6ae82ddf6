"""Issue 26: hostile reference artifacts (bit flips, edited offsets and sizes, pickles and foreign targets in the
ETRecord) give typed errors only: no crash, no other exception, no code run."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.errors import ArtifactMismatchError, EdgeTorchError, ETDumpFormatError, ETRecordFormatError
from edgetorch.formats.etdump_executorch import read_any_etdump
from tests.devtools._reference_data import DATA, debug_buffer


class _Payload:
    """Unpickling this writes a file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def _parse_all(data: bytes):
    """``parse_etrecord`` plus everything it leaves for first use (the programs and their weights)."""
    rec = parse_etrecord(data)
    assert rec.exported_programs is not None and rec.edge_programs and rec.graph_map is not None
    rec.reference_graph("forward")
    rec.handle_table("forward")
    return rec


def _rezip(data: bytes, replace: dict[str, bytes] | None = None, drop: tuple[str, ...] = ()) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if info.filename in drop:
                continue
            dst.writestr(info.filename, (replace or {}).get(info.filename, src.read(info.filename)))
    return out.getvalue()


@pytest.fixture(scope="module")
def record():
    return parse_etrecord(DATA / "mlp_portable_etrecord.bin")


def test_etdump_bit_flips(record):
    """Every byte of a reference ETDump flipped: decoding succeeds or raises ETDumpFormatError; a decodable dump
    goes through the Inspector and the gap table with typed errors only."""
    data = (DATA / "mlp_portable.etdp").read_bytes()
    outcomes = {"ok": 0, "format": 0, "typed": 0}
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0xFF
        try:
            read_any_etdump(bytes(bad))
        except ETDumpFormatError:
            outcomes["format"] += 1
            continue
        if i % 5:
            outcomes["ok"] += 1
            continue
        try:
            ins = Inspector(etdump_data=bytes(bad), etrecord=record,
                            debug_buffer_path=debug_buffer("mlp_portable"))
            ins.calculate_numeric_gap("MSE")
            outcomes["ok"] += 1
        except EdgeTorchError:
            outcomes["typed"] += 1
    assert outcomes["format"] > 100 and outcomes["ok"] > 100, outcomes


def _tensor_offsets(data: bytes) -> list[int]:
    d = read_any_etdump(data)
    return sorted({e.debug_event.debug_entry.tensor.offset for r in d.run_data for e in r.events
                   if e.debug_event is not None and e.debug_event.debug_entry.tensor is not None})


@pytest.mark.parametrize("value", [1 << 40, 65536 - 8, -5])
def test_edited_tensor_offset(value, record):
    """An offset beyond the debug buffer (or negative) is refused naming the field; nothing is read out of
    bounds."""
    data = (DATA / "mlp_portable.etdp").read_bytes()
    off = _tensor_offsets(data)[-1]
    pos = data.rfind(struct.pack("<q", off))
    assert pos > 0
    bad = bytearray(data)
    struct.pack_into("<q", bad, pos, value)
    with pytest.raises((ETDumpFormatError, ArtifactMismatchError)) as ei:
        ins = Inspector(etdump_data=bytes(bad), etrecord=record, debug_buffer_path=debug_buffer("mlp_portable"))
        ins.calculate_numeric_gap("MSE")
    if isinstance(ei.value, ETDumpFormatError):  # a negative offset: the reader refuses the field
        assert ei.value.field.endswith("offset")
    else:  # an offset past the end: the buffer is too short for the dump's tensors, refused before any read
        assert "65536 bytes" in str(ei.value)


def test_edited_sizes_and_version():
    data = (DATA / "mlp_xnnpack.etdp").read_bytes()
    d = read_any_etdump(data)
    sizes = next(e.debug_event.debug_entry.tensor.sizes for e in d.run_data[1].events if e.debug_event is not None)
    vec = struct.pack("<I", len(sizes)) + struct.pack(f"<{len(sizes)}q", *sizes)
    pos = data.find(vec)
    bad = bytearray(data)
    struct.pack_into("<q", bad, pos + 4, -3)
    with pytest.raises(ETDumpFormatError) as ei:
        read_any_etdump(bytes(bad))
    assert ei.value.field.endswith("sizes")
    struct.pack_into("<I", bad, pos, 1 << 28)  # a vector running past the end
    with pytest.raises(ETDumpFormatError):
        read_any_etdump(bytes(bad))
    # the root table's version field: find it through the vtable
    root = 4 + struct.unpack_from("<I", data, 4)[0]
    vt = root - struct.unpack_from("<i", data, root)[0]
    field_off = struct.unpack_from("<H", data, vt + 4)[0]
    if field_off:  # version 0 is a default flatcc may omit
        bad = bytearray(data)
        struct.pack_into("<I", bad, root + field_off, 7)
        with pytest.raises(ETDumpFormatError, match="version 7") as ei:
            read_any_etdump(bytes(bad))
        assert ei.value.field == "version"


def test_etrecord_bit_flips(tmp_path):
    data = (DATA / "mlp_xnnpack_etrecord.bin").read_bytes()
    n_err = 0
    for i in range(0, len(data), 211):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        try:
            _parse_all(bytes(bad))
        except ETRecordFormatError:
            n_err += 1
    assert n_err > 0


@pytest.mark.parametrize("entry", ["representative_inputs", "reference_outputs",
                                   "edge_dialect_exported_program/forward_state_dict", "exported_program_constants"])
@pytest.mark.parametrize("wrap", ["raw pickle", "torch.save archive"])
def test_pickle_in_the_etrecord_runs_nothing(entry, wrap, tmp_path):
    marker = tmp_path / "pwned"
    payload = _Payload(marker)
    if wrap == "raw pickle":
        blob = pickle.dumps(payload)
    else:
        buf = io.BytesIO()
        torch.save({"x": payload}, buf)
        blob = buf.getvalue()
    bad = _rezip((DATA / "mlp_portable_etrecord.bin").read_bytes(), {entry: blob})
    with pytest.raises(ETRecordFormatError, match="weights_only") as ei:
        _parse_all(bad)
    assert ei.value.field == entry
    assert not marker.exists()


@pytest.mark.parametrize("target", ["torch.hub.load", "builtins.eval", "os.system", "torch.load",
                                    "_operator.methodcaller", "torch.ops.myns.evil.default", 7])
def test_foreign_node_targets_are_refused(target):
    data = (DATA / "mlp_portable_etrecord.bin").read_bytes()
    entry = "edge_dialect_exported_program/forward"
    doc = json.loads(zipfile.ZipFile(io.BytesIO(data)).read(entry))
    doc["graph_module"]["graph"]["nodes"][0]["target"] = target
    with pytest.raises(ETRecordFormatError, match="target") as ei:
        parse_etrecord(_rezip(data, {entry: json.dumps(doc).encode()}))
    assert ei.value.field == entry


@pytest.mark.parametrize("entry,content,match", [
    ("debug_handle_map", b'{"forward": {"x": 1}}', "instruction id"),
    ("debug_handle_map", b'{"forward": {"0": "1"}}', "debug handle"),
    ("debug_handle_map", b'[1, 2]', "expected"),
    ("debug_handle_map", b'{"forward": ' * 100000, "JSON"),
    ("delegate_map", b'{"forward": {"0": {"name": 3}}}', "delegate_map"),
    ("instruction_id_to_num_outs_map", b'{"forward": {"0": -1}}', "counts"),
    ("export_graph_id", b'"abc"', "integer"),
    ("edge_dialect_exported_program/forward", b'{"graph_module": 5}', "graph_module"),
    ("edge_dialect_exported_program/forward", b'{"graph_module": {"graph": {}}}', "deserialized"),
])
def test_malformed_entries(entry, content, match):
    bad = _rezip((DATA / "mlp_portable_etrecord.bin").read_bytes(), {entry: content})
    with pytest.raises(ETRecordFormatError, match=match) as ei:
        _parse_all(bad)
    assert ei.value.field == entry


@pytest.mark.parametrize("drop", ["debug_handle_map", "edge_dialect_exported_program/forward_constants"])
def test_missing_entries(drop):
    bad = _rezip((DATA / "mlp_portable_etrecord.bin").read_bytes(), drop=(drop,))
    with pytest.raises(ETRecordFormatError, match="missing"):
        parse_etrecord(bad)


def test_truncated_etrecord():
    data = (DATA / "mlp_portable_etrecord.bin").read_bytes()
    for cut in (10, len(data) // 3, len(data) - 30):
        with pytest.raises(ETRecordFormatError):
            parse_etrecord(data[:cut])


def test_random_mutations_of_every_reference_etdump():
    """Seeded random mutations (1-8 bytes overwritten, truncations, duplicated tails) of every committed reference
    ETDump: decoding raises ETDumpFormatError or succeeds; nothing else escapes."""
    import random

    rng = random.Random(26)
    files = sorted(DATA.glob("*.etdp"))
    assert len(files) >= 10
    outcomes = {"ok": 0, "format": 0}
    for f in files:
        data = f.read_bytes()
        for _ in range(150):
            bad = bytearray(data)
            kind = rng.random()
            if kind < 0.7:
                for _ in range(rng.randint(1, 8)):
                    bad[rng.randrange(len(bad))] = rng.randrange(256)
            elif kind < 0.85:
                bad = bad[:rng.randrange(len(bad))]
            else:
                bad += bad[rng.randrange(len(bad)):]
            try:
                read_any_etdump(bytes(bad))
                outcomes["ok"] += 1
            except ETDumpFormatError:
                outcomes["format"] += 1
    assert outcomes["format"] > 500 and outcomes["ok"] > 100, outcomes


def test_a_flipped_weight_byte_is_refused_by_its_crc():
    """A stored weight archive is read into one buffer that every tensor views (no zipfile read), so its CRC-32 is
    checked by hand: one flipped byte inside a tensor's data is refused naming the entry, never used silently."""
    data = (DATA / "mlp_portable_etrecord.bin").read_bytes()
    outer = zipfile.ZipFile(io.BytesIO(data))
    name = next(i.filename for i in outer.infolist() if i.filename.endswith("forward_state_dict")
                and i.compress_type == zipfile.ZIP_STORED)
    info = outer.getinfo(name)
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    inner = zipfile.ZipFile(io.BytesIO(data[start:start + info.file_size]))
    tensor = max((i for i in inner.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    t_len, t_extra = struct.unpack("<HH", data[start + tensor.header_offset + 26:start + tensor.header_offset + 30])
    at = start + tensor.header_offset + 30 + t_len + t_extra + tensor.file_size // 2
    bad = bytearray(data)
    bad[at] ^= 0x01  # one bit of one float weight
    with pytest.raises(ETRecordFormatError, match="CRC") as ei:
        _parse_all(bytes(bad))
    assert name in str(ei.value)
    _parse_all(data)  # the untouched record reads
