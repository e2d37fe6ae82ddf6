"""OrtPartitioner: exclusions, several partitions with portable ops between them, multi-method programs,
convexity, and ops ORT cannot export (a clear ExportError, or left to the portable backend)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.passes.utils.fuser_utils import validate_partition

from edgetorch.backends.onnxruntime import OrtPartitioner
from edgetorch.errors import ExportError
from edgetorch.exir import to_edge, to_edge_transform_and_lower
from edgetorch.exir.backend import DELEGATION_TAG, get_delegation_info, lowered_module_of
from edgetorch.models import get_model, get_spec, method_module
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import compute_nodes, delegate_calls, lower_ort, rel_err


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 16)
        self.l3 = torch.nn.Linear(16, 8)

    def forward(self, x):
        a = torch.relu(self.l1(x))
        b = torch.nn.functional.gelu(self.l2(a))  # gelu excluded: portable
        c = torch.tanh(self.l3(b)) + 1
        return c, a.sum(dim=-1)


def test_excluded_op_splits_into_partitions_with_portable_ops_between():
    model, x = Mixed().eval(), torch.randn(4, 16)
    low = lower_ort(model, (x,), exclude_ops=["aten.gelu.default"])
    calls = delegate_calls(low.lowered)
    assert len(calls) == 2
    assert [n.target for n in compute_nodes(low.lowered)] == [torch.ops.aten.gelu.default]
    info = get_delegation_info(low.lowered.graph_module)
    assert info.num_delegated_subgraphs == 2 and info.delegation_by_operator["gelu"] == (0, 1)
    out = low.method().execute_structured(x)
    want = model(x)
    for g, w in zip(out, want):
        assert rel_err(g, w) <= 1e-5


def test_exclude_nodes_and_module_paths():
    model, x = Mixed().eval(), torch.randn(4, 16)
    edge = to_edge(torch.export.export(model, (x,))).exported_program()
    tanh = next(n.name for n in edge.graph.nodes if n.target is torch.ops.aten.tanh.default)
    low = lower_ort(model, (x,), exclude_nodes=[tanh])
    assert torch.ops.aten.tanh.default in {n.target for n in compute_nodes(low.lowered)}
    low2 = lower_ort(model, (x,), exclude_module_paths=["l2"])
    kept = {n.target for n in compute_nodes(low2.lowered)}
    assert torch.ops.aten.addmm.default in kept and torch.ops.aten.gelu.default not in kept
    part = OrtPartitioner(exclude_module_paths=["l2"])
    part.partition(to_edge(torch.export.export(model, (x,))).exported_program())
    assert any("l2" in r.reason for r in part.rejected)
    for low_ in (low, low2):
        out = low_.method().execute_structured(x)
        assert rel_err(out[0], model(x)[0]) <= 1e-5


def test_partitions_are_convex():
    class Diamond(torch.nn.Module):
        def forward(self, x):
            a = torch.relu(x)
            b = torch.nn.functional.gelu(a)  # excluded: a path leaving the candidate set and coming back
            return torch.sigmoid(a) + b

    x = torch.randn(3, 5)
    ep = to_edge(torch.export.export(Diamond(), (x,))).exported_program()
    res = OrtPartitioner(exclude_ops=["gelu"]).partition(ep)
    groups: dict = {}
    for n in ep.graph.nodes:
        if n.meta.get(DELEGATION_TAG):
            groups.setdefault(n.meta[DELEGATION_TAG], []).append(n)
    assert set(groups) == set(res.partition_tags)
    assert len(groups) >= 2
    assert all(validate_partition(nodes) for nodes in groups.values())
    out = lower_ort(Diamond(), (x,), exclude_ops=["gelu"]).method().execute_structured(x)
    assert rel_err(out, Diamond()(x)) <= 1e-6


def test_multi_method_program():
    spec = get_spec("two_method")
    model = spec.build()
    inputs = spec.example_inputs()
    eps = {m: torch.export.export(method_module(model, m), inp) for m, inp in inputs.items()}
    epm = to_edge_transform_and_lower(eps, partitioner=[OrtPartitioner()])
    for m in inputs:
        assert len(delegate_calls(epm.exported_program(m))) == 1
    prog = Runtime.get().load_program(epm.to_executorch().buffer)
    for m, inp in inputs.items():
        got = prog.load_method(m).execute_structured(*inp)
        want = getattr(model, m)(*inp)
        assert rel_err(got[0] if isinstance(got, (list, tuple)) else got, want) <= 1e-5


class WithCdist(torch.nn.Module):
    def forward(self, x, y):
        a = torch.relu(x) * 2
        d = torch.cdist(a, y)  # aten._cdist_forward: no ONNX translation in torch 2.13
        return torch.sigmoid(d) + 1


def test_unexportable_op_raises_export_error_naming_op_and_source_line():
    x, y = torch.randn(1, 5, 8), torch.randn(1, 6, 8)
    ep = torch.export.export(WithCdist(), (x, y))
    part = OrtPartitioner(extra_ops=["aten._cdist_forward.default"], fallback_unsupported=False)
    with pytest.raises(ExportError) as ei:
        to_edge_transform_and_lower(ep, partitioner=[part])
    msg = str(ei.value)
    assert "aten._cdist_forward.default" in msg
    assert "test_partitioner.py" in msg and "torch.cdist(a, y)" in msg  # the source line


def test_fallback_leaves_unexportable_op_to_the_portable_backend():
    x, y = torch.randn(1, 5, 8), torch.randn(1, 6, 8)
    part = OrtPartitioner(extra_ops=["aten._cdist_forward.default"])  # fallback_unsupported=True (default)
    epm = to_edge_transform_and_lower(torch.export.export(WithCdist(), (x, y)), partitioner=[part])
    ep = epm.exported_program()
    assert [n.target for n in compute_nodes(ep)] == [torch.ops.aten._cdist_forward.default]
    assert len(delegate_calls(ep)) == 2
    assert any(r.op == "aten._cdist_forward.default" and "no ONNX translation" in r.reason for r in part.rejected)
    out = Runtime.get().load_program(epm.to_executorch().buffer).load_method("forward").execute_structured(x, y)
    assert rel_err(out, WithCdist()(x, y)) <= 1e-5


def test_unsupported_dtype_stays_portable():
    class F64(torch.nn.Module):
        def forward(self, x):
            return (torch.relu(x.double()) * 2).float() + 1

    x = torch.randn(4, 4)
    part = OrtPartitioner()
    low = lower_ort(F64(), (x,))
    part.partition(low.edge)
    assert any("float64" in r.reason for r in part.rejected)
    out = low.method().execute_structured(x)
    assert rel_err(out, F64()(x)) <= 1e-6


def test_keep_whole_linear_and_layer_norm():
    model, inputs = get_model("vit_tiny")
    part = OrtPartitioner(keep_whole=["linear", "layer_norm"])
    assert part.ops_to_not_decompose(None)[0] == [torch.ops.aten.linear.default, torch.ops.aten.layer_norm.default]
    epm = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[part])
    call = delegate_calls(epm.exported_program())[0]
    inner = {n.target for n in lowered_module_of(call).original_module.graph.nodes}
    assert torch.ops.aten.linear.default in inner
    out = Runtime.get().load_program(epm.to_executorch().buffer).load_method("forward").execute_structured(*inputs)
    assert rel_err(out, model(*inputs)) <= 1e-4


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="graph_optimization_level"):
        OrtPartitioner(graph_optimization_level="FAST")
    with pytest.raises(ValueError, match="unknown op"):
        OrtPartitioner(exclude_ops=["aten.no_such_op.default"])
    with pytest.raises(ValueError, match="keep_whole"):
        OrtPartitioner(keep_whole=["conv"])
    with pytest.raises(ValueError, match="observer_effect must be 'auto', 'every', 'first' or 'off', got 'always'"):
        OrtPartitioner(observer_effect="always")
    with pytest.raises(ValueError, match="profile_ops"):
        OrtPartitioner(profile_ops="sometimes")
