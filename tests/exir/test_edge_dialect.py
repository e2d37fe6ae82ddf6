"""The edge dialect: decomposition, preserved ops, debug handles and their metadata."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from edgetorch.exir import EdgeCompileConfig, to_edge
from edgetorch.exir.debug_handles import get_debug_handle, source_location
from edgetorch.models import get_model


class Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).reshape(1, 4, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v).sum()


def _ops(ep):
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]


def test_every_op_has_handle_trace_and_module_path():
    model, inputs = get_model("vit_tiny")
    epm = to_edge(torch.export.export(model, inputs))
    nodes = _ops(epm.exported_program())
    assert nodes
    for n in nodes:
        assert isinstance(get_debug_handle(n), int) and get_debug_handle(n) > 0, n.name
        assert n.meta.get("stack_trace"), n.name
        assert n.meta.get("nn_module_stack") is not None, n.name


def test_decomposed_nodes_share_the_source_ops_handle():
    x = torch.randn(1, 4, 16)
    aten = torch.export.export(Attn().eval(), (x,))
    epm = to_edge(aten)
    aten_handles = {get_debug_handle(n): n for n in _ops(aten)}
    # handles are dense from 1, one per ATen op
    assert sorted(aten_handles) == list(range(1, len(aten_handles) + 1))
    edge_nodes = _ops(epm.exported_program())
    linear = [n for n in aten.graph.nodes if n.target == torch.ops.aten.linear.default][0]
    group = [n.target for n in edge_nodes if get_debug_handle(n) == get_debug_handle(linear)]
    # linear on a 3-d input decomposes into several edge nodes, all with the linear's handle
    assert torch.ops.aten.addmm.default in group and len(group) >= 3
    assert all(get_debug_handle(n) in aten_handles for n in edge_nodes)


def test_sdpa_kept_whole_by_default_and_decomposed_on_request():
    x = torch.randn(1, 4, 16)
    kept = to_edge(torch.export.export(Attn().eval(), (x,)))
    assert any(n.target == torch.ops.aten.scaled_dot_product_attention.default for n in _ops(kept.exported_program()))
    dec = to_edge(torch.export.export(Attn().eval(), (x,)), compile_config=EdgeCompileConfig(preserve_ops=()))
    assert not any(n.target == torch.ops.aten.scaled_dot_product_attention.default
                   for n in _ops(dec.exported_program()))
    assert any(n.target == torch.ops.aten._softmax.default for n in _ops(dec.exported_program()))


def test_linear_can_be_preserved():
    x = torch.randn(1, 4, 16)
    cfg = EdgeCompileConfig(preserve_ops=(torch.ops.aten.linear.default,))
    model = Attn().eval()
    epm = to_edge(torch.export.export(model, (x,)), compile_config=cfg)
    assert any(n.target == torch.ops.aten.linear.default for n in _ops(epm.exported_program()))
    et = epm.to_executorch()
    from edgetorch.runtime import Runtime
    out = Runtime.get().load_program(et.buffer).load_method("forward").execute_structured(x)
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-5, atol=1e-6)


def test_source_location_points_at_user_code():
    x = torch.randn(1, 4, 16)
    epm = to_edge(torch.export.export(Attn().eval(), (x,)))
    sdpa = [n for n in _ops(epm.exported_program())
            if n.target == torch.ops.aten.scaled_dot_product_attention.default][0]
    loc = source_location(sdpa.meta["stack_trace"])
    assert "test_edge_dialect.py" in loc and "scaled_dot_product_attention" in loc


def test_to_edge_is_idempotent_on_the_aten_program():
    x = torch.randn(1, 4, 16)
    aten = torch.export.export(Attn().eval(), (x,))
    a = to_edge(aten)
    b = to_edge(aten)
    ha = [get_debug_handle(n) for n in _ops(a.exported_program())]
    hb = [get_debug_handle(n) for n in _ops(b.exported_program())]
    assert ha == hb


def test_multi_method_manager():
    model, _ = get_model("two_method")
    from edgetorch.models import get_spec, method_module

    inputs = get_spec("two_method").example_inputs()
    eps = {m: torch.export.export(method_module(model, m), inp) for m, inp in inputs.items()}
    epm = to_edge(eps)
    assert epm.methods == {"forward", "encode"}
    et = epm.to_executorch()
    assert et.methods == {"forward", "encode"}
    assert set(et.debug_handle_map) == {"forward", "encode"}
    for m in ("forward", "encode"):
        assert et.exported_program(m) is epm.exported_program(m)
