"""Bounded dynamic shapes: memory planned at the upper bounds, every length within the bounds matches eager
PyTorch, out-of-bounds inputs are refused naming the dim, and debug runs log this run's actual shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgetorch.devtools.etdump import DebugBuffer, read_etdump
from edgetorch.errors import RuntimeInputError, UnsupportedOpError
from edgetorch.exir import to_edge
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime


class Attention(torch.nn.Module):
    """Sizes that depend on the sequence length through views, transposes, a causal mask and SDPA."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, d)
        return x + self.out(y), y.sum(-1)


@pytest.fixture(scope="module")
def attention():
    torch.manual_seed(0)
    model = Attention().eval()
    seq = torch.export.Dim("seq", min=2, max=24)
    ep = torch.export.export(model, (torch.randn(1, 8, 32),), dynamic_shapes=({1: seq},))
    et = to_edge(ep).to_executorch()
    return model, et


def test_every_length_within_the_bounds_matches_eager(attention):
    model, et = attention
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    for t in (2, 24, 5, 13, 2, 24):  # shrinking and growing again between calls
        x = torch.randn(1, t, 32)
        got = method.execute(x)
        with torch.no_grad():
            want = model(x)
        assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_memory_is_planned_at_the_upper_bound(attention):
    _, et = attention
    plan = et.program.plan("forward")
    (sym,) = plan.symbols
    assert (sym.min, sym.max, sym.input, sym.dim) == (2, 24, 0, 1)
    x = plan.values[plan.inputs[0]]
    assert x.sizes == [1, 24, 32] and x.nbytes == 24 * 32 * 4 and x.sym_shape
    meta = Runtime.get().load_program(et.buffer).load_method("forward").metadata
    assert meta.inputs[0].shape == (1, 24, 32) and meta.inputs[0].dynamic_dims == (1,)
    # the arena holds at least the largest live tensor at the bound: the (1, 24, 96) qkv projection
    assert plan.arena_size >= 24 * 96 * 4


def test_lengths_outside_the_bounds_are_refused_naming_the_dim(attention):
    _, et = attention
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    for t in (1, 25):
        pattern = rf"dynamic dim s\d+ \(x\.shape\[1\]\) is {t}, outside its bounds \[2, 24\]"
        with pytest.raises(RuntimeInputError, match=pattern):
            method.execute(torch.randn(1, t, 32))
    with pytest.raises(RuntimeInputError, match="input 'x' must have shape"):
        method.execute(torch.randn(1, 8, 31))


def test_a_dim_without_an_upper_bound_is_refused_at_emission():
    model = Attention().eval()
    ep = torch.export.export(model, (torch.randn(1, 8, 32),),
                             dynamic_shapes=({1: torch.export.Dim("seq", min=2)},))
    with pytest.raises(UnsupportedOpError, match=r"node 'x' \(input\).*dynamic shape \(1, s\d+, 32\) and s\d+ has "
                                                 r"no upper bound .*torch.export.Dim without max"):
        to_edge(ep)


def test_debug_runs_log_the_actual_shapes_of_each_run(attention, tmp_path):
    model, et = attention
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    method = prog.load_method("forward")
    xs = [torch.randn(1, t, 32) for t in (3, 11)]
    outs = [method.execute(x) for x in xs]
    prog.write_etdump_result_to_file(tmp_path / "d.etdp", tmp_path / "d.bin")
    dump = read_etdump(tmp_path / "d.etdp")
    runs = [r for r in dump.run_data if r.name == "Execute"]
    assert len(runs) == 2
    with DebugBuffer(tmp_path / "d.bin") as buf:
        buf.check(dump)
        for run, x, out in zip(runs, xs, outs):
            logged = [buf.value(e.debug_event.debug_entry) for e in run.events
                      if e.debug_event is not None and e.debug_event.debug_entry is not None]
            tensors = [t for t in logged if isinstance(t, torch.Tensor)]
            t = x.shape[1]
            assert any(tuple(v.shape) == (t, 96) for v in tensors)  # the qkv addmm of this run
            assert all(t in v.shape or v.dim() < 2 or v.shape[-1] in (32, 96, 8) for v in tensors)
            finals = [v for v in tensors if v.shape == out[0].shape and torch.equal(v, out[0])]
            assert finals, "the program output is logged with this run's shape"


