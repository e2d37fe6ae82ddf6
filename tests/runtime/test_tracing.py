"""ProgramTracer: ETDump blocks and events, intermediates bit-identical to eager op-by-op execution, the three
debug-buffer sinks, overflow, delegate events, and tracing never changing results."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn
from torch.export.graph_signature import InputKind

from edgetorch.devtools.etdump import DebugBuffer, read_etdump
from edgetorch.errors import DebugBufferOverflowError, EdgeTorchError, KernelError
from edgetorch.exir import to_edge, to_edge_transform_and_lower
from edgetorch.formats import etdump as ed
from edgetorch.runtime import Runtime, tracing
from edgetorch.runtime.backend_registry import register_backend
from edgetorch.runtime.tracing import BufferSink, FileSink
from tests.exir.nested_backend import ADD_MUL, NestedBackend, NestedRuntime, OpTypePartitioner


class Net(nn.Module):
    """Linear + ReLU + LayerNorm, a second Linear whose output is returned transposed (a VIEW output), an
    empty output and a bool output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        h = self.norm(torch.relu(self.fc(x)))
        return self.fc2(h).transpose(0, 1), h[:, :0] * 2, h.sum(-1) > 0


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


class Compiled:
    def __init__(self, dtype: torch.dtype) -> None:
        torch.manual_seed(0)
        self.model = Net().to(dtype).eval()
        self.inputs = [torch.randn(4, 16, dtype=dtype) for _ in range(3)]
        self.epm = to_edge(torch.export.export(self.model, (self.inputs[0],)))
        self.et = self.epm.to_executorch()
        self.plain = [Runtime.get().load_program(self.et.buffer).load_method("forward").execute_structured(x)
                      for x in self.inputs]

    def load(self, **kw):
        p = Runtime.get().load_program(self.et.buffer, **kw)
        return p, p.load_method("forward")


@pytest.fixture(scope="module", params=DTYPES, ids=["fp32", "fp16", "bf16"])
def net(request) -> Compiled:
    return _compiled(request.param)


_CACHE: dict[torch.dtype, Compiled] = {}


def _compiled(dtype: torch.dtype) -> Compiled:
    if dtype not in _CACHE:
        _CACHE[dtype] = Compiled(dtype)
    return _CACHE[dtype]


def eager_node_outputs(ep, *inputs) -> dict:
    """Runs the edge graph node by node with the eager (functional) kernels; returns outputs by node name."""
    args, user = [], iter(inputs)
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        elif spec.target in ep.state_dict:
            args.append(ep.state_dict[spec.target])
        else:
            args.append(ep.constants[spec.target])
    outs = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            r = super().run_node(n)
            outs[n.name] = r
            return r

    with torch.no_grad():
        Recorder(ep.graph_module).run(*args)
    return outs


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def assert_same_outputs(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert same_bits(g, w)


def execute_blocks(etdump: ed.ETDump) -> list[ed.RunData]:
    return [r for r in etdump.run_data if r.name == ed.EXECUTE_BLOCK]


# -- results are unchanged --------------------------------------------------------------------------------

@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "thread"])
@pytest.mark.parametrize("mode", ["profile", "auto", "fixed", "file"])
def test_tracing_does_not_change_outputs(net, mode, threaded, tmp_path, monkeypatch):
    if threaded:
        monkeypatch.setattr(tracing, "ASYNC_MIN_BYTES", 0)
    kw = {"profile": dict(enable_etdump=True), "auto": dict(debug_buffer_size="auto"),
          "fixed": dict(enable_etdump=True, debug_buffer_size=1 << 20),
          "file": dict(enable_etdump=True, debug_buffer_path=tmp_path / "stream.bin")}[mode]
    p, m = net.load(**kw)
    for x, want in zip(net.inputs, net.plain):
        assert_same_outputs(m.execute_structured(x), want)
    p.tracer.close()


# -- blocks and profile events ----------------------------------------------------------------------------

