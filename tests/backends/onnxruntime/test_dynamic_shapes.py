"""ORT delegates of programs with bounded dynamic shapes (``torch.export.Dim``): symbolic ONNX dims, one session
for every length, sizes copied into partitions, shapes checked per run, debug bytes at the upper bounds and
debug-buffer memory lent at this run's shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from edgetorch.backends.onnxruntime import OrtPartitioner, _blob, _shapes
from edgetorch.backends.onnxruntime.runtime import OrtDelegate, OrtRuntime
from edgetorch.errors import RuntimeInputError
from edgetorch.exir import to_edge
from edgetorch.exir.backend import lowered_module_of
from edgetorch.exir.config import EdgeCompileConfig
from edgetorch.models import get_model
from tests.backends.onnxruntime._dynamic import (
    LendingTracer,
    lowering_examples_keep_strides,
    run_lowered,
    upper_bound_storage,
)
from tests.backends.onnxruntime._util import compute_nodes, delegate_calls, edge_group_outputs, rel_err

LO, HI = 2, 64


class TinyBlock(nn.Module):
    """Pre-LN attention block: LayerNorm, fused qkv Linear, heads split by view/transpose of the sequence
    length, causal SDPA, GELU MLP."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _lower(model: nn.Module, inputs: tuple, dims: tuple, **kw):
    edge = to_edge(torch.export.export(model, inputs, dynamic_shapes=dims),
                   compile_config=EdgeCompileConfig(_check_ir_validity=False))
    part = OrtPartitioner(**kw)
    lowered = edge.to_backend(part)
    return edge.exported_program(), lowered.exported_program(), part


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = TinyBlock().eval()
    edge, lowered, part = _lower(model, (torch.randn(1, 8, 32),), ({1: Dim("seq", min=LO, max=HI)},))
    (call,) = delegate_calls(lowered)
    blob = lowered_module_of(call).processed_bytes
    return model, edge, lowered, part, blob


def _symbol(edge) -> str:
    (sym,) = edge.range_constraints
    return str(sym)


def test_the_dynamic_graph_is_one_partition_that_takes_and_returns_tensors(tiny):
    _, edge, lowered, part, _ = tiny
    assert not [r for r in part.rejected if "dynamic" in r.reason], part.rejected
    assert compute_nodes(lowered) == []  # sizes included: nothing left to the portable backend
    (call,) = delegate_calls(lowered)
    assert all(isinstance(a.meta["val"], torch.Tensor) for a in call.args[1:])
    sym = _symbol(edge)
    for v in call.meta["val"]:
        assert isinstance(v, torch.Tensor) and str(v.shape[1]) == sym