def test_a_dynamic_program_output_is_logged_once_at_the_plan_figure(attention, tmp_path):
    """A program output written by an instruction is logged once (after it), its output event pointing at those
    bytes: the tracer reserves exactly the plan's figure (``run_debug_bytes``), a run at the upper bound stores
    exactly that, and the output events still read this run's values."""
    _, et = attention
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    method = prog.load_method("forward")
    plan = prog.plan("forward")
    assert prog.tracer.required_debug_buffer_bytes("forward") == plan.debug_buffer_bytes == pf.run_debug_bytes(plan)
    out = method.execute(torch.randn(1, 24, 32))  # the upper bound: every logged tensor at its planned size
    assert prog.tracer.sink.used_bytes == plan.debug_buffer_bytes
    prog.write_etdump_result_to_file(tmp_path / "d.etdp", tmp_path / "d.bin")
    run = [r for r in read_etdump(tmp_path / "d.etdp").run_data if r.name == "Execute"][0]
    outs = sorted((e.debug_event.output_index, e.debug_event.debug_entry) for e in run.events
                  if e.debug_event is not None and e.debug_event.debug_entry.output)
    assert [j for j, _ in outs] == list(range(len(out)))
    with DebugBuffer(tmp_path / "d.bin") as buf:
        for (_, entry), want in zip(outs, out):
            torch.testing.assert_close(buf.value(entry), want, rtol=0, atol=0)


def test_the_inspector_reads_a_dynamic_run_whose_outputs_share_their_instructions_bytes(tmp_path):
    """The Inspector accepts the output events that point at an instruction's bytes and matches every op the
    run logged, at a length other than the export's, with no gap (the runtime's fp32 kernels vs the reference's)."""
    import warnings

    from edgetorch.devtools import Inspector

    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(1, 11, 32)
    seq = torch.export.Dim("seq", min=2, max=24)
    et = to_edge(torch.export.export(model, (torch.randn(1, 8, 32),), dynamic_shapes=({1: seq},)),
                 generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs([(x,)])
    rec.save(tmp_path / "rec.bin")
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(x)
    prog.write_etdump_result_to_file(tmp_path / "r.etdp", tmp_path / "r.bin")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = Inspector(etdump_path=tmp_path / "r.etdp", etrecord=tmp_path / "rec.bin",
                       debug_buffer_path=tmp_path / "r.bin").calculate_numeric_gap("MSE")
    cov = df.attrs["coverage"]
    assert cov.runtime_matched == cov.runtime_total == len(df) > 0
    assert max(max(g) if isinstance(g, (list, tuple)) else g for g in df["gap"]) < 1e-10


def test_symbolic_sizes_refuse_bad_expressions():
    from edgetorch.errors import ProgramFormatError
    from edgetorch.formats import symexpr

    assert symexpr.evaluate(["+", ["*", ["s", 0], 4], ["//", ["s", 1], 2], ["max", 3, ["s", 0]]], [5, 7]) == 28
    assert symexpr.evaluate(["ceil/", ["s", 0], 4], [9]) == 3
    for bad in ('["s", 3]', '["exec", 1]', '["+"]', '"x"', '[1, 2]', '{"a": 1}', '["^", 2, 99]', 'true'):
        with pytest.raises(ProgramFormatError):
            symexpr.parse_expr(bad, 2, "test")
    assert pf.PROGRAM_SCHEMA_VERSION == 4


def test_a_symbolic_int_input_is_a_scalar_input_with_bounds():
    class Head(torch.nn.Module):
        def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
            torch._check(n >= 1)
            torch._check(n <= 8)
            return x[:n] * 2

    ep = torch.export.export(Head(), (torch.randn(8, 3), 5), dynamic_shapes=(None, torch.export.Dim.DYNAMIC))
    method = Runtime.get().load_program(to_edge(ep).to_executorch().buffer).load_method("forward")
    assert method.metadata.inputs[1].symbolic
    x = torch.randn(8, 3)
    for n in (1, 2, 8):
        (out,) = method.execute(x, n)
        assert torch.equal(out, x[:n] * 2)
    with pytest.raises(RuntimeInputError, match=r"dynamic dim s\d+ \(n\) is 9, outside its bounds \[1, 8\]"):
        method.execute(x, 9)
    with pytest.raises(RuntimeInputError, match="must be an int"):
        method.execute(x, 2.0)
