"""``formats.alignment.release_mapped_range``: only whole pages of a private file mapping are given back, and the
bytes read afterwards are the file's."""

from __future__ import annotations

import mmap

import pytest

from edgetorch.formats.alignment import release_mapped_range


def test_release_gives_back_whole_pages_of_a_file_mapping_only(tmp_path):
    if not hasattr(mmap, "MADV_DONTNEED"):
        pytest.skip("no madvise here")
    page = mmap.PAGESIZE
    data = bytes(range(256)) * (4 * page // 256)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    assert release_mapped_range(b"not mapped", 0, 10) == 0
    assert release_mapped_range(mapped, 1, page) == 0  # no whole page inside
    assert release_mapped_range(mapped, 1, 3 * page + 5) == 2 * page  # pages 1 and 2
    assert release_mapped_range(mapped, 0, 10 * page) == 4 * page  # to the end, clamped to the mapping
    assert bytes(mapped) == data  # read back from the file
