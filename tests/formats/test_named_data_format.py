"""The program file's named data (schema version 3): written and read back, checked by ``check_consistency`` and by
the runtime's lookup (bounds, alignment, unknown key: ``ProgramFormatError`` naming the key), and older files
(schema version 2, no ``named_data`` field) still read."""

from __future__ import annotations

import pytest

from edgetorch.errors import ProgramFormatError
from edgetorch.formats import program as pf
from edgetorch.runtime.loader import parse


def _file(named: list[tuple[str, bytes]], version: int = pf.PROGRAM_SCHEMA_VERSION,
          ranges: list[tuple[str, int, int]] | None = None) -> bytes:
    layout = pf.SegmentLayout()
    entries = []
    for key, data in named:
        off, size = layout.ranges[layout.add(data)]
        entries.append((key, off, size))
    prog = pf.ProgramDef([], [], [], version, ranges if ranges is not None else entries)
    return b"".join(bytes(p) for p in pf.build_file_parts(prog, list(layout.chunks())))


def test_named_data_round_trips_and_the_lookup_returns_the_bytes_in_place():
    buf = _file([("a", b"\x01" * 70), ("b", b"\x02" * 5)])
    loaded = parse(buf, None, consistency=True)
    assert loaded.program.version == pf.PROGRAM_SCHEMA_VERSION >= 3  # named data since version 3
    assert [(k, n) for k, _, n in loaded.program.named_data] == [("a", 70), ("b", 5)]
    assert all(off % 64 == 0 for _, off, _ in loaded.program.named_data)
    assert bytes(loaded.named_data("a")) == b"\x01" * 70 and bytes(loaded.named_data("b")) == b"\x02" * 5
    assert loaded.named_data("a").readonly
    with pytest.raises(ProgramFormatError, match="no named data 'c'") as e:
        loaded.named_data("c")
    assert e.value.field == "named_data['c']"


def test_a_version_2_file_has_no_named_data_and_reads():
    loaded = parse(_file([], version=2), None, consistency=True)
    assert loaded.program.version == 2 and loaded.program.named_data == []


@pytest.mark.parametrize("bad,match", [
    ([("a", 0, 10), ("a", 64, 10)], "'a' appears twice"),
    ([("a", 8, 10)], "misaligned or outside"),
    ([("a", 0, 1 << 40)], "misaligned or outside"),
    ([("", 0, 10)], "empty key"),
])
def test_consistency_refuses_bad_entries_naming_them(bad, match):
    buf = _file([("x", b"\x00" * 128)], ranges=bad)
    with pytest.raises(ProgramFormatError, match=match) as e:
        parse(buf, None, consistency=True)
    assert e.value.field.startswith("named_data[")


@pytest.mark.parametrize("bad", [("a", 8, 10), ("a", 64, 1 << 40), ("a", 1 << 40, 10)])
def test_the_lookup_checks_bounds_even_with_minimal_verification(bad):
    loaded = parse(_file([("x", b"\x00" * 128)], ranges=[bad]), None, consistency=False)
    with pytest.raises(ProgramFormatError, match="named data 'a' range") as e:
        loaded.named_data("a")
    assert e.value.field == "named_data['a']"


def test_released_named_data_reads_back_the_same_bytes_from_the_file(tmp_path):
    from edgetorch.runtime.loader import read_data

    data = bytes(range(256)) * 64  # 16 KiB: whole pages inside
    path = tmp_path / "p.pte"
    path.write_bytes(_file([("w", data)]))
    loaded = parse(*read_data(str(path)), consistency=True)
    assert bytes(loaded.named_data("w")) == data
    assert loaded.release_named_data("w") > 0
    assert bytes(loaded.named_data("w")) == data  # paged back in from the file
    in_memory = parse(path.read_bytes(), None, consistency=True)
    assert in_memory.release_named_data("w") == 0 and bytes(in_memory.named_data("w")) == data
