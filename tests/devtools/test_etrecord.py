"""Tests for edgetorch.devtools.etrecord: capture through exir, save/parse round trips, and hostile files."""

from __future__ import annotations

import builtins
import io
import json
import pickle
import sys
import types
import zipfile

import pytest
import torch
from torch import nn

from edgetorch.devtools.etrecord import (
    MARKER,
    ETRecord,
    ETRecordError,
    ETRecordFormatError,
    ForeignContainer,
    generate_etrecord,
    parse_etrecord,
)
from edgetorch.devtools.etrecord._tensors import is_dense
from edgetorch.errors import FormatError
from edgetorch.exir import to_edge
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.models.two_method import build_two_method, two_method_example_inputs
from tests.fuzz.fuzzlib import reseal_etrecord


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("bias2", torch.linspace(0, 1, 4))
        self.register_buffer("scale", torch.full((4,), 0.5), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.fc(x)) + self.bias2
        return torch.sigmoid(y * self.scale + torch.tensor([1.0, 2.0, 3.0, 4.0]))


class _Method(nn.Module):
    def __init__(self, model: nn.Module, name: str) -> None:
        super().__init__()
        self.model = model
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model, self.name)(x)


def _small_pipeline():
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    ep = torch.export.export(Small().eval(), (x,))
    edge = to_edge(ep, generate_etrecord=True)
    return x, ep, edge, edge.to_executorch()


def _graph_sig(ep) -> list[tuple]:
    return [(n.name, n.op, str(n.target), get_debug_handle(n)) for n in ep.graph.nodes]


def _graph_meta(ep) -> list[tuple]:
    return [(n.name, n.meta.get("stack_trace"), n.meta.get("nn_module_stack"), n.meta.get("custom"))
            for n in ep.graph.nodes]


def _graph_snapshot(ep) -> list[tuple]:
    return [(n.name, n.op, str(n.target), repr(n.args), repr(n.kwargs), repr(n.meta.get("custom")),
             n.meta.get("stack_trace")) for n in ep.graph.nodes]


def _maps(rec: ETRecord) -> tuple:
    return (rec.handle_groups, rec.debug_handle_map, rec.delegate_map, rec.program_hash, rec.memory_plan)


def _bit_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):  # same dtype, shape, bytes; same strides unless a was a strided view
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and (a.stride() == b.stride() or not is_dense(list(a.shape), list(a.stride())))
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_bit_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_bit_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _parse_all(source) -> ETRecord:
    """``parse_etrecord`` plus every part it reads lazily (reference graphs, handle tables, programs), so that
    any problem in the file surfaces here."""
    rec = parse_etrecord(source)
    for m in rec._lazy.references:
        rec.reference_graph(m)
    for m in rec._lazy.edge_references:
        rec.edge_reference_graph(m)
    for m in rec._lazy.handles:
        rec.handle_table(m)
    assert rec.exported_programs is not None and rec.edge_programs is not None and rec.graph_map is not None
    return rec


@pytest.fixture(scope="module")
def small():
    return _small_pipeline()


@pytest.fixture(scope="module")
def small_record(small):
    x, _, _, et = small
    rec = et.get_etrecord()
    rec.update_representative_inputs((x,))
    rec.update_reference_outputs([et.exported_program().module()(x)])
    return rec


@pytest.fixture(scope="module")
def small_bytes(small_record) -> bytes:
    return small_record.to_bytes()


# --- capture ---------------------------------------------------------------------------------------------------

def test_capture_single_method(small):
    x, ep, edge, et = small
    rec = et.get_etrecord()
    assert rec.exported_program is ep and rec.exported_programs == {"forward": ep}
    assert rec.edge_dialect_program is edge.exported_program("forward")
    assert rec.methods == ["forward"]
    assert rec.debug_handle_map == et.debug_handle_map
    assert all(isinstance(k, int) for d in rec.debug_handle_map.values() for k in d)
    assert rec.delegate_map == {"forward": {}} and rec.handle_groups == et.handle_groups
    assert rec.program_hash == et.content_hash and len(rec.program_hash) == 64
    assert rec.memory_plan == et.memory_plan_report()
    # every emitted handle is a handle of the edge graph
    edge_handles = {get_debug_handle(n) for n in rec.edge_dialect_program.graph.nodes} - {None}
    assert set(rec.debug_handle_map["forward"].values()) <= edge_handles
    # the EdgeProgramManager keeps plain stage history, no record; the record is built once
    assert edge.stage_history.edge == {"forward": rec.edge_dialect_program} and et.get_etrecord() is rec
    assert not hasattr(edge, "_etrecord") and not hasattr(et.stage_history, "handle_groups")


