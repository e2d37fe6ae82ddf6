"""Zoo models fully delegated to ONNX Runtime: runtime outputs vs eager, and delegate-internal intermediates vs
an independent eager capture of the edge ops they map to."""

from __future__ import annotations

import pytest
import torch

from edgetorch.backends.onnxruntime import OrtPartitioner
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.exir.backend import lowered_module_of
from edgetorch.models import get_model
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import (
    compute_nodes,
    delegate_calls,
    edge_group_outputs,
    lower_ort,
    rel_err,
    runtime_options,
    traced_delegate_outputs,
)

FAST = ["vit_tiny", "small_cnn", "mlp", "transformer_encoder"]
SLOW = ["vit_b_16", "resnet18", "mobilenet_v2"]


def _check_model(name: str, tmp_path) -> None:
    model, inputs = get_model(name)
    low = lower_ort(model, inputs)
    # fully delegated: one delegate call, nothing left on the portable backend
    assert len(delegate_calls(low.lowered)) == 1
    assert compute_nodes(low.lowered) == []
    method = low.method()
    with torch.no_grad():
        want = model(*inputs)
    got = method.execute_structured(*inputs)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert rel_err(got, want) <= 1e-4
    # a second run reuses the bindings and gives the same result
    again = method.execute_structured(*inputs)
    torch.testing.assert_close(again[0] if isinstance(again, (list, tuple)) else again, got, rtol=0, atol=0)

    # debug run: one logged value per edge op of the partition, each equal to that op's eager output
    with runtime_options(observer_effect="first"):  # float: not checked by default ("auto"), checked here
        logged = traced_delegate_outputs(low.et, inputs, str(tmp_path))
    call = delegate_calls(low.lowered)[0]
    dmap = lowered_module_of(call).debug_handle_map
    ref = edge_group_outputs(low.edge, inputs)
    values = [(d, v) for d, v in logged if d != "observer_effect"]
    assert len(values) >= 0.9 * len(lowered_module_of(call).debug_handles())
    for did, v in values:
        (h,) = dmap[did]
        got_v = v if isinstance(v, list) else [v]
        assert len(got_v) == len(ref[h]), did
        for g, w in zip(got_v, ref[h]):
            assert tuple(g.shape) == tuple(w.shape), did
            if w.is_floating_point():
                assert rel_err(g, w) <= 1e-4, (did, rel_err(g, w))
            else:
                assert torch.equal(g, w), did
    (effect,) = [v for d, v in logged if d == "observer_effect"]
    assert 0.0 <= effect <= 1e-4


@pytest.mark.parametrize("name", FAST)
def test_zoo_model_fully_delegated(name, tmp_path):
    _check_model(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_big_zoo_model_fully_delegated(name, tmp_path):
    _check_model(name, tmp_path)


def test_seed_flow_to_edge_transform_and_lower_and_file_roundtrip(tmp_path):
    model, inputs = get_model("vit_tiny")
    epm = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[OrtPartitioner()])
    et = epm.to_executorch()
    path = tmp_path / "vit_tiny_ort.pte"
    et.save(path)
    out = Runtime.get().load_program(path).load_method("forward").execute_structured(*inputs)
    assert rel_err(out, model(*inputs)) <= 1e-4
    # the delegate map names the backend and maps its ids to edge handles of the partition
    (entry,) = et.delegate_map["forward"].values()
    assert entry["name"] == "onnxruntime" and len(entry["delegate_map"]) > 50
