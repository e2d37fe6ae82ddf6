"""Delegation end to end with a nested-portable test backend: mixed programs, maps, blobs, multi-method."""

from __future__ import annotations

import torch

from edgetorch.exir import to_edge, to_edge_transform_and_lower
from edgetorch.exir.backend import CALL_DELEGATE, get_delegation_info
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.runtime import Runtime
from tests.exir.nested_backend import ADD_MUL, NAME, OpTypePartitioner


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(8, 8)
        self.l2 = torch.nn.Linear(8, 8)

    def forward(self, x):
        a = (x + 1) * 2  # partition 0
        b = self.l1(a)  # portable
        c = torch.relu(b) + a  # partition 1
        return self.l2(c), c.mul(c)


def test_mixed_program_with_two_partitions_matches_eager(tmp_path):
    model = Mixed().eval()
    x = torch.randn(2, 8)
    aten = torch.export.export(model, (x,))
    epm = to_edge_transform_and_lower(aten, partitioner=[OpTypePartitioner(ADD_MUL)])
    ep = epm.exported_program()
    calls = [n for n in ep.graph.nodes if n.target is CALL_DELEGATE]
    assert len(calls) >= 2
    info = get_delegation_info(ep.graph_module)
    assert info.num_delegated_subgraphs == len(calls)
    assert info.delegation_by_operator["add.Tensor"][0] >= 2
    assert info.delegation_by_operator["addmm"] == (0, 2)
    # the lowered program still runs eagerly (call_delegate's CPU kernel runs the original partition)
    torch.testing.assert_close(ep.module()(x), model(x))
    et = epm.to_executorch()
    et.save(tmp_path / "mixed.pte")
    out = Runtime.get().load_program(tmp_path / "mixed.pte").load_method("forward").execute_structured(x)
    for g, w in zip(out, model(x)):
        torch.testing.assert_close(g, w.detach(), rtol=1e-6, atol=1e-6)
    # maps: a DELEGATE_CALL instruction maps to the handles of its partition, the backend map to edge handles
    dmap = et.delegate_map["forward"]
    assert dmap and all(v["name"] == NAME for v in dmap.values())
    edge_handles = {get_debug_handle(n) for n in to_edge(aten).exported_program().graph.nodes} - {None}
    for instr, handles in et.debug_handle_map["forward"].items():
        if instr in dmap:
            assert isinstance(handles, list) and set(handles) <= edge_handles
            inner = {h for hs in dmap[instr]["delegate_map"].values() for h in hs}
            assert inner and inner <= set(handles)


def test_lowering_does_not_mutate_the_edge_program():
    model = Mixed().eval()
    x = torch.randn(2, 8)
    epm = to_edge(torch.export.export(model, (x,)))
    before = [(n.name, n.target) for n in epm.exported_program().graph.nodes]
    lowered = epm.to_backend(OpTypePartitioner(ADD_MUL))
    after = [(n.name, n.target) for n in epm.exported_program().graph.nodes]
    assert before == after
    assert any(n.target is CALL_DELEGATE for n in lowered.exported_program().graph.nodes)
    assert all(n.meta.get("delegation_tag") is None for n in epm.exported_program().graph.nodes)


def test_identical_delegate_blobs_are_stored_once():
    from edgetorch.exir.emit import DelegatePool
    from edgetorch.formats.program import SegmentLayout

    layout = SegmentLayout()
    pool = DelegatePool(layout)
    a, b, c = pool.add(b"blob-one"), pool.add(b"blob-two"), pool.add(b"blob-one")
    assert a == c != b
    assert pool.ranges() == [(0, 8), (64, 8)]


def test_two_partitions_in_one_method_each_get_a_delegate():
    class Twice(torch.nn.Module):
        def forward(self, x, y):
            return (x + 1) * 2, torch.sigmoid(x), (y + 1) * 2

    x, y = torch.randn(4), torch.randn(4)
    epm = to_edge_transform_and_lower(torch.export.export(Twice(), (x, y)), partitioner=[OpTypePartitioner(ADD_MUL)])
    et = epm.to_executorch()
    plan = et.program.plan("forward")
    assert len(plan.delegates) == 2
    out = Runtime.get().load_program(et.buffer).load_method("forward").execute(x, y)
    torch.testing.assert_close(out[0], (x + 1) * 2)
    torch.testing.assert_close(out[2], (y + 1) * 2)


def test_multi_method_delegation():
    from edgetorch.models import get_spec, method_module

    spec = get_spec("two_method")
    model = spec.build()
    inputs = spec.example_inputs()
    eps = {m: torch.export.export(method_module(model, m), inp) for m, inp in inputs.items()}
    part = OpTypePartitioner({torch.ops.aten.relu.default, torch.ops.aten.gelu.default, torch.ops.aten.tanh.default,
                              torch.ops.aten.add.Tensor})
    epm = to_edge_transform_and_lower(eps, partitioner=[part])
    p = Runtime.get().load_program(epm.to_executorch().buffer)
    for m, inp in inputs.items():
        torch.testing.assert_close(p.load_method(m).execute_structured(*inp), getattr(model, m)(*inp).detach())
