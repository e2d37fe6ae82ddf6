"""A hostile ETRecord, built as an attacker builds it (edit a reference graph entry, recompute the manifest):
an added ``aten::from_file`` node is refused with a typed error naming it, and no file is touched."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.devtools.etrecord._reference import resolve_target
from edgetorch.errors import EdgeTorchError, ETRecordFormatError
from edgetorch.runtime import ops as runtime_ops
from tests.fuzz.fuzzlib import build_artifacts, edit_etrecord_json


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return build_artifacts(str(tmp_path_factory.mktemp("hostile_etrecord")))


def _edit_reference(data: bytes, entry: str, edit) -> bytes:
    return edit_etrecord_json(data, entry, edit)  # the manifest matches: only the graph checks can refuse it


def _add_file_write(victim: str, n: int):
    def edit(doc: dict) -> None:
        nodes = doc["nodes"]
        at = next(i for i, nd in enumerate(nodes) if nd["op"] == "call_function")
        meta = {"val": {"dtype": "uint8", "shape": [n]}}
        nodes[at:at] = [
            {"op": "call_function", "name": "evil_map", "target": "aten::from_file.default",
             "args": [victim, True, n], "kwargs": {"dtype": {"dtype": "uint8"}}, "meta": meta},
            {"op": "call_function", "name": "evil_fill", "target": "aten::fill_.Scalar",
             "args": [{"node": "evil_map"}, 65], "kwargs": {}, "meta": meta},
        ]
    return edit


def test_reference_graph_with_from_file_is_refused_and_no_file_is_touched(artifacts, tmp_path):
    """The issue's attack: ``from_file(victim, shared=True)`` + ``fill_`` overwrote the file during
    ``calculate_numeric_gap``."""
    entry = "reference/0.json"
    with open(artifacts["etrecord"], "rb") as f:
        data = f.read()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious" * 8)
    before = os.stat(victim)
    bad = _edit_reference(data, entry, _add_file_write(str(victim), 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(EdgeTorchError, match="evil_map.*aten::from_file.default"):
            insp = Inspector(etdump_path=artifacts["etdp"], etrecord=parse_etrecord(bad),
                             debug_buffer_path=artifacts["debug_buffer"])
            insp.calculate_numeric_gap("MSE")
    assert victim.read_bytes() == b"precious" * 8
    assert os.stat(victim).st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("entry", ["reference/0.json", "edge_reference/0.json"])
def test_reference_graph_loader_names_the_refused_node(artifacts, tmp_path, entry):
    with open(artifacts["etrecord"], "rb") as f:
        data = f.read()
    bad = _edit_reference(data, entry, _add_file_write(str(tmp_path / "v"), 8))
    rec = parse_etrecord(bad)
    with pytest.raises(ETRecordFormatError, match="node 'evil_map'.*aten::from_file.default.*allow-list") as e:
        rec.reference_graph("forward") if entry.startswith("reference") else rec.edge_reference_graph("forward")
    assert e.value.field == entry
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("target", ["aten::from_file.default", "aten::set_.source_Storage", "aten::_print.default",
                                    "prims::add.default", "profiler::_record_function_enter_new.default",
                                    "debugprims::load_tensor.default", "aten::resize_.default",
                                    "quantized::add.default"])
def test_targets_outside_the_allow_list_do_not_resolve(target):
    from edgetorch.devtools.etrecord._reference import GraphDataError

    with pytest.raises(GraphDataError):
        resolve_target(target)


def test_empty_allocations_resolve_in_a_reference_graph():
    """A model's ``empty_like`` + ``copy_`` (MoE experts) is in its reference graph; the Inspector never compares
    such an allocation and replays from the runtime's bytes (tests/devtools/test_filled_later.py)."""
    assert resolve_target("aten::empty.memory_format") is torch.ops.aten.empty.memory_format
    assert resolve_target("aten::empty_like.default") is torch.ops.aten.empty_like.default


def test_registered_operator_resolves_in_a_reference_graph():
    lib = torch.library.Library("edgetorch_test_i23_ref", "DEF")
    lib.define("plus_one(Tensor x) -> Tensor")
    lib.impl("plus_one", lambda x: x + 1, "CompositeExplicitAutograd")
    op = torch.ops.edgetorch_test_i23_ref.plus_one.default
    from edgetorch.devtools.etrecord._reference import GraphDataError

    with pytest.raises(GraphDataError):
        resolve_target("edgetorch_test_i23_ref::plus_one.default")
    runtime_ops.register_operator(op)
    try:
        assert resolve_target("edgetorch_test_i23_ref::plus_one.default") is op
    finally:
        runtime_ops.unregister_operator(op)
    with pytest.raises(GraphDataError):
        resolve_target("edgetorch_test_i23_ref::plus_one.default")


def test_an_attribute_offset_moved_by_one_byte_is_refused(artifacts):
    """An attribute's offset moved inside the tensor blob (unaligned, inside a float): every weight would shift."""
    with open(artifacts["etrecord"], "rb") as f:
        data = f.read()

    def edit(doc: dict) -> None:
        doc["attrs"][0]["tensor"]["offset"] += 1

    bad = _edit_reference(data, "reference/0.json", edit)
    with pytest.raises(ETRecordFormatError, match="offset 1 is not a multiple of 64"):
        parse_etrecord(bad).reference_graph("forward")


def test_a_stored_program_calls_no_higher_order_op_but_cond_and_the_delegate_call():
    """A higher-order operator runs callables the file names: only ``cond`` (branches held by the program) and
    the delegate call pass the load check; ``while_loop`` (and ``map``, ``auto_functionalized``...) is refused
    by name."""
    from torch._higher_order_ops.while_loop import while_loop

    from edgetorch.devtools.etrecord._program_serde import ProgramDataError, check_program_targets

    class Loop(torch.nn.Module):
        def forward(self, x):
            return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2), (torch.tensor(0), x))[1]

    class Branch(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda y: y * 2, lambda y: y - 1, (x,))

    x = torch.randn(4)
    with pytest.raises(ProgramDataError, match="while_loop"):
        check_program_targets(torch.export.export(Loop(), (x,)))
    check_program_targets(torch.export.export(Branch(), (x,)))  # cond: allowed, its branches checked too