def test_one_block_per_execute_and_one_profile_event_per_non_view_instruction(tmp_path):
    net = _compiled(torch.float32)
    p, m = net.load(enable_etdump=True)
    for x in net.inputs:
        m.execute(x)
    p.write_etdump_result_to_file(tmp_path / "a.etdp")
    d = read_etdump(tmp_path / "a.etdp")
    assert d.program_hash == p.content_hash and d.debug_buffer_bytes == 0
    load = d.run_data[0]
    assert (load.name, load.method) == (ed.LOAD_BLOCK, "forward")
    (init,), (lm,) = ([e.profile_event for e in load.events if e.profile_event.name == n]
                      for n in (ed.METHOD_INIT, ed.PROGRAM_LOAD_METHOD))
    assert lm.start_time <= init.start_time <= init.end_time <= lm.end_time
    runs = execute_blocks(d)
    assert len(runs) == len(net.inputs) == len(d.run_data) - 1
    non_view = [i for i in m.instructions if i.kind != "VIEW"]
    assert len(non_view) < len(m.instructions)  # the model has VIEW instructions, which record nothing
    for run in runs:
        assert run.method == "forward" and run.bundled_input_index == -1
        assert all(e.debug_event is None for e in run.events)  # no debug buffer: profiling only
        prof = [e.profile_event for e in run.events]
        ins = [e for e in prof if e.instruction_id >= 0]
        assert [e.instruction_id for e in ins] == [i.index for i in non_view]
        assert [e.name for e in ins] == [i.name for i in non_view]
        assert all(e.chain_index == 0 and e.start_time <= e.end_time for e in ins)
        assert all(a.end_time <= b.start_time for a, b in zip(ins, ins[1:]))
        ex = prof[-1]
        assert (ex.name, ex.instruction_id, ex.chain_index) == (ed.METHOD_EXECUTE, -1, -1)
        assert ex.start_time <= ins[0].start_time and ins[-1].end_time <= ex.end_time
    assert runs[0].events[-1].profile_event.end_time <= runs[1].events[0].profile_event.start_time


# -- intermediates ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "thread"])
def test_debug_tensors_are_bit_identical_to_eager_op_by_op(net, threaded, tmp_path, monkeypatch):
    if threaded:
        monkeypatch.setattr(tracing, "ASYNC_MIN_BYTES", 0)
    p, m = net.load(enable_etdump=True, debug_buffer_size="auto")
    outs = [m.execute_structured(x) for x in net.inputs]
    p.write_etdump_result_to_file(tmp_path / "a.etdp", tmp_path / "a.bin")
    d = read_etdump(tmp_path / "a.etdp")
    buf = DebugBuffer(tmp_path / "a.bin")
    buf.check(d)
    assert buf.size == d.debug_buffer_bytes == p.tracer.sink.used_bytes
    runs = execute_blocks(d)
    assert len(runs) == len(net.inputs)
    expected_keys = [(i.index, j) for i in m.instructions if i.kind != "VIEW" for j in range(len(i.outputs))]
    for run, x, out in zip(runs, net.inputs, outs):
        ref = eager_node_outputs(net.epm.exported_program(), x)
        debug = [e.debug_event for e in run.events if e.debug_event is not None]
        inner = [e for e in debug if e.instruction_id >= 0]
        assert [(e.instruction_id, e.output_index) for e in inner] == expected_keys
        for e in inner:
            want = ref[e.name]
            want = want[e.output_index] if isinstance(want, (tuple, list)) else want
            t = e.debug_entry.tensor
            assert t.strides == list(want.contiguous().stride())
            assert same_bits(buf.value(e.debug_entry), want), (e.name, e.output_index)
            assert not e.debug_entry.output
        prog = [e for e in debug if e.debug_entry.output]
        assert [e.output_index for e in prog] == [0, 1, 2]
        assert all(e.instruction_id == -1 and e.chain_index == -1 for e in prog)
        assert_same_outputs([buf.value(e.debug_entry) for e in prog], out)
        empty = prog[1].debug_entry.tensor
        assert (empty.offset, empty.nbytes, empty.sizes) == (-1, 0, [4, 0])
    assert {e.debug_event.debug_entry.tensor.dtype for run in runs for e in run.events
            if e.debug_event is not None} == {net.inputs[0].dtype, torch.bool}
    buf.close()


