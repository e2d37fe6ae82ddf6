"""Atomic artifact writes: all or nothing, and a typed error naming the path when the OS refuses."""

from __future__ import annotations

import errno
import os

import pytest

from edgetorch._fileio import atomic_write
from edgetorch.errors import ArtifactIOError


def test_a_full_disk_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "model.pte"
    target.write_bytes(b"old")

    def full(f):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(ArtifactIOError, match=f"cannot write {target}: No space left on device") as info:
        atomic_write(target, writer=full)
    assert info.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte"]


def test_a_directory_in_the_way_is_named(tmp_path):
    (tmp_path / "out.etdp").mkdir()
    with pytest.raises(ArtifactIOError, match="out.etdp"):
        atomic_write(tmp_path / "out.etdp", [b"x"])


def test_chunks_are_written_whole(tmp_path):
    atomic_write(tmp_path / "a" / "b.bin", [b"ab", memoryview(b"cd")])
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"abcd"
