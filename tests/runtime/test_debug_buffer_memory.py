"""A fixed debug buffer costs resident memory only for the bytes runs write into it."""

from __future__ import annotations

import os

import pytest
import torch

from edgetorch.models import get_spec
from edgetorch.runtime import Runtime
from tests.conftest import lower

GIB = 1 << 30


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_a_1_gib_debug_buffer_is_not_resident_until_written():
    spec = get_spec("small_cnn")
    model, inputs = spec.build(), spec.example_inputs()["forward"]
    et = lower(model, inputs)
    before = _rss()
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size=GIB)
    out = program.load_method("forward").execute(*inputs)
    grew = _rss() - before
    used = program.tracer.sink.used_bytes
    assert used > 0
    # a populated buffer would add 1 GiB; what the run wrote plus the method's own arena is a few MiB
    assert grew < 128 << 20, f"resident memory grew {grew >> 20} MiB for {used} logged bytes"
    torch.testing.assert_close(out[0], model(*inputs), rtol=1e-5, atol=1e-5)