def test_required_bytes_match_the_plan_and_the_buffer(tmp_path):
    net = _compiled(torch.float32)
    p, m = net.load(debug_buffer_size="auto")
    need = p.tracer.required_debug_buffer_bytes("forward")
    # plan.debug_buffer_bytes (written by emission) is what the tracer reserves: every instruction output, the
    # transposed program output (a VIEW) and the inputs (logged first in every run)
    view_out = m.plan.values[m.plan.outputs[0]]
    extra = (view_out.nbytes + 63) // 64 * 64
    inputs = sum((m.plan.values[v].nbytes + 63) // 64 * 64 for v in m.plan.inputs)
    assert inputs > 0 and extra > 0 and need > extra + inputs
    assert need == m.plan.debug_buffer_bytes
    assert need % 64 == 0
    for i, x in enumerate(net.inputs, 1):
        m.execute(x)
        assert p.tracer.sink.used_bytes == i * need
    offsets = [e.debug_event.debug_entry.tensor.offset for e in p.tracer.etdump().run_data[1].events
               if e.debug_event is not None and e.debug_event.debug_entry.tensor.offset >= 0]
    assert offsets[0] == 0 and all(o % 64 == 0 for o in offsets)


def test_file_sink_streams_the_same_bytes_as_the_memory_sink(tmp_path):
    net = _compiled(torch.bfloat16)
    stream = tmp_path / "stream.bin"
    pf_, mf = net.load(enable_etdump=True, debug_buffer_path=stream)
    pa, ma = net.load(debug_buffer_size="auto")
    for x in net.inputs:
        mf.execute(x)
        ma.execute(x)
    assert isinstance(pf_.tracer.sink, FileSink) and pf_.tracer.sink.path == str(stream)
    assert pa.tracer.sink.path is None  # "auto": an anonymous in-memory stream
    pf_.write_etdump_result_to_file(tmp_path / "f.etdp")  # the stream is the buffer: no copy needed
    pf_.write_etdump_result_to_file(tmp_path / "g.etdp", tmp_path / "copy.bin")
    pa.write_etdump_result_to_file(tmp_path / "a.etdp", tmp_path / "a.bin")
    data = (tmp_path / "a.bin").read_bytes()[:-ed.TRAILER_SIZE]  # the trailers name different recordings
    assert stream.read_bytes() == (tmp_path / "copy.bin").read_bytes()
    assert stream.read_bytes()[:-ed.TRAILER_SIZE] == data
    f, a = read_etdump(tmp_path / "f.etdp"), read_etdump(tmp_path / "a.etdp")
    assert f.debug_buffer_bytes == a.debug_buffer_bytes == len(data)

    def values(d):
        return [e.debug_event for r in d.run_data for e in r.events if e.debug_event is not None]
    assert values(f) == values(a)
    pf_.tracer.close()


def test_fixed_buffer_holds_exact_runs_then_overflows_with_the_needed_size(tmp_path):
    net = _compiled(torch.float32)
    probe, _ = net.load(debug_buffer_size="auto")
    need = probe.tracer.required_debug_buffer_bytes("forward")
    p, m = net.load(enable_etdump=True, debug_buffer_size=2 * need)
    assert isinstance(p.tracer.sink, BufferSink)
    m.execute(net.inputs[0])
    m.execute(net.inputs[1])
    with pytest.raises(DebugBufferOverflowError, match=f"at least {3 * need} bytes") as ei:
        m.execute(net.inputs[2])
    assert ei.value.needed_bytes == 3 * need and ei.value.capacity == 2 * need
    assert f"stores {need} bytes" in str(ei.value)
    assert p.tracer.num_runs == 2 and p.tracer.sink.used_bytes == 2 * need  # nothing partial was kept
    p.write_etdump_result_to_file(tmp_path / "a.etdp", tmp_path / "a.bin")
    assert len(execute_blocks(read_etdump(tmp_path / "a.etdp"))) == 2
    assert os.path.getsize(tmp_path / "a.bin") == 2 * need + ed.TRAILER_SIZE  # the used prefix and the trailer

    p2, m2 = net.load(debug_buffer_size=need - 64)
    with pytest.raises(DebugBufferOverflowError, match=f"at least {need} bytes"):
        m2.execute(net.inputs[0])
    assert p2.tracer.sink.used_bytes == 0 and p2.tracer.num_runs == 0


def test_file_sink_with_a_size_limit_overflows_too(tmp_path):
    net = _compiled(torch.float32)
    probe, _ = net.load(debug_buffer_size="auto")
    need = probe.tracer.required_debug_buffer_bytes("forward")
    p, m = net.load(debug_buffer_size=need, debug_buffer_path=tmp_path / "s.bin")
    m.execute(net.inputs[0])
    with pytest.raises(DebugBufferOverflowError, match=f"at least {2 * need} bytes"):
        m.execute(net.inputs[1])
    p.tracer.close()
    assert os.path.getsize(tmp_path / "s.bin") == need


def test_in_memory_buffer_needs_a_debug_buffer_path_to_write(tmp_path):
    net = _compiled(torch.float32)
    p, m = net.load(debug_buffer_size="auto")
    m.execute(net.inputs[0])
    with pytest.raises(EdgeTorchError, match="pass debug_buffer_path"):
        p.write_etdump_result_to_file(tmp_path / "a.etdp")
    assert not (tmp_path / "a.etdp").exists()


@pytest.mark.parametrize("size", [-1, -5, "big", True, 1.5, 1 << 50])
def test_invalid_debug_buffer_size(size):
    from edgetorch.errors import DebugBufferConfigError

    with pytest.raises(DebugBufferConfigError, match="debug_buffer_size"):
        _compiled(torch.float32).load(debug_buffer_size=size)


def test_bundled_input_index_and_clear(tmp_path):
    net = _compiled(torch.float32)
    p, m = net.load(debug_buffer_size="auto")
    p.tracer.set_bundled_input_index(3)
    m.execute(net.inputs[0])
    p.tracer.set_bundled_input_index(-1)
    m.execute(net.inputs[1])
    assert [r.bundled_input_index for r in execute_blocks(p.tracer.etdump())] == [3, -1]
    p.tracer.clear()
    assert p.tracer.etdump().run_data == [] and p.tracer.sink.used_bytes == 0
    m.execute(net.inputs[2])
    run = p.tracer.etdump().run_data[0]
    assert min(e.debug_event.debug_entry.tensor.offset for e in run.events
               if e.debug_event is not None and e.debug_event.debug_entry.tensor.nbytes) == 0


# -- delegates --------------------------------------------------------------------------------------------

TRACING_BACKEND = "etdump_test_tracing"


class _TracingBackend(NestedBackend):
    backend_id = TRACING_BACKEND


class _TracingRuntime(NestedRuntime):
    """Runs the partition, logging inner events through the tracer the runtime hands it."""

    name = TRACING_BACKEND
    fail = False

    def __init__(self) -> None:
        self.observed: list[tuple[object, object]] = []  # (handle, observer) of each observe call

    def observe(self, handle, observer):
        self.observed.append((handle, observer))

    def execute(self, handle, inputs, outputs, tracer=None):
        if self.fail:
            raise RuntimeError("backend failure requested by the test")
        t0 = time.perf_counter_ns()
        res = handle.execute(*inputs)
        res = res if isinstance(res, (list, tuple)) else [res]
        if tracer is not None:
            tracer.log_delegate_profile(0, t0, time.perf_counter_ns(), b"\x01meta")
            tracer.log_delegate_profile("fused_add_mul", t0, t0 + 5)
            tracer.log_delegate_output(0, res[0])
            tracer.log_delegate_output("fused_add_mul", 7)
        for o, r in zip(outputs, res):
            o.copy_(r)


class _TracingPartitioner(OpTypePartitioner):
    def partition(self, exported_program):
        from edgetorch.exir.backend import CompileSpec, DelegationSpec

        res = super().partition(exported_program)
        for tag in res.partition_tags:
            res.partition_tags[tag] = DelegationSpec(TRACING_BACKEND, [CompileSpec("marker", b"ok")])
        return res


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc((x + 1) * 2)


_BACKEND = _TracingRuntime()


@pytest.fixture(scope="module")
def delegated():
    """A program whose (x + 1) * 2 runs in the test backend; returns (program bytes, input)."""
    from edgetorch.exir.backend import register_backend_details

    register_backend_details(_TracingBackend)
    register_backend(_BACKEND)
    torch.manual_seed(0)
    model, x = Mixed().eval(), torch.randn(2, 8)
    et = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                     partitioner=[_TracingPartitioner(ADD_MUL)]).to_executorch()
    return et.buffer, x


