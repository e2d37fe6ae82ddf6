"""Regression tests of the devtools failure classes the mutation fuzzer found (issue 9): a debug buffer carries
the identity of the recording that wrote it (program hash, run id, CRC-32 of its data) and any other buffer is
refused; every ETRecord entry, ``tensors.bin`` included, is checked against its checksum on first use; a
corrupted method name or side table gives a typed error."""

from __future__ import annotations

import io
import json
import os
import shutil
import warnings
import zipfile

import pytest

from edgetorch.devtools import Inspector
from edgetorch.devtools.etdump import DebugBuffer, read_etdump
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.errors import ArtifactMismatchError, EdgeTorchError, ETDumpFormatError, ETRecordFormatError
from edgetorch.formats import etdump as ed
from edgetorch.models import get_model
from edgetorch.runtime import Runtime
from tests.fuzz import fuzzlib


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> dict[str, str]:
    folder = str(tmp_path_factory.mktemp("identity"))
    paths = fuzzlib.build_artifacts(folder)
    # a second recording of the same program, and a recording of another program
    _, inputs = get_model("mlp")
    prog = Runtime.get().load_program(paths["pte"], enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(*inputs)
    paths["etdp2"], paths["debug2"] = os.path.join(folder, "b.etdp"), os.path.join(folder, "b.bin")
    prog.write_etdump_result_to_file(paths["etdp2"], paths["debug2"])
    return paths


def _gaps(art, etdump=None, etrecord=None, debug=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        insp = Inspector(etdump_path=etdump or art["etdp"], etrecord=etrecord or art["etrecord"],
                         debug_buffer_path=debug or art["debug_buffer"])
        return insp.calculate_numeric_gap("MSE")


def _copy(src: str, tmp_path, name: str, edit=None) -> str:
    dst = str(tmp_path / name)
    shutil.copy(src, dst)
    if edit is not None:
        data = bytearray(open(dst, "rb").read())
        edit(data)
        open(dst, "wb").write(bytes(data))
    return dst


def test_the_original_artifacts_agree(art):
    df = _gaps(art)
    assert len(df) > 0
    t = DebugBuffer(art["debug_buffer"]).trailer
    d = read_etdump(art["etdp"])
    assert t.run_id == d.run_id and len(d.run_id) == 32 and t.program_hash == d.program_hash
    assert t.data_bytes == d.debug_buffer_bytes and t.crc32 == d.debug_buffer_crc32


def test_a_buffer_of_another_recording_is_refused(art):
    with pytest.raises(ArtifactMismatchError, match="written by recording"):
        _gaps(art, debug=art["debug2"])  # same program, same size: it used to give a plausible table


def test_an_etrecord_given_as_debug_buffer_is_refused(art):
    with pytest.raises(ArtifactMismatchError, match="no edgetorch debug buffer trailer|bytes but the ETDump"):
        _gaps(art, debug=art["etrecord"])


def test_a_buffer_of_another_program_is_refused(art, tmp_path):
    def edit(data):
        data[-ed.TRAILER_SIZE + 24] ^= 1  # a byte of the program hash in the trailer
    with pytest.raises(ArtifactMismatchError, match="of program"):
        _gaps(art, debug=_copy(art["debug_buffer"], tmp_path, "other.bin", edit))


def test_a_flipped_data_byte_is_refused(art, tmp_path):
    def edit(data):
        data[100] ^= 0x10
    with pytest.raises(ETDumpFormatError, match="CRC-32") as ei:
        _gaps(art, debug=_copy(art["debug_buffer"], tmp_path, "flipped.bin", edit))
    assert ei.value.field == "debug_buffer_crc32"


def test_a_corrupted_trailer_is_refused(art, tmp_path):
    def edit(data):
        data[-ed.TRAILER_SIZE + 8] ^= 1  # trailer version
    with pytest.raises(ETDumpFormatError, match="corrupted trailer"):
        _gaps(art, debug=_copy(art["debug_buffer"], tmp_path, "trailer.bin", edit))


def test_an_etdump_written_before_run_ids_is_not_checked(art, tmp_path):
    d = read_etdump(art["etdp"])
    d.run_id, d.debug_buffer_crc32 = "", -1
    old = tmp_path / "old.etdp"
    old.write_bytes(ed.serialize_etdump(d))
    data = open(art["debug_buffer"], "rb").read()[:-ed.TRAILER_SIZE]
    (tmp_path / "old.bin").write_bytes(data)
    assert fuzzlib.gap_key(_gaps(art, etdump=str(old), debug=str(tmp_path / "old.bin"))) == fuzzlib.gap_key(_gaps(art))


def test_a_corrupted_method_name_in_the_etdump_is_a_typed_error(art, tmp_path):
    def edit(data):
        i = bytes(data).index(b"forward")
        data[i + 3] ^= 0x04  # 'forsard'
    with pytest.raises(EdgeTorchError, match="forsard"):
        _gaps(art, etdump=_copy(art["etdp"], tmp_path, "method.etdp", edit))


def _entries(path: str) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _zip(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, body in entries.items():
            z.writestr(name, body)
    return out.getvalue()


def test_a_flipped_tensor_byte_in_a_mapped_etrecord_is_refused_on_first_use(art, tmp_path):
    with zipfile.ZipFile(art["etrecord"]) as z:
        info = z.getinfo("tensors.bin")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)

    def edit(data):
        data[start + 1000] ^= 0x01  # a weight: it used to change the gap table silently
    path = _copy(art["etrecord"], tmp_path, "rec.bin", edit)
    with pytest.raises(ETRecordFormatError, match="does not match its crc32 checksum") as ei:
        _gaps(art, etrecord=path)
    assert ei.value.field == "tensors.bin"


@pytest.mark.parametrize("entry", ["debug_handle_map.json", "record.json", "handles/0.json", "reference/0.json"])
def test_an_edited_entry_with_a_valid_zip_crc_is_refused(art, tmp_path, entry):
    entries = _entries(art["etrecord"])
    doc = json.loads(entries[entry])
    entries[entry] = json.dumps(doc if not isinstance(doc, dict) else {**doc, "x": 1}).encode()
    path = tmp_path / "edited.bin"
    path.write_bytes(_zip(entries))
    with pytest.raises(ETRecordFormatError, match="sha256 checksum") as ei:
        _gaps(art, etrecord=str(path))
    assert ei.value.field == entry


def test_an_unchecked_side_table_is_refused_by_name(art):
    """With checksums updated (an edit on purpose), the table's own validation still names the entry
    (it used to be a TypeError deep inside the Inspector)."""
    entries = _entries(art["etrecord"])
    entries["debug_handle_map.json"] = json.dumps({"forward": 5}).encode()
    with pytest.raises(ETRecordFormatError) as ei:
        parse_etrecord(fuzzlib.reseal_etrecord(_zip(entries)))
    assert ei.value.field == "debug_handle_map.json"


def test_a_record_without_its_manifest(art):
    entries = _entries(art["etrecord"])
    del entries["manifest.json"]
    with pytest.raises(ETRecordFormatError, match="missing the entry 'manifest.json'"):
        parse_etrecord(_zip(entries))
    marker = json.loads(entries["ETRECORD_EDGETORCH_V1"])
    del marker["checksums"]
    entries["ETRECORD_EDGETORCH_V1"] = json.dumps(marker).encode()
    with pytest.warns(UserWarning, match="corrupted entries cannot be detected"):
        rec = parse_etrecord(_zip(entries))  # written before manifests: read, with a warning
    assert rec.program_hash


def test_an_entry_not_in_the_manifest_is_refused(art):
    entries = _entries(art["etrecord"])
    entries["extra.json"] = b"{}"
    with pytest.raises(ETRecordFormatError, match="not listed in 'manifest.json'") as ei:
        parse_etrecord(_zip(entries))
    assert ei.value.field == "extra.json"


def test_an_unsupported_zip_version_is_a_format_error(art):  # NotImplementedError: zip file version 18.9
    data = bytearray(open(art["etrecord"], "rb").read())
    cd = bytes(data).index(b"PK\x01\x02")
    data[cd + 6:cd + 8] = (189).to_bytes(2, "little")  # "version needed to extract"
    with pytest.raises(ETRecordFormatError, match="zip file version 18.9"):
        parse_etrecord(bytes(data))
