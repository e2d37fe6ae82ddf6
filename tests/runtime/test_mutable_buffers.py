"""Mutable buffers: a KV-cache-style buffer updated in place lives in the loaded program across calls, is shared
by the methods naming it, is written in place by the op that updates it, and ``reset`` restores it.
A buffer whose initial bytes are all 0 is stored as no bytes (``MUTABLE_ZERO_INIT``) and allocated as zeros."""

from __future__ import annotations

import pytest
import torch

from edgetorch.exir import to_edge
from edgetorch.runtime import Runtime


class Cache(torch.nn.Module):
    """Writes k at ``pos`` of a static cache, then reads the whole cache (the attention pattern of a decoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, 16, 4))
        self.register_buffer("steps", torch.zeros(1))
        self.register_buffer("last", torch.zeros(1, dtype=torch.long))
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        k = self.proj(x).view(1, -1, 1, 4).expand(1, -1, 2, 4).transpose(1, 2)
        self.cache.index_copy_(2, pos, k)
        self.steps.add_(1)  # add.out writes the buffer in place too
        self.last.mul_(0).add_(pos[-1:])  # the new value's op does not take the buffer: stored by a copy
        return self.cache.sum(-1) * self.steps + self.last


def _export(model: torch.nn.Module, t: int | None) -> torch.export.ExportedProgram:
    x, pos = torch.randn(1, t or 3, 4), torch.arange(t or 3)
    dyn = None
    if t is None:
        seq = torch.export.Dim("seq", min=2, max=16)
        dyn = ({1: seq}, {0: seq})
    return torch.export.export(model, (x, pos), dynamic_shapes=dyn)


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    model = Cache().eval()
    eps = {"prefill": _export(model, None), "decode": _export(model, 1)}
    return model, to_edge(eps).to_executorch()


def _eager_sequence(model: Cache, calls: list) -> list[torch.Tensor]:
    ref = Cache().eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        return [ref(x, pos) for _, x, pos in calls]


def test_state_persists_across_calls_and_methods(program):
    model, et = program
    prog = Runtime.get().load_program(et.buffer)
    prefill, decode = prog.load_method("prefill"), prog.load_method("decode")
    calls = [("prefill", torch.randn(1, 5, 4), torch.arange(5))]
    calls += [("decode", torch.randn(1, 1, 4), torch.tensor([p])) for p in range(5, 9)]
    want = _eager_sequence(model, calls)
    for (name, x, pos), w in zip(calls, want):
        (got,) = (prefill if name == "prefill" else decode).execute(x, pos)
        torch.testing.assert_close(got, w, rtol=1e-6, atol=1e-6)
    assert set(prog.buffers) == {"cache", "steps", "last"}
    assert prog.buffers["steps"].item() == 5.0 and prog.buffers["last"].item() == 8
    assert set(decode.buffer_names) == {"cache", "steps", "last"}


def test_reset_restores_the_initial_values(program):
    model, et = program
    prog = Runtime.get().load_program(et.buffer)
    prefill = prog.load_method("prefill")
    x, pos = torch.randn(1, 4, 4), torch.arange(4)
    (first,) = prefill.execute(x, pos)
    (second,) = prefill.execute(x, pos)
    assert not torch.equal(first, second)  # steps went 1 -> 2
    prefill.reset()
    assert prog.buffers["cache"].abs().sum().item() == 0.0 and prog.buffers["steps"].item() == 0.0
    (again,) = prefill.execute(x, pos)
    assert torch.equal(again, first)
    # two loaded programs keep separate state
    other = Runtime.get().load_program(et.buffer)
    other.load_method("prefill").execute(x, pos)
    assert other.buffers["steps"].item() == 1.0 and prog.buffers["steps"].item() == 1.0


def test_updates_write_in_place_where_they_can_and_copy_otherwise(program):
    _, et = program
    plan = et.program.plan("decode")
    names = {mb.name: i for i, mb in enumerate(plan.mutable_buffers)}

    def writers(buffer: str) -> list[str]:
        vid = next(k for k, v in enumerate(plan.values) if getattr(v, "buffer_index", -1) == names[buffer])
        return [plan.operators[ins.call.op_index].name for ins in plan.instructions if vid in ins.call.outputs]

    assert writers("cache") == ["aten::index_put"]  # written straight into the cache: no copy of it
    assert writers("steps") == ["aten::add"]
    assert writers("last") == ["aten::copy"]  # computed from mul(last, 0): stored by a copy at the end


def test_state_is_logged_like_other_values(program, tmp_path):
    from edgetorch.devtools.etdump import DebugBuffer, read_etdump

    _, et = program
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    decode = prog.load_method("decode")
    decode.execute(torch.randn(1, 1, 4), torch.tensor([3]))
    snapshot = prog.buffers["cache"].clone()
    decode.execute(torch.randn(1, 1, 4), torch.tensor([4]))
    prog.write_etdump_result_to_file(tmp_path / "s.etdp", tmp_path / "s.bin")
    dump = read_etdump(tmp_path / "s.etdp")
    runs = [r for r in dump.run_data if r.name == "Execute"]
    with DebugBuffer(tmp_path / "s.bin") as buf:
        logged = [buf.value(e.debug_event.debug_entry) for e in runs[0].events
                  if e.debug_event is not None and e.debug_event.name == "index_put"]
    assert len(logged) == 1 and torch.equal(logged[0], snapshot)  # the first run's cache, not the second's


class Seeded(torch.nn.Module):
    """A zero cache (no bytes in the file), a non-zero buffer and a -0.0 one (bytes not all 0: stored)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(n, 4))
        self.register_buffer("gain", torch.full((4,), 2.0))
        self.register_buffer("neg", torch.full((4,), -0.0))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, pos, x)
        self.gain.mul_(1.5)
        self.neg.add_(x[0])
        return self.cache.sum(0) * self.gain + 1.0 / self.neg


def test_zero_buffers_store_no_bytes_and_start_and_reset_as_zeros():
    from edgetorch.formats import program as pf

    x, pos = torch.randn(1, 4), torch.tensor([2])
    small, big = (to_edge(torch.export.export(Seeded(n), (x, pos))).to_executorch() for n in (16, 16 + 4096))
    assert len(big.buffer) - len(small.buffer) < 1024  # 64 KiB more cache, not 64 KiB more file
    mbs = {mb.name: mb for mb in big.program.plans[0].mutable_buffers}
    assert mbs["cache"].constant_index == pf.MUTABLE_ZERO_INIT
    assert mbs["gain"].constant_index >= 0 and mbs["neg"].constant_index >= 0  # -0.0: its bytes are not all 0
    prog = Runtime.get().load_program(big.buffer)
    m = prog.load_method("forward")
    ref = Seeded(16 + 4096)
    for _ in range(2):
        for p in (2, 7):
            xi, pi = torch.randn(1, 4), torch.tensor([p])
            with torch.no_grad():
                want = ref(xi, pi)
            torch.testing.assert_close(m.execute(xi, pi)[0], want, rtol=0, atol=0)
        assert torch.equal(prog.buffers["cache"], ref.cache)
        prog.reset()
        ref = Seeded(16 + 4096)
        assert prog.buffers["cache"].count_nonzero().item() == 0 and prog.buffers["gain"].eq(2.0).all()
        assert torch.equal(prog.buffers["neg"].view(torch.int32), torch.full((4,), -0.0).view(torch.int32))