def test_delegate_events_attach_to_the_delegate_call(delegated, tmp_path):
    data, x = delegated
    p = Runtime.get().load_program(data, enable_etdump=True, debug_buffer_size="auto")
    m = p.load_method("forward")
    (call,) = [i for i in m.instructions if i.kind == "DELEGATE"]
    assert call.name == ed.DELEGATE_CALL and call.delegate_backend == TRACING_BACKEND
    out = m.execute_structured(x)
    assert same_bits(out, Runtime.get().load_program(data).load_method("forward").execute_structured(x))
    with pytest.raises(EdgeTorchError, match="DELEGATE_CALL"):
        p.tracer.log_delegate_profile(0, 0, 1)
    with pytest.raises(EdgeTorchError, match="delegate_output_buffer may only be called .* DELEGATE_CALL"):
        p.tracer.delegate_output_buffer([2, 8], torch.float32)
    p.write_etdump_result_to_file(tmp_path / "d.etdp", tmp_path / "d.bin")
    (run,) = execute_blocks(read_etdump(tmp_path / "d.etdp"))
    buf = DebugBuffer(tmp_path / "d.bin")
    mine = [e for e in run.events if (e.profile_event or e.debug_event).instruction_id == call.index]
    prof = [e.profile_event for e in mine if e.profile_event is not None]
    assert [(e.name, e.delegate_debug_id_int, e.delegate_debug_id_str) for e in prof] == [
        (ed.DELEGATE_CALL, -1, ""), ("0", 0, ""), ("fused_add_mul", -1, "fused_add_mul")]
    assert prof[1].delegate_debug_metadata == b"\x01meta" and prof[2].end_time - prof[2].start_time == 5
    assert prof[0].start_time <= prof[1].start_time <= prof[1].end_time <= prof[0].end_time
    dbg = [e.debug_event for e in mine if e.debug_event is not None]
    by_id = {(d.delegate_debug_id_int, d.delegate_debug_id_str): d for d in dbg}
    inner = buf.value(by_id[(0, "")].debug_entry)
    assert by_id[(-1, "fused_add_mul")].debug_entry.int_value == 7
    call_out = buf.value(by_id[(-1, "")].debug_entry)  # the DELEGATE_CALL's own output
    assert same_bits(inner, call_out) and same_bits(call_out, (x + 1) * 2)


