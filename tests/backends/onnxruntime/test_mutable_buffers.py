"""Mutable buffers (a static KV cache updated in place) next to ORT delegates: the update stays on the portable
backend, and a partition reading the cache takes it as a runtime input (lowering passes mutated buffers to
delegates), never as a constant baked into the ONNX model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export.graph_signature import OutputKind

from edgetorch.backends.onnxruntime import OrtPartitioner, _blob
from edgetorch.exir import to_edge
from edgetorch.exir.backend import lowered_module_of
from edgetorch.exir.config import EdgeCompileConfig
from tests.backends.onnxruntime._dynamic import run_lowered
from tests.backends.onnxruntime._util import delegate_calls, rel_err

CACHE = (1, 4, 16, 8)


class CachedAttention(nn.Module):
    """One decode step: writes this token's key into a static cache at ``pos`` with ``index_copy_`` and attends
    over the cache (after the update, or, with ``read_first``, over the cache as it was before it)."""

    def __init__(self, read_first: bool = False) -> None:
        super().__init__()
        self.read_first = read_first
        self.register_buffer("cache", torch.zeros(CACHE))
        self.q, self.k, self.out = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(1, 1, 4, 8).transpose(1, 2)
        k = self.k(x).view(1, 1, 4, 8).transpose(1, 2)
        if self.read_first:
            a = F.scaled_dot_product_attention(q, self.cache, self.cache)
            self.cache.index_copy_(2, pos, k)
        else:
            self.cache.index_copy_(2, pos, k)
            a = F.scaled_dot_product_attention(q, self.cache, self.cache)
        return self.out(a.transpose(1, 2).reshape(1, 1, 32))


def _lower(read_first: bool):
    torch.manual_seed(0)
    model = CachedAttention(read_first).eval()
    ep = torch.export.export(model, (torch.randn(1, 1, 32), torch.tensor([0])))
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    assert list(edge.exported_program().graph_signature.buffers_to_mutate.values()) == ["cache"]
    # index_put offered to ORT as well: only the mutation rule keeps it portable
    part = OrtPartitioner(extra_ops=["aten.index_put.default"])
    return model, edge.exported_program(), edge.to_backend(part).exported_program(), part


def _update_node(ep) -> torch.fx.Node:
    (spec,) = [s for s in ep.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
    return next(n for n in ep.graph.nodes if n.name == spec.arg.name)


def _no_cache_constant(lowered) -> None:
    for call in delegate_calls(lowered):
        lm = lowered_module_of(call)
        sub = lm.original_module
        assert not [k for k in [*sub.state_dict, *sub.constants] if "cache" in k]
        inits = _blob.unpack(lm.processed_bytes).initializers
        assert not [n for n, a in inits.items() if tuple(a.shape) == CACHE or "cache" in n]


def _steps(model: CachedAttention, lowered, n: int = 5) -> None:
    """``n`` decode steps of the lowered program (ORT delegates, cache carried between steps) against eager."""
    cache = torch.zeros(CACHE)
    handles: dict = {}
    for p in range(n):
        x, pos = torch.randn(1, 1, 32), torch.tensor([p])
        (got,), mutated = run_lowered(lowered, (x, pos), buffers={"cache": cache}, handles=handles)
        with torch.no_grad():
            want = model(x, pos)
        assert rel_err(got, want) <= 1e-5, p
        cache = mutated["cache"]
        torch.testing.assert_close(cache, model.cache, rtol=1e-5, atol=1e-6)
    assert model.cache.abs().sum() > 0


@pytest.mark.parametrize("read_first", [False, True])
def test_the_node_computing_the_new_cache_stays_portable(read_first):
    _, edge, lowered, part = _lower(read_first)
    update = _update_node(edge)
    assert any(r.node == update.name and "mutated 'cache'" in r.reason for r in part.rejected), part.rejected
    assert _update_node(lowered).target is update.target  # still an edge op of the lowered program
    _no_cache_constant(lowered)


def test_attention_after_the_update_reads_the_new_cache_as_an_input():
    model, _, lowered, _ = _lower(read_first=False)
    update = _update_node(lowered)
    readers = [c for c in delegate_calls(lowered) if update in c.args[1:]]
    assert len(readers) == 1
    _steps(model, lowered)


def test_attention_before_the_update_takes_the_cache_as_an_input():
    model, _, lowered, _ = _lower(read_first=True)
    (ph,) = [n for n in lowered.graph.nodes if n.op == "placeholder" and
             lowered.graph_signature.inputs_to_buffers.get(n.name) == "cache"]
    (call,) = delegate_calls(lowered)
    assert ph in call.args[1:]
    # the delegate reads the cache at run time: after the first step it is no longer the zeros of the export
    _steps(model, lowered)


@pytest.mark.parametrize("read_first", [False, True])
def test_decode_steps_through_the_runtime(read_first):
    from edgetorch.exir.program import EdgeProgramManager
    from edgetorch.runtime import Runtime

    model, _, lowered, _ = _lower(read_first)
    et = EdgeProgramManager({"forward": lowered}, None).to_executorch()
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    for p in range(5):
        x, pos = torch.randn(1, 1, 32), torch.tensor([p])
        (got,) = method.execute(x, pos)
        with torch.no_grad():
            assert rel_err(got, model(x, pos)) <= 1e-5, p