def test_to_executorch_does_not_mutate_captured_programs():
    torch.manual_seed(0)
    ep = torch.export.export(Small().eval(), (torch.randn(2, 8),))
    edge = to_edge(ep, generate_etrecord=True)
    before_edge = _graph_snapshot(edge.stage_history.edge["forward"])
    before_aten = _graph_snapshot(edge.stage_history.aten["forward"])
    state = {k: v.clone() for k, v in edge.stage_history.edge["forward"].state_dict.items()}
    rec = edge.to_executorch().get_etrecord()
    assert rec.edge_dialect_program is edge.stage_history.edge["forward"]  # kept by reference, no deepcopy
    assert _graph_snapshot(rec.edge_dialect_program) == before_edge
    assert _graph_snapshot(rec.exported_program) == before_aten
    assert all(torch.equal(state[k], v) for k, v in rec.edge_dialect_program.state_dict.items())


def test_two_method_capture_and_round_trip(tmp_path):
    model = build_two_method()
    inputs = two_method_example_inputs()
    eps = {m: torch.export.export(_Method(model, m), inputs[m]) for m in ("forward", "encode")}
    et = to_edge(eps, generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    assert set(rec.exported_programs) == {"forward", "encode"} and rec.exported_program is eps["forward"]
    assert isinstance(rec.edge_dialect_program, dict) and set(rec.edge_dialect_program) == {"forward", "encode"}
    assert set(rec.debug_handle_map) == {"forward", "encode"}
    rec.update_representative_inputs({m: inputs[m] for m in inputs})
    rec.save(tmp_path / "two.etrecord")
    back = parse_etrecord(tmp_path / "two.etrecord")
    assert _maps(back) == _maps(rec)
    assert set(back.exported_programs) == {"forward", "encode"}
    for m in ("forward", "encode"):
        assert _graph_sig(back.edge_programs[m]) == _graph_sig(rec.edge_programs[m])
        assert _graph_sig(back.exported_programs[m]) == _graph_sig(rec.exported_programs[m])
        assert _bit_equal(rec._representative_inputs[m], back._representative_inputs[m])
        x = inputs[m][0]
        assert torch.equal(back.edge_programs[m].module()(x), rec.edge_programs[m].module()(x))


# --- round trip ------------------------------------------------------------------------------------------------

def test_round_trip_equality(small, small_record, tmp_path):
    x = small[0]
    path = tmp_path / "small.etrecord"
    small_record.save(path)
    back = parse_etrecord(path)
    # maps with int keys, hash, memory plan: identical to the in-memory record
    assert _maps(back) == _maps(small_record)
    assert all(isinstance(k, int) for d in back.debug_handle_map.values() for k in d)
    assert _bit_equal(small_record._representative_inputs, back._representative_inputs)
    assert _bit_equal(small_record._reference_outputs, back._reference_outputs)
    # edge and ATen graphs: names, targets, debug handles, stack traces, module stacks
    for a, b in ((small_record.edge_dialect_program, back.edge_dialect_program),
                 (small_record.exported_program, back.exported_program)):
        assert _graph_sig(b) == _graph_sig(a)
        assert _graph_meta(b) == _graph_meta(a)
        ops = [n for n in b.graph.nodes if n.op == "call_function"]
        assert ops and all(get_debug_handle(n) for n in ops)
        assert all(n.meta.get("stack_trace") and n.meta.get("nn_module_stack") for n in ops)
        assert torch.equal(b.module()(x), a.module()(x))
        assert {k: (type(v), v.requires_grad) for k, v in b.state_dict.items()} == \
            {k: (type(v), v.requires_grad) for k, v in a.state_dict.items()}
    # a weight shared by the ATen and the edge program is stored once and shared again after loading
    assert back.exported_program.state_dict["fc.weight"] is back.edge_dialect_program.state_dict["fc.weight"]
    # saving the parsed record gives the same bytes
    assert back.to_bytes() == small_record.to_bytes()
    buf = io.BytesIO()  # file objects work both ways
    back.save(buf)
    buf.seek(0)
    assert buf.getvalue() == path.read_bytes() and _maps(parse_etrecord(buf)) == _maps(small_record)


def test_in_memory_and_parsed_records_behave_the_same(small_record, small_bytes):
    back = parse_etrecord(small_bytes)
    for rec in (small_record, back):
        m = rec.debug_handle_map["forward"]
        assert m[0] == small_record.debug_handle_map["forward"][0]
        assert rec.handle_groups == small_record.handle_groups and rec.methods == ["forward"]
    assert repr(back) == repr(small_record)


def test_delegate_tables_and_sample_types_round_trip(small):
    x, ep, edge, _ = small
    rec = ETRecord(edge_dialect_program=edge.exported_program(),
                   _debug_handle_map={"forward": {0: 3, 1: (4, 5, 6)}},
                   _delegate_map={"forward": {1: {"name": "FakeBackend", "delegate_map": {0: (4, 5), "fused": [6],
                                                                                         7: []}}}},
                   program_hash="ab" * 32)
    assert rec.debug_handle_map["forward"][1] == [4, 5, 6]  # tuples normalised in memory too
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    samples = [
        (base.permute(2, 0, 1), torch.tensor([True, False]), torch.zeros(0, 3, dtype=torch.int64), 3, None),
        (base.to(torch.bfloat16)[:, 1], torch.tensor(float("nan")), {"k": [1.5, float("-inf"), "s"]}),
    ]
    rec.update_representative_inputs({"forward": samples})
    rec.update_reference_outputs({"forward": [base.to(torch.float16), (base.to(torch.complex64),)]})
    back = parse_etrecord(rec.to_bytes())
    assert _maps(back) == _maps(rec)
    ids = list(back.delegate_map["forward"][1]["delegate_map"])
    assert ids == [0, "fused", 7] and isinstance(ids[0], int)
    assert _bit_equal(rec._representative_inputs, back._representative_inputs)
    assert _bit_equal(rec._reference_outputs, back._reference_outputs)
    assert back._representative_inputs["forward"][0][0].stride() == base.permute(2, 0, 1).stride()


def test_update_inputs_forms(small_record):
    rec = small_record.copy()
    x = torch.ones(2, 8)
    rec.update_representative_inputs([x])
    assert torch.equal(rec._representative_inputs["forward"][0][0], x)
    rec.update_representative_inputs([(x,), (x + 1,)])
    assert len(rec._representative_inputs["forward"]) == 2
    suite = types.SimpleNamespace(method_name="encode", test_cases=[
        types.SimpleNamespace(inputs=[x], expected_outputs=[x * 2]),
        types.SimpleNamespace(inputs=[x + 1], expected_outputs=[x * 3])])
    bundled = types.SimpleNamespace(method_test_suites=[suite])
    rec.update_representative_inputs(bundled)
    rec.update_reference_outputs(bundled)
    assert len(rec._representative_inputs["encode"]) == 2 and set(rec._representative_inputs) == {"forward", "encode"}
    assert torch.equal(rec._reference_outputs["encode"][1][0], x * 3)
    assert set(small_record._representative_inputs) == {"forward"}  # copy() did not share containers
    assert len(small_record._representative_inputs["forward"]) == 1
    bad = types.SimpleNamespace(method_test_suites=[types.SimpleNamespace(
        method_name="forward", test_cases=[types.SimpleNamespace(inputs=[x], expected_outputs=None)])])
    with pytest.raises(ETRecordError, match="no expected outputs"):
        rec.update_reference_outputs(bad)


def test_generate_etrecord_one_shot_and_extra_modules(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    ep = torch.export.export(Small().eval(), (x,))
    edge = to_edge(ep)
    et = edge.to_executorch()
    other = torch.export.export(nn.Linear(8, 2), (x,))
    path = tmp_path / "one_shot.etrecord"
    generate_etrecord(path, edge, et, export_modules={"linear": other, "edge_copy": edge})
    rec = parse_etrecord(path)
    assert set(rec.graph_map) == {"linear/forward", "edge_copy/forward"}
    assert set(rec.exported_programs) == {"forward"}  # taken from the EdgeProgramManager
    assert rec.debug_handle_map == et.debug_handle_map and rec.program_hash == et.content_hash
    assert _graph_sig(rec.graph_map["edge_copy/forward"]) == _graph_sig(edge.exported_program())
    assert torch.equal(rec.graph_map["linear/forward"].module()(x), other.module()(x))
    with pytest.raises(ETRecordError, match="without '/'"):
        rec.add_extra_export_modules({"a/b": other})


def test_graph_map_hook_and_dedup(small):
    _, _, edge, et = small
    rec = et.get_etrecord().copy()
    rec.add_extra_export_modules({"edge_after_transform": edge})
    assert rec.graph_map["edge_after_transform/forward"] is rec.edge_dialect_program
    data = rec.to_bytes()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert sum(n.endswith("exported_program.json") for n in names) == 2  # ATen + edge, the alias stored once
    back = parse_etrecord(data)
    assert back.graph_map["edge_after_transform/forward"] is back.edge_dialect_program


def test_save_refuses_incomplete_records(small, tmp_path):
    _, ep, edge, _ = small
    with pytest.raises(ETRecordError, match="edge dialect program"):
        ETRecord().save(tmp_path / "a.etrecord")
    edge_only = ETRecord(exported_programs=dict(edge.stage_history.aten), edge_dialect_program=edge)
    with pytest.raises(ETRecordError, match="handle groups"):
        edge_only.save(tmp_path / "b.etrecord")
    assert not list(tmp_path.iterdir())
    with pytest.raises(ETRecordError, match="already set"):
        edge_only.copy().add_edge_dialect_program(edge)


# --- hostile and broken files ----------------------------------------------------------------------------------

_FLAG = "_edgetorch_etrecord_test_pwned"


class _Evil:
    """Unpickling this runs code: writes a marker file and sets a builtins flag."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        code = f"open({self.marker!r}, 'w').write('pwned'); import builtins; builtins.{_FLAG} = True"
        return (exec, (code,))


def _rezip(data: bytes, replace: dict[str, bytes] | None = None, drop: tuple[str, ...] = (),
           add: dict[str, bytes] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if info.filename in drop:
                continue
            dst.writestr(info.filename, (replace or {}).get(info.filename, src.read(info)))
        for name, blob in (add or {}).items():
            dst.writestr(name, blob)
    if "manifest.json" in (replace or {}):
        return out.getvalue()
    return reseal_etrecord(out.getvalue())  # edited on purpose: checksums updated to reach the deeper checks


@pytest.fixture()
def no_unpickling(monkeypatch):
    calls = []

    def forbidden(*a, **k):
        calls.append(a[:1])
        raise AssertionError("ETRecord parsing must never unpickle")

    for mod, attr in ((pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (torch, "load"),
                      (torch._C, "_pickle_load_obj")):
        monkeypatch.setattr(mod, attr, forbidden)
    yield calls
    assert not calls


def test_every_entry_replaced_by_a_pickle_fails_cleanly(small_bytes, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    payloads = {"pickle": pickle.dumps(_Evil(str(marker)), protocol=2)}
    buf = io.BytesIO()
    torch.save({"x": _Evil(str(marker))}, buf)
    payloads["torch.save"] = buf.getvalue()
    probe = tmp_path / "probe"  # the payload is live: unpickling it does write its marker
    pickle.loads(pickle.dumps(_Evil(str(probe))))
    assert probe.exists()
    monkeypatch.delattr(builtins, _FLAG)

    names = zipfile.ZipFile(io.BytesIO(small_bytes)).namelist()
    assert MARKER in names and len(names) >= 10
    assert {"reference/index.json", "reference/0.json", "handles/index.json", "handles/0.json",
            "edge_reference/index.json", "edge_reference/0.json"} <= set(names)
    for kind, payload in payloads.items():
        for name in names:
            bad = _rezip(small_bytes, replace={name: payload})
            with pytest.raises(ETRecordFormatError) as ei:
                _parse_all(bad)
            assert ei.value.field == name, (kind, name, str(ei.value))
            assert name in str(ei.value)
            assert not marker.exists() and not hasattr(builtins, _FLAG), (kind, name)


def test_parsing_never_calls_an_unpickler(small_bytes, no_unpickling):
    assert _parse_all(small_bytes).program_hash
    with pytest.raises(ETRecordFormatError):
        parse_etrecord(_rezip(small_bytes, replace={"tensors.bin": pickle.dumps([1, 2, 3])}))


def _edit_program_json(data: bytes, entry: str, edit) -> bytes:
    doc = json.loads(zipfile.ZipFile(io.BytesIO(data)).read(entry))
    edit(doc)
    return _rezip(data, replace={entry: json.dumps(doc).encode()})


_GRAPH = "programs/1/exported_program.json"


def test_symbolic_expression_injection_is_refused(small_bytes, tmp_path, no_unpickling):
    marker = tmp_path / "sympy_pwned"
    code = f"__import__('builtins').open({str(marker)!r}, 'w').write('x') or 2"

    def edit(doc):
        tv = doc["graph_module"]["graph"]["tensor_values"]
        first = next(iter(tv.values()))
        first["sizes"][0] = {"as_expr": {"expr_str": code, "hint": {"as_int": 2}}}

    with pytest.raises(ETRecordFormatError, match="not allowed") as ei:
        _parse_all(_edit_program_json(small_bytes, _GRAPH, edit))
    assert ei.value.field == _GRAPH and not marker.exists()


def test_non_operator_targets_are_refused(small_bytes):
    for target in ("torch.os.system", "torch.load", "builtins.exec", "torch.ops.aten.__class__"):
        def edit(doc, target=target):
            node = next(n for n in doc["graph_module"]["graph"]["nodes"] if n["target"].startswith("torch.ops"))
            node["target"] = target

        with pytest.raises(ETRecordFormatError, match="not an operator") as ei:
            _parse_all(_edit_program_json(small_bytes, _GRAPH, edit))
        assert ei.value.field == _GRAPH


def test_treespec_imports_are_refused(small_bytes):
    spec = json.dumps([1, {"type": "builtins.dict", "context": json.dumps(
        [{"__enum__": True, "fqn": "antigravity:X", "name": "Y"}]), "children_spec": [
            {"type": None, "context": None, "children_spec": []}]}])

    def edit(doc):
        doc["graph_module"]["module_call_graph"][0]["signature"]["in_spec"] = spec

    with pytest.raises(ETRecordFormatError, match="enum") as ei:
        _parse_all(_edit_program_json(small_bytes, _GRAPH, edit))
    assert ei.value.field == _GRAPH

    # a defaultdict names its factory (torch would import it): stored by name only, never looked up
    inputs = json.loads(zipfile.ZipFile(io.BytesIO(small_bytes)).read("representative_inputs.json"))
    n_leaves = len(inputs["forward"][0]["leaves"])
    dd = json.dumps([1, {"type": "collections.defaultdict", "context": json.dumps(
        {"default_factory_module": "antigravity", "default_factory_name": "fly", "dict_context": list(
            range(n_leaves))}),
        "children_spec": [{"type": None, "context": None, "children_spec": []}] * n_leaves}])
    inputs["forward"][0]["spec"] = dd
    bad = _rezip(small_bytes, replace={"representative_inputs.json": json.dumps(inputs).encode()})
    rec = parse_etrecord(bad)
    got = rec.representative_inputs["forward"][0]
    assert isinstance(got, ForeignContainer) and got.type_name == "collections.defaultdict"
    assert len(got) == n_leaves and "antigravity" not in sys.modules


def test_bad_tensor_records_are_refused(small_bytes):
    zf = zipfile.ZipFile(io.BytesIO(small_bytes))
    index = json.loads(zf.read("programs/1/tensors.json"))
    cases = {
        "overlap": lambda r: r.update(strides=[0] * len(r["shape"])),
        "past the blob": lambda r: r.update(offset=10**9),
        "nbytes": lambda r: r.update(nbytes=r["nbytes"] + 1),
        "unknown dtype": lambda r: r.update(dtype="object"),
        "bad shape": lambda r: r.update(shape=[-1, 2]),
    }
    for what, change in cases.items():
        doc = json.loads(json.dumps(index))
        change(doc["state_dict"][0]["tensor"])
        bad = _rezip(small_bytes, replace={"programs/1/tensors.json": json.dumps(doc).encode()})
        with pytest.raises(ETRecordFormatError) as ei:
            _parse_all(bad)
        assert ei.value.field == "programs/1/tensors.json", what


def test_broken_archives(small_bytes, tmp_path):
    cases = {
        "not a zip": b"definitely not a zip file" * 10,
        "empty": b"",
        "truncated": small_bytes[: len(small_bytes) // 2],
        "no marker": _rezip(small_bytes, drop=(MARKER,)),
        "upstream": _rezip(small_bytes, drop=(MARKER,), add={"ETRECORD_V0": b""}),
        "future marker": _rezip(small_bytes, drop=(MARKER,), add={"ETRECORD_EDGETORCH_V2": b"{}"}),
        "unknown version": _rezip(small_bytes, replace={MARKER: json.dumps(
            {"format": "edgetorch.etrecord", "version": 99}).encode()}),
        "missing entry": _rezip(small_bytes, drop=("debug_handle_map.json",)),
    }
    with pytest.warns(UserWarning, match="Duplicate name"):
        cases["duplicate entry"] = _rezip(small_bytes, add={"record.json": b"{}"})
    expect = {"not a zip": "not a readable zip", "empty": "not a readable zip", "truncated": "not a readable zip",
              "no marker": "marker", "upstream": "ExecuTorch ETRecord", "future marker": "version",
              "unknown version": "version 99", "missing entry": "missing the entry",
              "duplicate entry": "more than once"}
    for what, data in cases.items():
        path = tmp_path / f"{what.replace(' ', '_')}.etrecord"
        path.write_bytes(data)
        with pytest.raises(ETRecordFormatError, match=expect[what]) as ei:
            parse_etrecord(path)
        assert isinstance(ei.value, FormatError) and ei.value.path == str(path), what
    # corrupted bytes inside an entry (CRC mismatch) name that entry
    zf = zipfile.ZipFile(io.BytesIO(small_bytes))
    info = zf.getinfo("tensors.bin")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    corrupt = bytearray(small_bytes)
    corrupt[start + 5] ^= 0xFF
    with pytest.raises(ETRecordFormatError, match="cannot be read") as ei:
        parse_etrecord(bytes(corrupt))
    assert ei.value.field == "tensors.bin"


def test_dynamic_shape_program_round_trips():
    from torch.export import Dim

    class Cat(nn.Module):
        def forward(self, x, y):
            z = torch.cat([x, y], 0)
            return z.reshape(-1)[1:] * z.shape[0] + x.sum()

    ep = torch.export.export(Cat(), (torch.randn(4, 3), torch.randn(5, 3)),
                             dynamic_shapes=({0: Dim("b", min=2, max=64)}, {0: Dim("c", max=100)}))
    rec = ETRecord(edge_dialect_program=ep, _debug_handle_map={"forward": {}})
    back = parse_etrecord(rec.to_bytes())
    x, y = torch.randn(7, 3), torch.randn(2, 3)
    assert torch.equal(back.edge_dialect_program.module()(x, y), ep.module()(x, y))
    assert sorted(str(v) for v in back.edge_dialect_program.range_constraints.values()) == \
        sorted(str(v) for v in ep.range_constraints.values())


def test_symbolic_expression_check():
    from edgetorch.devtools.etrecord._program_serde import ProgramDataError, check_sym_expr

    s0 = "Symbol('s0', positive=True, integer=True)"
    for ok in (s0, f"Pow({s0}, Integer(2))", f"Add(Mul(Integer(3), {s0}), Integer(-1))",
               f"Mul(Float('1.5', precision=53), {s0})", f"FloorDiv({s0}, Integer(2))", "s0 + 2*u1",
               f"Piecewise(ExprCondPair({s0}, StrictGreaterThan({s0}, Integer(3))), ExprCondPair(Integer(1), true))"):
        check_sym_expr(ok)
    for bad in ("__import__('os').system('x')", f"{s0}.__class__", "Symbol('os')", "lambda: 1", "[1][0]",
                "Integer(10)**Integer(10)**Integer(99)", "Pow(Integer(10), Integer(99999))",
                "Float('1', precision=1000000000)", "getattr(Integer(1), 'x')", "Symbol(*'s0')", "eval('1')",
                "Integer(1) if s0 else s0", "f'{s0}'", 42, "x" * 70000):
        with pytest.raises(ProgramDataError):
            check_sym_expr(bad)


def test_delegated_program_capture_and_round_trip():
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.exir.backend.backend_details import BackendDetails, PreprocessResult, register_backend_details
    from edgetorch.exir.backend.partitioner import DELEGATION_TAG, DelegationSpec, Partitioner, PartitionResult

    @register_backend_details
    class _RecordBackend(BackendDetails):
        backend_id = "EtrecordTestBackend"

        @classmethod
        def preprocess(cls, edge_program, compile_specs):
            hs = [get_debug_handle(n) for n in edge_program.graph.nodes if n.op == "call_function"]
            return PreprocessResult(b"blob", {0: tuple(hs[:1]), "fused": tuple(hs)})

    class _Relu(Partitioner):
        def partition(self, ep):
            for n in ep.graph.nodes:
                if n.op == "call_function" and "relu" in str(n.target):
                    n.meta[DELEGATION_TAG] = "tag0"
            return PartitionResult(ep, {"tag0": DelegationSpec("EtrecordTestBackend")})

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    ep = torch.export.export(Small().eval(), (x,))
    epm = to_edge_transform_and_lower(ep, partitioner=[_Relu()], generate_etrecord=True)
    rec = epm.to_executorch().get_etrecord()
    # the record keeps the edge program from before lowering, untouched by to_backend and to_executorch
    targets = [str(n.target) for n in rec.edge_dialect_program.graph.nodes]
    assert "aten.relu.default" in targets and not any("call_delegate" in t for t in targets)
    assert not any(DELEGATION_TAG in n.meta for n in rec.edge_dialect_program.graph.nodes)
    (iid, entry), = rec.delegate_map["forward"].items()
    assert entry["name"] == "EtrecordTestBackend" and set(entry["delegate_map"]) == {0, "fused"}
    assert isinstance(rec.debug_handle_map["forward"][iid], list) and rec.delegate_outputs["forward"][iid]
    back = parse_etrecord(rec.to_bytes())
    assert _maps(back) == _maps(rec)
    assert _graph_sig(back.edge_dialect_program) == _graph_sig(rec.edge_dialect_program)
    _old_forms_load_as_the_same_groups(rec)
    # the .pte agrees with the record: a kernel carries its group's handle, a delegate call none (0)
    et = epm.to_executorch()
    kinds = {g.instruction_id: g for g in et.handle_groups["forward"] if g.kind != "in_delegate"}
    for i, ins in enumerate(et.program.plan("forward").instructions):
        g = kinds.get(i)
        assert ins.debug_handle == (g.handles[0] if g is not None and g.kind == "kernel" else 0)


def _old_forms_load_as_the_same_groups(rec: ETRecord) -> None:
    """A record written before the handle groups (three tables, 0 for "no handle") reads into the same groups."""
    def by_id(d):
        return {m: {str(i): v for i, v in t.items()} for m, t in d.items()}

    hmap = {m: {**t, 99: 0} for m, t in rec.debug_handle_map.items()}  # an instruction without a handle
    dmap = {m: {i: {"name": e["name"], "delegate_map": [[k, v] for k, v in e["delegate_map"].items()]}
                for i, e in t.items()} for m, t in rec.delegate_map.items()}
    old = _rezip(rec.to_bytes(), replace={"debug_handle_map.json": json.dumps(by_id(hmap)).encode()},
                 add={"delegate_map.json": json.dumps(by_id(dmap)).encode(),
                      "delegate_outputs.json": json.dumps(by_id(rec.delegate_outputs)).encode(),
                      "instruction_id_to_num_outs_map.json": b'{"forward": {}}'})
    back = parse_etrecord(old)
    assert back.handle_groups == rec.handle_groups
    assert parse_etrecord(_rezip(old, drop=("delegate_outputs.json",))).delegate_outputs == {"forward": {}}
    with pytest.raises(ETRecordFormatError) as ei:
        parse_etrecord(_rezip(old, replace={"delegate_map.json": b'{"forward": {"0": {"name": 1}}}'}))
    assert ei.value.field == "delegate_map.json"


def test_one_handle_parser_refuses_bools_and_zero():
    from edgetorch.formats.handles import HandleGroup, parse_handle

    assert [parse_handle(h) for h in (3, 0, -1, True, "3", None)] == [3, None, None, None, None, None]
    g = HandleGroup("delegate_call", 4, (1, 2), None, "b", ((2, 0), None))
    assert HandleGroup.from_json(json.loads(json.dumps(g.to_json()))) == g
    for bad in (["kernel", 0, [True], None, None, None], ["kernel", 0, [0], None, None, None],
                ["in_delegate", 0, [1], None, "b", None], ["kernel", 0, [1], None, None, [[1, 0]]],
                ["kernel", -1, [1], None, None, None], ["nope", 0, [1], None, None, None]):
        with pytest.raises(ValueError):
            HandleGroup.from_json(bad)
    node = torch.fx.Graph().create_node("call_function", torch.relu)
    node.meta["custom"] = {"debug_handle": True}
    assert get_debug_handle(node) is None
