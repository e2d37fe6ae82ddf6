"""A reference debug buffer of 1 GiB is never read whole (issue 26): the Inspector maps it and touches only the
bytes its ETDump's tensors name. A sparse 1 GiB copy of a reference run's buffer (its 64 KiB of data, then a
hole) gives the same gap table as the original, while the process reads (``rchar``) and maps in (``RssFile``,
with the Inspector and its mapping alive) far less than the buffer's size."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from edgetorch.devtools import Inspector
from tests.devtools._reference_data import DATA, debug_buffer

GIB = 1 << 30
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/io")


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _file_rss() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("RssFile:")).split()[1]) << 10


def _inspector(buffer: str, name: str) -> Inspector:
    return Inspector(etdump_path=str(DATA / f"{name}.etdp"), etrecord=str(DATA / f"{name}_etrecord.bin"),
                     debug_buffer_path=buffer)


@pytest.mark.parametrize("name", ["mlp_portable", "cnn_xnnpack"])
def test_a_1gib_debug_buffer_is_never_read_whole(name: str, tmp_path) -> None:
    small = debug_buffer(name)
    expected = _inspector(str(small), name).calculate_numeric_gap("MSE")  # also warms imports and caches
    big = tmp_path / "debug_1gib.bin"
    data = small.read_bytes()
    with open(big, "wb") as f:
        f.write(data)
        f.truncate(GIB)  # a hole: no disk space, reads as zeros
    assert os.path.getsize(big) == GIB
    read0, mapped0 = _read_bytes(), _file_rss()
    ins = _inspector(str(big), name)
    got = ins.calculate_numeric_gap("MSE")
    read, mapped = _read_bytes() - read0, _file_rss() - mapped0  # the mapping is alive (ins holds it)
    assert ins._debug_buffer is not None and ins._debug_buffer.size == GIB
    assert read < 64 << 20, f"read {read} bytes"
    assert mapped < 256 << 20, f"mapped in {mapped} bytes"
    assert len(got) == len(expected) > 0
    for a, b in zip(got["gap"], expected["gap"], strict=True):
        assert a == b
    for a, b in zip(got["runtime_intermediate_output"], expected["runtime_intermediate_output"], strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))
