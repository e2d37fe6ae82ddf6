"""The lowered module is held by the graph (issue 27): a ``lowered_module_<i>`` submodule read by a ``get_attr``
node and passed to the delegate call, with no process-global registry; it survives deepcopy, a clone, a
re-export, a second lowering round and an ETRecord round trip (stored without pickle)."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

import edgetorch.exir.backend.lowered as lowered_mod
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.errors import EdgeTorchError
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.exir.backend import CALL_DELEGATE, LoweredBackendModule, delegate_calls, get_delegation_info
from edgetorch.exir.backend import lowered_module_of as lowered_of
from edgetorch.exir.clone import clone_program
from edgetorch.runtime import Runtime
from tests.exir.nested_backend import ADD_MUL, NAME, OpTypePartitioner
from tests.exir.test_delegation import Mixed


def _lowered(generate_etrecord: bool = False):
    torch.manual_seed(0)
    model, x = Mixed().eval(), torch.randn(2, 8)
    epm = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[OpTypePartitioner(ADD_MUL)],
                                      generate_etrecord=generate_etrecord)
    return model, x, epm


def _fields(lm: LoweredBackendModule) -> tuple:
    return (lm.backend_id, lm.processed_bytes, lm.compile_spec_items, lm.debug_handle_map, lm.debug_buffer_bytes,
            lm.named_data, [str(n.target) for n in lm.original_module.graph.nodes])


def test_no_registry_and_the_graph_holds_the_lowered_module():
    assert not any(isinstance(v, weakref.WeakValueDictionary | dict) and k.isupper()
                   for k, v in vars(lowered_mod).items()), "a process-global table of lowered modules is back"
    assert not hasattr(lowered_mod, "lookup")
    model, x, epm = _lowered()
    ep = epm.exported_program()
    calls = delegate_calls(ep)
    assert len(calls) == 3 and all(c.target is CALL_DELEGATE for c in calls)
    names = [c.args[0].target for c in calls]
    assert names == ["lowered_module_0", "lowered_module_1", "lowered_module_2"]
    for c, name in zip(calls, names):
        assert c.args[0].op == "get_attr" and "lowered_module" not in c.meta
        lm = getattr(ep.graph_module, name)
        assert isinstance(lm, LoweredBackendModule) and lm is lowered_of(c) and lm.backend_id == NAME
    assert dict(ep.graph_module.named_children()).keys() >= set(names)
    assert "self.lowered_module_0" in ep.graph_module.code
    info = get_delegation_info(ep.graph_module)
    assert info.num_delegated_subgraphs == 3 and info.delegation_by_operator["addmm"] == (0, 2)
    torch.testing.assert_close(ep.module()(x), model(x))  # the call runs the original partition
    # the lowered module lives exactly as long as the graph holding it
    ref = weakref.ref(lowered_of(calls[0]))
    del ep, calls, c, lm, epm
    gc.collect()
    assert ref() is None


def test_deepcopy_clone_and_a_second_lowering_round_keep_the_modules():
    model, x, epm = _lowered()
    ep = epm.exported_program()
    want = epm.to_executorch().buffer
    dup = copy.deepcopy(epm)
    dep = dup.exported_program()
    for a, b in zip(delegate_calls(ep), delegate_calls(dep)):
        assert lowered_of(a) is not lowered_of(b) and _fields(lowered_of(a)) == _fields(lowered_of(b))
    assert dup.to_executorch().buffer == want
    torch.testing.assert_close(dep.module()(x), model(x))
    cl = clone_program(ep)
    assert [lowered_of(c) for c in delegate_calls(cl)] == [lowered_of(c) for c in delegate_calls(ep)]
    # re-export of the lowered program: torch traces the delegate call and keeps the module as a submodule
    again = torch.export.export(ep.module(), (x,))
    assert [type(lowered_of(c)) for c in delegate_calls(again)] == [LoweredBackendModule] * 3
    torch.testing.assert_close(again.module()(x), model(x))
    # a second round adds modules under fresh names
    more = epm.to_backend(OpTypePartitioner({torch.ops.aten.addmm.default}))
    names = [c.args[0].target for c in delegate_calls(more.exported_program())]
    assert len(names) == 5 and len(set(names)) == 5
    out = Runtime.get().load_program(more.to_executorch().buffer).load_method("forward").execute(x)
    for g, w in zip(out, model(x)):
        torch.testing.assert_close(g, w.detach(), rtol=1e-5, atol=1e-6)


def test_etrecord_round_trip_rebuilds_the_lowered_modules():
    model, x, epm = _lowered(generate_etrecord=True)
    rec = epm.to_executorch().get_etrecord()
    rec.add_extra_export_modules({"lowered": epm})
    ep = epm.exported_program()
    lowered_of(delegate_calls(ep)[1]).named_data = {"weights": bytes(range(7)), "empty": b""}
    data = rec.to_bytes()
    assert b"pickle" not in data and b"\x80\x04\x95" not in data
    back = parse_etrecord(data).graph_map["lowered/forward"]
    assert [c.args[0].target for c in delegate_calls(back)] == [c.args[0].target for c in delegate_calls(ep)]
    for a, b in zip(delegate_calls(ep), delegate_calls(back)):
        assert _fields(lowered_of(a)) == _fields(lowered_of(b))
    assert get_delegation_info(back.graph_module) == get_delegation_info(ep.graph_module)
    torch.testing.assert_close(back.module()(x), model(x))


def _edit_index(data: bytes, key: str, edit) -> bytes:
    """The record with the tensor index of program ``key`` (a graph_map key) edited, its manifest resealed."""
    import io
    import json
    import zipfile

    from tests.fuzz.fuzzlib import edit_etrecord_json

    zin = zipfile.ZipFile(io.BytesIO(data))
    entry = f"programs/{json.loads(zin.read('programs.json'))['graph_map'][key]}/tensors.json"
    return edit_etrecord_json(data, entry, edit)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("lowered_modules"), "does not hold"),
    (lambda d: d["lowered_modules"][0]["compile_specs"].append(["k", "not base64!"]), "not base64"),
    (lambda d: d["lowered_modules"][0].update(name="__class__"), "must hold exactly"),
    (lambda d: d["lowered_modules"][0].update(evil=1), "must hold exactly"),
])
def test_a_tampered_lowered_module_entry_is_a_typed_error(edit, message):
    _, _, epm = _lowered(generate_etrecord=True)
    rec = epm.to_executorch().get_etrecord()
    rec.add_extra_export_modules({"lowered": epm})
    bad = _edit_index(rec.to_bytes(), "lowered/forward", edit)
    with pytest.raises(EdgeTorchError, match=message):
        parse_etrecord(bad).graph_map["lowered/forward"]