def test_a_backend_is_told_when_an_observer_attaches_before_any_run(delegated):
    data, x = delegated
    _BACKEND.observed.clear()
    Runtime.get().load_program(data).load_method("forward").execute(x)
    assert _BACKEND.observed == []  # plain programs: no observer, no call
    p = Runtime.get().load_program(data, enable_etdump=True)
    m = p.load_method("forward")
    ((handle, observer),) = _BACKEND.observed
    (call,) = [i for i in m.instructions if i.kind == "DELEGATE"]
    assert handle is m.delegate_handle(call.index) and observer is p.tracer
    m.observer = None  # detached: told too
    assert _BACKEND.observed[-1] == (handle, None)


@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "thread"])
@pytest.mark.parametrize("sink", ["auto", "fixed", "file"])
def test_a_failed_run_leaves_no_events_and_no_bytes(delegated, sink, threaded, tmp_path, monkeypatch):
    if threaded:
        monkeypatch.setattr(tracing, "ASYNC_MIN_BYTES", 0)
    data, x = delegated
    kw = {"auto": dict(debug_buffer_size="auto"), "fixed": dict(debug_buffer_size=1 << 16),
          "file": dict(debug_buffer_path=tmp_path / "s.bin")}[sink]
    p = Runtime.get().load_program(data, enable_etdump=True, **kw)
    m = p.load_method("forward")
    m.execute(x)
    used = p.tracer.sink.used_bytes
    good = p.tracer.etdump()
    _BACKEND.fail = True
    try:
        with pytest.raises(KernelError, match="backend failure"):
            m.execute(x)
    finally:
        _BACKEND.fail = False
    assert p.tracer.num_runs == 1 and p.tracer.sink.used_bytes == used
    assert p.tracer.etdump() == good
    m.execute(x)  # the next run continues right after the first
    p.write_etdump_result_to_file(tmp_path / "a.etdp", tmp_path / "a.bin")
    d = read_etdump(tmp_path / "a.etdp")
    buf = DebugBuffer(tmp_path / "a.bin")
    buf.check(d)
    assert buf.size == 2 * used
    r1, r2 = execute_blocks(d)
    for a, b in zip(r1.events, r2.events):
        if a.debug_event is not None and a.debug_event.debug_entry.val == ed.ValueType.Tensor:
            assert b.debug_event.debug_entry.tensor.offset in (-1, a.debug_event.debug_entry.tensor.offset + used)
            assert same_bits(buf.value(a.debug_event.debug_entry), buf.value(b.debug_event.debug_entry))
    p.tracer.close()