def test_onnx_inputs_and_outputs_have_symbolic_dims_named_after_the_symbol(tiny):
    _, edge, _, _, blob = tiny
    u = _blob.unpack(blob)
    sym = _symbol(edge)
    assert u.header["dims"] == {sym: [LO, HI]}
    assert u.header["inputs"][0]["shape"] == [1, sym, 32] and u.header["outputs"][0]["shape"] == [1, sym, 32]
    proto = onnx.ModelProto.FromString(bytes(u.model))
    for vi in [*proto.graph.input, *proto.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        assert [d.dim_value for d in dims] == [1, 0, 32] and dims[1].dim_param == sym


def test_one_session_runs_every_length_in_place_like_eager(tiny):
    model, _, _, _, blob = tiny
    h = OrtDelegate(blob, {})
    arena_in, (arena_out,) = torch.empty(HI * 32), upper_bound_storage(h)
    for s in (LO, 3, 17, HI, 5, HI):  # the same addresses every run, other shapes
        x = arena_in[:s * 32].view(1, s, 32)
        x.copy_(torch.randn(1, s, 32))
        out = arena_out[:s * 32].view(1, s, 32)
        h.run([x], [out])
        with torch.no_grad():
            assert rel_err(out, model(x)) <= 1e-5, s
    assert out.data_ptr() == arena_out.data_ptr()


@pytest.mark.parametrize("shape, match", [
    ((1, LO - 1, 32), rf"input 'x' dim 1 \(s\d+\) is 1, outside its bounds \[{LO}, {HI}\]"),
    ((1, HI + 1, 32), rf"input 'x' dim 1 \(s\d+\) is {HI + 1}, outside"),
    ((1, 8, 31), "input 'x' dim 2 is 31, the delegate was built for 32"),
    ((8, 32), "input 'x' has rank 2"),
])
def test_inputs_outside_the_bounds_raise_naming_input_and_dim(tiny, shape, match):
    h = OrtDelegate(tiny[4], {})
    with pytest.raises(RuntimeInputError, match=match):
        h.run([torch.randn(shape)], [torch.empty(1, 8, 32)])


def test_an_output_of_another_length_raises_naming_it(tiny):
    h = OrtDelegate(tiny[4], {})
    name = h.output_names[0]
    with pytest.raises(RuntimeInputError, match=rf"output '{name}' dim 1 \(s\d+\) is 9, this run computes 8"):
        h.run([torch.randn(1, 8, 32)], [torch.empty(1, 9, 32)])


def test_shape_expressions_bind_and_evaluate():
    specs = [{"name": "a", "shape": [1, "s0", 4]}, {"name": "b", "shape": ["2*s0", "s1"]}]
    env = _shapes.bind(specs, [(1, 5, 4), (10, 3)], {"s0": [2, 8], "s1": [1, None]})
    assert env == {"s0": 5, "s1": 3}
    assert _shapes.resolve(["(s0//2)", "Max(1, s1 - 3)", "PythonMod(s0, 3)", "s0**2"], env) == (2, 1, 2, 25)
    with pytest.raises(RuntimeInputError, match=r"input 'b' dim 0 is 9, but 2\*s0 = 10"):
        _shapes.bind(specs, [(1, 5, 4), (9, 3)], {})
    with pytest.raises(_shapes.UnsupportedDimError):
        _shapes.eval_dim("__import__('os')", env)


def _exposed_bytes(h: OrtDelegate, s: int) -> int:
    """Aligned bytes of the exposed values in a debug run at length ``s``, as ORT computes them."""
    sess = h.debug_session()
    res = sess.run(h._debug_outputs, h.debug_feeds([np.random.randn(1, s, 32).astype(np.float32)]))
    by_name = dict(zip(h._debug_outputs, res))
    return sum((by_name[n].nbytes + 63) // 64 * 64 for n in h.intermediates)


def test_debug_bytes_are_those_of_the_longest_run(tiny):
    h = OrtDelegate(tiny[4], {})
    assert h.debug_buffer_bytes == _exposed_bytes(h, HI)
    assert _exposed_bytes(h, LO) < h.debug_buffer_bytes


def test_debug_runs_lend_memory_and_log_values_at_this_runs_shapes(tiny):
    model, edge, _, _, blob = tiny
    h = OrtDelegate(blob, {"observer_effect": b"every"})  # the plain session checks the exposing one at each shape
    dmap = _blob.unpack(blob).header["values"]
    (out_store,) = upper_bound_storage(h)
    tracer = LendingTracer()
    for s in (HI, 3, LO, 11):
        tracer.reset()
        x = torch.randn(1, s, 32)
        out = out_store[:s * 32].view(1, s, 32)
        OrtRuntime().execute(h, [x], [out], tracer)
        with torch.no_grad():
            assert rel_err(out, model(x)) <= 1e-5
        values = [(gid, v) for gid, v in tracer.logged if gid != "observer_effect"]
        assert len(values) == len(h.groups)
        names = dict(h.groups)
        logged = [(n, t) for gid, v in values for n, t in zip(names[gid], v if isinstance(v, list) else [v])]
        # every exposed value but the final outputs was bound into lent memory requested at its shape for this run
        lent = [t for n, t in logged if n not in h.output_names]
        assert len(lent) == len(logged) - 1
        assert [shape for shape, _ in tracer.requests] == [tuple(t.shape) for t in lent]
        base = tracer.buffer.data_ptr()
        assert all(base <= t.data_ptr() < base + tracer.buffer.numel() for t in lent)
        assert tracer.used <= tracer.logged_bytes() <= h.debug_buffer_bytes
        if s == HI:
            assert tracer.logged_bytes() == h.debug_buffer_bytes
        eager = edge_group_outputs(edge, (x,))
        for gid, v in values:
            got = v[0] if isinstance(v, list) else v
            (handle,) = dmap[gid]
            want = eager[handle][0]
            assert tuple(got.shape) == tuple(want.shape), gid
            assert rel_err(got, want) <= 1e-4, gid
        effect = dict(tracer.logged)["observer_effect"]
        assert 0.0 <= effect < 1e-4


def test_sizes_read_by_several_partitions_are_copied_into_each():
    torch.manual_seed(1)
    model = TinyBlock().eval()
    with lowering_examples_keep_strides():  # the second partition views SDPA's permuted output
        edge, lowered, _ = _lower(model, (torch.randn(1, 8, 32),), ({1: Dim("seq", min=LO, max=HI)},),
                                  exclude_ops=["aten.scaled_dot_product_attention.default"])
    calls = delegate_calls(lowered)
    assert len(calls) == 2
    assert [n.target for n in compute_nodes(lowered)] == [torch.ops.aten.scaled_dot_product_attention.default]
    for call in calls:
        assert all(isinstance(a.meta["val"], torch.Tensor) for a in call.args[1:])
        assert all(isinstance(v, torch.Tensor) for v in call.meta["val"])
    handles: dict = {}
    for s in (LO, 9, HI):
        x = torch.randn(1, s, 32)
        (got,), _ = run_lowered(lowered, (x,), handles=handles)
        with torch.no_grad():
            assert rel_err(got, model(x)) <= 1e-5, s


def test_zoo_transformer_encoder_with_a_dynamic_sequence_length():
    model, inputs = get_model("transformer_encoder")
    top = model.pos_embedding.shape[1]
    edge, lowered, part = _lower(model, inputs, ({1: Dim("seq", min=LO, max=top)},))
    assert len(delegate_calls(lowered)) == 1 and compute_nodes(lowered) == [], part.rejected
    handles: dict = {}
    for s in (LO, 13, top):
        tokens = torch.randint(0, 1000, (1, s))
        (got,), _ = run_lowered(lowered, (tokens,), handles=handles)
        with torch.no_grad():
            assert rel_err(got, model(tokens)) <= 1e-4, s
    (h,) = handles.values()
    tracer = LendingTracer()
    tokens = torch.randint(0, 1000, (1, top))
    run_lowered(lowered, (tokens,), handles=handles, tracer=tracer)
    assert tracer.logged_bytes() == h.debug_buffer_bytes  # the longest run logs exactly what the blob declares


def test_a_size_read_inside_and_outside_partitions_gets_a_portable_copy(tiny):
    model, edge, _, _, _ = tiny
    sym_size = torch.ops.aten.sym_size.int
    # a view reading the sequence length, kept portable between two partitions that read it too
    view = next(n for n in edge.graph.nodes if n.target is torch.ops.aten.view.default
                and any(getattr(a, "target", None) is sym_size for a in n.args[1])
                and n.args[0].target is torch.ops.aten.permute.default)
    _, lowered, _ = _lower(model, (torch.randn(1, 8, 32),), ({1: Dim("seq", min=LO, max=HI)},),
                           exclude_nodes=[view.name])
    calls = delegate_calls(lowered)
    assert len(calls) == 2
    portable = compute_nodes(lowered)
    assert sorted(str(n.target) for n in portable) == sorted(map(str, [sym_size, view.target]))
    (size,) = [n for n in portable if n.target is sym_size]
    assert [u.target for u in size.users] == [view.target]
    for call in calls:
        assert all(isinstance(a.meta["val"], torch.Tensor) for a in call.args[1:])
        inner = lowered_module_of(call).original_module
        assert any(n.target is sym_size for n in inner.graph.nodes)  # its own copy of the size
    handles: dict = {}
    for s in (HI, LO, 21):
        x = torch.randn(1, s, 32)
        (got,), _ = run_lowered(lowered, (x,), handles=handles)
        with torch.no_grad():
            assert rel_err(got, model(x)) <= 1e-5, s


def test_the_runtime_runs_the_delegate_at_every_length_and_logs_this_runs_shapes(tiny, tmp_path):
    from edgetorch.devtools.etdump import DebugBuffer, read_etdump
    from edgetorch.exir.program import EdgeProgramManager
    from edgetorch.runtime import Runtime

    model, edge, lowered, _, blob = tiny
    et = EdgeProgramManager({"forward": lowered}, None).to_executorch()
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    method = prog.load_method("forward")
    xs = [torch.randn(1, s, 32) for s in (HI, LO, 9)]
    for x in xs:
        (out,) = method.execute(x)
        with torch.no_grad():
            assert rel_err(out, model(x)) <= 1e-5, x.shape
    dump, dbg = tmp_path / "d.etdp", tmp_path / "d.bin"
    prog.write_etdump_result_to_file(dump, dbg)
    buf = DebugBuffer(str(dbg))
    handles = _blob.unpack(blob).header["values"]
    runs = []
    for run in read_etdump(str(dump)).run_data:
        vals = {d.delegate_debug_id_str: buf.value(d.debug_entry) for d in (e.debug_event for e in run.events)
                if d is not None and d.delegate_debug_id_str in handles}
        if vals:
            runs.append(vals)
    assert len(runs) == len(xs)
    for x, vals in zip(xs, runs):  # each run logged every group at its own shapes, with eager's values
        eager = edge_group_outputs(edge, (x,))
        assert len(vals) == len(handles)
        for gid, v in vals.items():
            got, want = (v[0] if isinstance(v, list) else v), eager[handles[gid][0]][0]
            assert rel_err(got, want) <= 1e-4, (gid, x.shape)


class SqueezeDims(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.squeeze(torch.relu(x).unsqueeze(1).unsqueeze(3), (1, 3)) * 2 + 1


def test_squeeze_dims_next_to_a_dynamic_dim_is_rewritten_without_fixing_the_length():
    model = SqueezeDims()
    edge, lowered, part = _lower(model, (torch.randn(1, 8, 4),), ({1: Dim("seq", min=LO, max=HI)},))
    assert torch.ops.aten.squeeze.dims in {n.target for n in edge.graph.nodes}
    assert compute_nodes(lowered) == [], part.rejected
    handles: dict = {}
    for s in (LO, 6, HI):
        x = torch.randn(1, s, 4)
        (got,), _ = run_lowered(lowered, (x,), handles=handles)
        torch.testing.assert_close(got, model(x), rtol=0, atol=0)
