"""Artifact paths that cannot be read give typed edgetorch errors naming the path (still catchable as the OSError
subclasses they stand for)."""

from __future__ import annotations

import os

import pytest

from edgetorch.devtools.etdump import DebugBuffer, read_etdump
from edgetorch.errors import ArtifactIOError, ArtifactNotFoundError, EdgeTorchError
from edgetorch.runtime import Runtime


def test_missing_and_directory_paths(tmp_path):
    missing = tmp_path / "nope.pte"
    with pytest.raises(ArtifactNotFoundError, match="program file not found: .*nope.pte") as e:
        Runtime.get().load_program(missing)
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, EdgeTorchError)
    with pytest.raises(ArtifactIOError, match=f"program file {tmp_path} is a directory"):
        Runtime.get().load_program(tmp_path)
    with pytest.raises(ArtifactNotFoundError, match="ETDump file not found"):
        read_etdump(tmp_path / "x.etdp")
    with pytest.raises(ArtifactIOError, match="is a directory"):
        read_etdump(tmp_path)
    with pytest.raises(ArtifactNotFoundError, match="debug buffer file not found"):
        DebugBuffer(tmp_path / "x.bin")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    f = tmp_path / "secret.pte"
    f.write_bytes(b"x" * 256)
    f.chmod(0)
    with pytest.raises(ArtifactIOError, match="permission denied"):
        Runtime.get().load_program(f)