@pytest.fixture
def writer_thread(monkeypatch):
    """Makes every run copy its intermediates on a writer thread (small runs copy inline by default)."""
    monkeypatch.setattr(tracing, "ASYNC_MIN_BYTES", 0)


@pytest.mark.parametrize("sink", ["auto", "file"])
def test_a_slow_writer_still_copies_every_tensor_before_the_arena_reuses_it(sink, tmp_path, writer_thread):
    """The writer thread lags behind the kernels; the run must wait for it exactly where an instruction would
    overwrite arena bytes not yet copied, so every intermediate is still bit-identical to eager."""
    net = _compiled(torch.float32)
    kw = dict(debug_buffer_size="auto") if sink == "auto" else dict(debug_buffer_path=tmp_path / "s.bin")
    p, m = net.load(**kw)
    mt = p.tracer._traces["forward"]
    assert any(step.wait_for for step in mt.steps)  # this program reuses arena memory while tensors are logged
    fast_put = p.tracer.sink.put

    def slow_put(off, addr, data):
        time.sleep(0.002)
        fast_put(off, addr, data)
    p.tracer.sink.put = slow_put
    for x in net.inputs[:2]:
        m.execute(x)
    p.write_etdump_result_to_file(tmp_path / "a.etdp", tmp_path / "a.bin")
    buf = DebugBuffer(tmp_path / "a.bin")
    for run, x in zip(execute_blocks(read_etdump(tmp_path / "a.etdp")), net.inputs):
        ref = eager_node_outputs(net.epm.exported_program(), x)
        for e in run.events:
            d = e.debug_event
            if d is not None and d.instruction_id >= 0:
                want = ref[d.name]
                want = want[d.output_index] if isinstance(want, (tuple, list)) else want
                assert same_bits(buf.value(d.debug_entry), want), d.name
    p.tracer.close()


def test_buffer_sink_padding_reads_as_zeros_after_a_rewind():
    sink = BufferSink(1024)
    payload = torch.full((40,), 0xAB, dtype=torch.uint8)
    off = sink.alloc(40)
    sink.put(off, payload.data_ptr(), memoryview(payload.numpy()))
    sink.rollback(0)  # a rewind leaves the old bytes in place ...
    small = torch.full((3,), 7, dtype=torch.uint8)
    off = sink.alloc(3)
    sink.put(off, small.data_ptr(), memoryview(small.numpy()))
    data = bytes(sink.getvalue())
    assert off == 0 and len(data) == ed.DEBUG_BUFFER_ALIGNMENT
    assert data[:3] == bytes([7, 7, 7]) and data[3:] == bytes(len(data) - 3)  # ... but the padding is zeroed


def test_a_delegate_logging_past_a_fixed_buffer_fails_with_the_size_needed_and_leaves_nothing(delegated):
    """Delegate values are only known during the run: one that overflows a fixed buffer mid-run raises
    DebugBufferOverflowError itself (not a KernelError) and the run is rolled back."""
    data, x = delegated
    p = Runtime.get().load_program(data, enable_etdump=True, debug_buffer_size=1 << 16)
    m = p.load_method("forward")
    m.execute(x)
    used = p.tracer.sink.used_bytes
    real = _BACKEND.execute

    def big(handle, inputs, outputs, tracer=None):
        real(handle, inputs, outputs, tracer)
        if tracer is not None:
            tracer.log_delegate_output("big", torch.zeros(1 << 15))  # 128 KiB: more than the buffer holds

    _BACKEND.execute = big
    try:
        with pytest.raises(DebugBufferOverflowError, match="an output logged during a run of method 'forward'.*"
                                                           "a buffer of at least") as err:
            m.execute(x)
    finally:
        del _BACKEND.execute
    assert err.value.needed_bytes > 1 << 16
    assert p.tracer.num_runs == 1 and p.tracer.sink.used_bytes == used
