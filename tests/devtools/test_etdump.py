"""devtools.etdump: reading .etdp files and zero-copy, bounds-checked tensors from the debug buffer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgetorch.devtools.etdump import DebugBuffer, read_etdump
from edgetorch.errors import ETDumpFormatError
from edgetorch.exir import to_edge
from edgetorch.formats import etdump as ed
from edgetorch.formats.dtypes import DTYPE_TO_CODE
from edgetorch.runtime import Runtime


class Mixed(nn.Module):
    """Linear in float16, then LayerNorm in bfloat16: one program logs tensors of both half types."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16).half()
        self.norm = nn.LayerNorm(16).to(torch.bfloat16)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return h, self.norm(h.to(torch.bfloat16))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A program run twice with a debug buffer; returns (dir, returned outputs, model, inputs)."""
    torch.manual_seed(0)
    model = Mixed().eval()
    xs = [torch.randn(3, 8, dtype=torch.float16) for _ in range(2)]
    et = to_edge(torch.export.export(model, (xs[0],))).to_executorch()
    p = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    m = p.load_method("forward")
    outs = [m.execute_structured(x) for x in xs]
    d = tmp_path_factory.mktemp("etdump")
    p.write_etdump_result_to_file(d / "run.etdp", d / "run.bin")
    return d, outs, model, xs


def _program_outputs(etdump: ed.ETDump) -> list[ed.Value]:
    return [e.debug_event.debug_entry for r in etdump.run_data for e in r.events
            if e.debug_event is not None and e.debug_event.debug_entry.output]


def test_program_outputs_read_back_bit_identical(recorded):
    d, outs, model, xs = recorded
    etdump = read_etdump(d / "run.etdp")
    with DebugBuffer(d / "run.bin") as buf:
        buf.check(etdump)
        got = [buf.value(v) for v in _program_outputs(etdump)]
    want = [t for out in outs for t in out]
    assert [t.dtype for t in got] == [torch.float16, torch.bfloat16] * 2
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    for g, x in zip(got[1::2], xs):
        torch.testing.assert_close(g, model(x)[1].detach(), rtol=2e-2, atol=2e-2)


def test_tensors_are_zero_copy_views_and_the_file_is_never_written(recorded):
    d, _, _, _ = recorded
    etdump = read_etdump(d / "run.etdp")
    before = (d / "run.bin").read_bytes()
    buf = DebugBuffer(d / "run.bin")
    v = _program_outputs(etdump)[0]
    a, b = buf.value(v), buf.value(v)
    assert a.data_ptr() == b.data_ptr()
    a.add_(1)  # copy-on-write mapping: visible through every view, never reaches the file
    assert torch.equal(a, b)
    assert (d / "run.bin").read_bytes() == before
    buf.close()
    with pytest.raises(ValueError, match="closed"):
        buf.value(v)


def test_a_truncated_debug_buffer_gives_a_clear_error(recorded, tmp_path):
    d, _, _, _ = recorded
    etdump = read_etdump(d / "run.etdp")
    data = (d / "run.bin").read_bytes()
    short = tmp_path / "short.bin"
    short.write_bytes(data[:len(data) // 2])
    buf = DebugBuffer(short)
    with pytest.raises(ETDumpFormatError, match=f"recorded with {len(data) - ed.TRAILER_SIZE}") as ei:
        buf.check(etdump)
    assert ei.value.field == "debug_buffer_bytes" and ei.value.path == str(short)
    last = _program_outputs(etdump)[-1].tensor
    with pytest.raises(ETDumpFormatError, match=r"lie beyond the end of the debug buffer \(\d+ bytes\)") as ei:
        buf.tensor(last, "last output")
    assert "last output" in str(ei.value) and f"[{last.offset}, {last.offset + last.nbytes})" in str(ei.value)
    assert ei.value.field == "tensor.offset"


def test_check_finds_a_tensor_beyond_the_buffer_even_when_the_size_field_is_fine():
    t = ed.Tensor(DTYPE_TO_CODE[torch.float32], [4], [1], 64, 16)
    etdump = ed.ETDump(run_data=[ed.RunData("Execute", events=[ed.Event(debug_event=ed.DebugEvent(
        0, 5, debug_entry=ed.Value(ed.ValueType.Tensor, tensor=t), output_index=1))])])
    with pytest.raises(ETDumpFormatError, match=r"instruction 5, output 1\): bytes \[64, 80\)") as ei:
        DebugBuffer(bytes(70)).check(etdump)
    assert ei.value.field == "run_data[0].events[0].debug_event.debug_entry.tensor.offset"
    DebugBuffer(bytes(80)).check(etdump)


def test_buffer_from_bytes_and_every_value_type():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    raw = bytes(64) + x.numpy().tobytes()
    buf = DebugBuffer(raw)
    assert buf.size == len(raw) and buf.path is None
    t = ed.Tensor(DTYPE_TO_CODE[torch.float32], [2, 3], [3, 1], 64, 24)
    assert torch.equal(buf.tensor(t), x)
    # a stored non-contiguous layout is honoured
    tt = ed.Tensor(t.scalar_type, [3, 2], [1, 3], 64, 24)
    assert torch.equal(buf.tensor(tt), x.t())
    V = ed.ValueType
    assert [buf.value(v) for v in [ed.Value(V.Int, int_value=3), ed.Value(V.Bool, bool_value=True),
                                   ed.Value(V.Float, float_value=0.5), ed.Value(V.Double, double_value=0.25),
                                   ed.Value(V.String, string_value="s"), ed.Value(V.Null)]] == \
        [3, True, 0.5, 0.25, "s", None]
    lst = buf.value(ed.Value(V.TensorList, tensor_list=[t, t]))
    assert len(lst) == 2 and all(torch.equal(a, x) for a in lst)


@pytest.mark.parametrize("tensor,msg", [
    (ed.Tensor(6, [4], [1], -1, 16), "not stored"),
    (ed.Tensor(6, [4], [1], 0, 15), "nbytes is 15"),
    (ed.Tensor(42, [4], [1], 0, 16), "unknown scalar type"),
    (ed.Tensor(6, [2, 2], [4, 4], 0, 16), "strides"),
])
def test_bad_tensor_records_raise(tensor, msg):
    with pytest.raises(ETDumpFormatError, match=msg):
        DebugBuffer(bytes(256)).tensor(tensor)


def test_empty_tensors_need_no_bytes():
    t = ed.Tensor(DTYPE_TO_CODE[torch.bfloat16], [3, 0], [1, 1], -1, 0)
    got = DebugBuffer(b"").tensor(t)
    assert got.shape == (3, 0) and got.dtype == torch.bfloat16


def test_empty_debug_buffer_file(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    buf = DebugBuffer(tmp_path / "e.bin")
    assert buf.size == 0
    with pytest.raises(ETDumpFormatError, match="beyond the end"):
        buf.tensor(ed.Tensor(6, [1], [1], 0, 4))


def test_read_etdump_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="ETDump file not found"):
        read_etdump(tmp_path / "missing.etdp")
    with pytest.raises(FileNotFoundError, match="debug buffer file not found"):
        DebugBuffer(tmp_path / "missing.bin")
    bad = tmp_path / "bad.etdp"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ETDumpFormatError, match="bad.etdp") as ei:
        read_etdump(bad)
    assert ei.value.path == str(bad)


def _mapped_rss_kib(path) -> int | None:
    """Resident KiB of this process's mappings of ``path`` (Linux ``/proc/self/smaps``), None elsewhere."""
    try:
        lines = open("/proc/self/smaps", encoding="utf-8").read().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
            inside = len(head) >= 6 and head[-1] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def test_crc_check_reads_the_file_in_chunks_not_through_the_mapping(recorded, monkeypatch):
    import edgetorch.devtools.etdump.debug_buffer as dbm
    d, _, _, _ = recorded
    etdump = read_etdump(d / "run.etdp")
    monkeypatch.setattr(dbm, "_CRC_CHUNK", 7)  # many chunks, the last one partial
    buf = DebugBuffer(d / "run.bin")
    import zlib
    assert buf._crc32(buf.size) == zlib.crc32((d / "run.bin").read_bytes()[:buf.size])
    buf.check_identity(etdump)  # the chunked CRC agrees with the trailer's
    buf.close()


def test_checking_and_releasing_a_large_buffer_keeps_its_pages_out_of_this_process(tmp_path):
    import mmap
    import zlib
    size = 32 << 20
    data = bytes(range(256)) * (size // 256)
    p = tmp_path / "big.bin"
    p.write_bytes(data)
    buf = DebugBuffer(p)
    if _mapped_rss_kib(p) is None or not hasattr(mmap, "MADV_DONTNEED"):
        pytest.skip("needs Linux /proc/self/smaps and madvise")
    assert buf._crc32(size) == zlib.crc32(data)
    assert _mapped_rss_kib(p) < 4096  # the CRC did not fault the 32 MiB mapping in (the trailer read may)
    t = buf.tensor(ed.Tensor(scalar_type=DTYPE_TO_CODE[torch.uint8], sizes=[size], strides=[], offset=0,
                             nbytes=size))
    want = int(t.sum())
    assert _mapped_rss_kib(p) >= 30 << 10  # summing touched every page
    buf.release_pages()
    assert _mapped_rss_kib(p) < 4096
    assert int(t.sum()) == want == sum(range(256)) * (size // 256)  # read back from the file, same bytes
