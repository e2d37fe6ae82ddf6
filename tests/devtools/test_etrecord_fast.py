"""Fast, lazy ETRecord loading: reference graphs, handle tables, the file mapping, lazy programs and hostile
content in the new entries."""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

from edgetorch.devtools.etrecord import ETRecord, ETRecordFormatError, NodeInfo, parse_etrecord
from edgetorch.devtools.etrecord._tensors import ALIGNMENT
from edgetorch.exir import to_edge
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.exir.op_variants import is_view_op
from edgetorch.models import get_spec, method_module
from tests.fuzz.fuzzlib import reseal_etrecord

ZOO = ("mlp", "small_cnn", "transformer_encoder", "multi_output", "two_method")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _build(name: str):
    spec = get_spec(name)
    model = spec.build()
    inputs = spec.example_inputs()
    eps = {m: torch.export.export(method_module(model, m) if m != "forward" else model, inputs[m])
           for m in inputs}
    et = to_edge(eps, generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs({m: inputs[m] for m in inputs})
    return model, inputs, eps, rec


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    out = {}
    for name in ZOO:
        model, inputs, eps, rec = _build(name)
        path = tmp_path_factory.mktemp("zoo") / f"{name}.etrecord"
        rec.save(path)
        out[name] = (model, inputs, eps, rec, path)
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _same_bits(a, b) -> bool:
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    return len(la) == len(lb) and all(
        isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
        and torch.equal(_bits(x), _bits(y)) for x, y in zip(la, lb, strict=True))


def _op_meta(gm_or_ep) -> list[tuple]:
    return [(n.name, str(n.target), get_debug_handle(n), n.meta.get("custom"), n.meta.get("stack_trace"),
             {k: tuple(v) for k, v in (n.meta.get("nn_module_stack") or {}).items()})
            for n in gm_or_ep.graph.nodes if n.op == "call_function"]


def _expected_handles(ep) -> dict[int, list[NodeInfo]]:
    out: dict[int, list[NodeInfo]] = {}
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target.__name__ == "getitem" or get_debug_handle(n) is None:
            continue
        t = n.target
        stack = n.meta.get("nn_module_stack")
        out.setdefault(get_debug_handle(n), []).append(NodeInfo(
            n.name, t._schema.name if isinstance(t, torch._ops.OpOverload) else t.__name__,
            n.meta.get("stack_trace"), None if not stack else {k: tuple(v) for k, v in stack.items()},
            isinstance(t, torch._ops.OpOverload) and is_view_op(t)))
    return out


# --- round trips on the zoo ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ZOO)
def test_reference_graph_and_handle_table_round_trip(zoo, name):
    model, inputs, eps, rec, path = zoo[name]
    back = parse_etrecord(path)
    assert set(back._lazy.references) == set(inputs) == set(back._lazy.handles)
    for m, x in inputs.items():
        eager = (getattr(model, m) if m != "forward" else model)(*x)
        flat = pytree.tree_leaves(x)
        mem_gm, file_gm = rec.reference_graph(m), back.reference_graph(m)
        assert isinstance(file_gm, torch.fx.GraphModule) and isinstance(mem_gm, torch.fx.GraphModule)
        # runnable, flat, unlifted: placeholders are the user inputs, weights are attributes
        assert [n.name for n in file_gm.graph.nodes if n.op == "placeholder"] == \
            [s.arg.name for s in eps[m].graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        assert not any(n.op == "placeholder" and n.name.startswith(("p_", "b_", "c_"))
                       for n in file_gm.graph.nodes)
        for gm in (mem_gm, file_gm):
            out = gm(*flat)
            assert isinstance(out, tuple) and _same_bits(out, pytree.tree_leaves(eager)), (name, m)
            assert _same_bits(out, pytree.tree_leaves(eps[m].module()(*x)))
            # every op node keeps its name, debug handle, stack trace and module stack
            assert _op_meta(gm) == _op_meta(eps[m]), (name, m)
            ops = [n for n in gm.graph.nodes if n.op == "call_function"]
            assert ops and all(get_debug_handle(n) for n in ops)
            assert all(isinstance(n.meta["nn_module_stack"], dict) and n.meta["stack_trace"] for n in ops)
            vals = {n.name: n.meta.get("val") for n in eps[m].graph.nodes if n.op == "call_function"}
            for n in ops:
                v, ref = n.meta.get("val"), vals[n.name]
                if isinstance(ref, torch.Tensor):
                    assert v.shape == ref.shape and v.dtype == ref.dtype and v.device.type == "meta"
        table = back.handle_table(m)
        assert table == rec.handle_table(m) == _expected_handles(rec.edge_programs[m])
        assert table and all(isinstance(i, NodeInfo) for infos in table.values() for i in infos)
        assert list(table) == list(_expected_handles(rec.edge_programs[m]))  # graph order of first appearance
    # nothing above deserialized a program
    assert not any(back._is_loaded(r) for r in ETRecord._ROLES)
    assert back.methods == sorted(inputs) and "ETRecord(" in repr(back)
    assert not any(back._is_loaded(r) for r in ETRecord._ROLES)


def test_views_follow_program_changes(zoo):
    model, inputs, eps, rec, path = zoo["mlp"]
    back = parse_etrecord(path)
    gm = back.reference_graph()
    assert back.reference_graph() is gm  # cached
    table = back.handle_table()
    assert back.exported_program is not None and back.reference_graph() is gm  # loading keeps the stored view
    other = zoo["small_cnn"][2]["forward"]
    back.exported_programs["forward"] = other  # a replaced program is described by a view rebuilt from it
    assert _op_meta(back.reference_graph()) == _op_meta(other)
    back.edge_dialect_program = zoo["small_cnn"][3].edge_programs["forward"]
    assert back.handle_table() == zoo["small_cnn"][3].handle_table() != table
    copy = parse_etrecord(path).copy()  # a copy stays lazy and shares the stored views
    assert not copy._is_loaded("aten") and copy.handle_table() == table
    with pytest.raises(KeyError):
        rec.handle_table("nope")
    assert rec.reference_graph("nope") is None and back.reference_graph("nope") is None


def test_parse_from_bytes_and_file_objects(zoo):
    model, inputs, eps, rec, path = zoo["transformer_encoder"]
    data = path.read_bytes()
    x = inputs["forward"]
    expected = pytree.tree_leaves(model(*x))
    for src in (data, io.BytesIO(data), bytearray(data), memoryview(data)):
        back = parse_etrecord(src)
        assert not back._lazy.mapped
        assert _same_bits(back.reference_graph()(*x), expected)
        assert back.handle_table() == rec.handle_table()


def test_compressed_tensor_data_from_another_writer(zoo, tmp_path):
    """A zip tool that deflated tensors.bin: the data is decompressed into memory instead of mapped."""
    model, inputs, eps, rec, path = zoo["small_cnn"]
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp_path / "deflated.etrecord", "w",
                                                       zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    back = parse_etrecord(tmp_path / "deflated.etrecord")
    assert not back._lazy.mapped
    x = inputs["forward"]
    assert _same_bits(back.reference_graph()(*x), pytree.tree_leaves(model(*x)))
    assert torch.equal(back.exported_program.module()(*x), model(*x))


def test_old_files_without_views_still_work(zoo):
    """A version-1 file written before the compact entries existed: the views are rebuilt from the programs."""
    model, inputs, eps, rec, path = zoo["mlp"]
    data = path.read_bytes()
    old = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(old, "w") as dst:
        for info in src.infolist():
            if not info.filename.startswith(("reference/", "handles/")):
                dst.writestr(info.filename, src.read(info))
    back = parse_etrecord(reseal_etrecord(old.getvalue()))
    assert back._lazy.references == {} and not back._is_loaded("aten")
    assert _same_bits(back.reference_graph()(*inputs["forward"]), pytree.tree_leaves(model(*inputs["forward"])))
    assert back.handle_table() == rec.handle_table()


# --- programs the compact schema cannot express --------------------------------------------------------------

_lib = torch.library.Library("etrecord_fast_test", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
_lib._register_fake("twice", lambda x: torch.empty_like(x))


class _CustomOp(nn.Module):
    def forward(self, x):
        return torch.ops.etrecord_fast_test.twice(torch.relu(x))


def test_unsupported_program_gets_no_reference_graph(tmp_path, caplog):
    x = torch.randn(3, 4)
    ep = torch.export.export(_CustomOp(), (x,))
    rec = ETRecord(exported_programs={"forward": ep}, edge_dialect_program=ep, _debug_handle_map={"forward": {}})
    with caplog.at_level(logging.WARNING):
        rec.save(tmp_path / "custom.etrecord")
    assert "no reference graph stored for method 'forward'" in caplog.text and "etrecord_fast_test" in caplog.text
    names = zipfile.ZipFile(tmp_path / "custom.etrecord").namelist()
    assert "reference/0.json" not in names and "handles/0.json" in names
    # an operator off the allow-list runs only once the user registered it (issue 23), never on the file's word
    from edgetorch.runtime.ops import register_operator, unregister_operator

    with caplog.at_level(logging.WARNING):
        assert rec.reference_graph() is None
    with pytest.raises(ETRecordFormatError, match="etrecord_fast_test.twice.*not an operator edgetorch runs"):
        parse_etrecord(tmp_path / "custom.etrecord").exported_program  # noqa: B018
    register_operator(torch.ops.etrecord_fast_test.twice.default)
    try:
        back = parse_etrecord(tmp_path / "custom.etrecord")
        assert back._lazy.references == {}  # nothing stored; registered, the program itself now runs
        assert torch.equal(back.exported_program.module()(x), torch.relu(x) * 2)
    finally:
        unregister_operator(torch.ops.etrecord_fast_test.twice.default)


class _Mutating(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x, acc):
        self.count.add_(1.0)
        acc.mul_(2.0)
        return self.lin(x) + self.count, acc.sum()


def test_buffer_and_input_mutations_are_replayed(tmp_path):
    x = torch.randn(2, 4)
    ep = torch.export.export(_Mutating(), (x, torch.ones(3))).run_decompositions({})  # functional form
    kinds = {s.kind.name for s in ep.graph_signature.output_specs}
    assert {"BUFFER_MUTATION", "USER_INPUT_MUTATION"} <= kinds
    pristine = copy.deepcopy(ep)
    rec = ETRecord(exported_programs={"forward": ep}, edge_dialect_program=ep, _debug_handle_map={"forward": {}})
    rec.save(tmp_path / "mut.etrecord")
    for gm in (parse_etrecord(tmp_path / "mut.etrecord").reference_graph(), rec.reference_graph()):
        ref_mod = copy.deepcopy(pristine).module()  # ExportedProgram.module() applies the same mutations
        for _ in range(3):
            a1, a2 = torch.ones(3), torch.ones(3)
            out, expected = gm(x, a1), ref_mod(x, a2)
            assert _same_bits(out, expected) and torch.equal(a1, a2) and a1[0] == 2
    # the mapped buffer is copy-on-write: the file itself is untouched
    again = parse_etrecord(tmp_path / "mut.etrecord").reference_graph()
    assert _same_bits(again(x, torch.ones(3)), copy.deepcopy(pristine).module()(x, torch.ones(3)))


def test_dynamic_shapes_reference_graph():
    from torch.export import Dim

    class Cat(nn.Module):
        def forward(self, x, y):
            z = torch.cat([x, y], 0)
            return z.reshape(-1)[1:] * z.shape[0] + x.sum()

    ep = torch.export.export(Cat(), (torch.randn(4, 3), torch.randn(5, 3)),
                             dynamic_shapes=({0: Dim("b", min=2, max=64)}, {0: Dim("c", max=100)}))
    rec = ETRecord(exported_programs={"forward": ep}, edge_dialect_program=ep, _debug_handle_map={"forward": {}})
    back = parse_etrecord(rec.to_bytes())
    gm = back.reference_graph()
    assert gm is not None
    for shapes in ((7, 2), (3, 9)):
        x, y = torch.randn(shapes[0], 3), torch.randn(shapes[1], 3)
        assert torch.equal(gm(x, y)[0], ep.module()(x, y))


# --- the file mapping ----------------------------------------------------------------------------------------

def test_tensors_are_views_of_the_file_mapping(zoo):
    model, inputs, eps, rec, path = zoo["transformer_encoder"]
    info = zipfile.ZipFile(path).getinfo("tensors.bin")
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n_name, n_extra = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    assert (info.header_offset + 30 + n_name + n_extra) % ALIGNMENT == 0  # the writer aligns the data

    back = parse_etrecord(path)
    assert back._lazy.mapped
    lo, hi = back._lazy.reader.address_range()
    assert hi - lo == info.file_size

    def inside(t: torch.Tensor) -> bool:
        return lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi

    gm = back.reference_graph()
    attrs = dict(gm.named_parameters()) | dict(gm.named_buffers())
    assert attrs and all(inside(t) for t in attrs.values())
    assert all(inside(t) for t in pytree.tree_leaves(back.representative_inputs))
    # the programs loaded later share the very same tensors
    state = back.exported_program.state_dict
    assert state and all(inside(t) for t in state.values())
    assert {id(t) for t in state.values()} <= {id(t) for t in attrs.values()}
    # copy-on-write: writing a mapped weight changes neither the file nor another parse of it
    w = next(iter(attrs.values()))
    before = w.detach().clone()
    with torch.no_grad():
        w.add_(1.0)
    again = dict(parse_etrecord(path).reference_graph().named_parameters())
    assert torch.equal(again[next(iter(attrs))], before)
    # the mapping outlives the record: tensors keep it alive
    del back, gm, attrs, state
    assert torch.isfinite(w).all()


_RSS_CHECK = textwrap.dedent("""
    import gc, json, sys, torch
    from edgetorch.devtools.etrecord import parse_etrecord
    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    gc.collect()
    before = anon()
    rec = parse_etrecord(sys.argv[1])
    gm = rec.reference_graph()
    table = rec.handle_table()
    after = anon()
    with torch.no_grad():
        gm(torch.randn(1, 2048))
    print(json.dumps({"grew": after - before, "after_run": anon() - before,
                      "serde": "torch._export.serde.serialize" in sys.modules}))
""")


def _run_py(code: str, *argv: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]))
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_parse_does_not_copy_the_weights(tmp_path):
    big = nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 2048)).eval()  # 64 MiB of weights
    x = torch.randn(1, 2048)
    rec = to_edge(torch.export.export(big, (x,)), generate_etrecord=True).to_executorch().get_etrecord()
    rec.save(tmp_path / "big.etrecord")
    res = _run_py(_RSS_CHECK, str(tmp_path / "big.etrecord"))
    weights = sum(p.numel() * 4 for p in big.parameters())
    assert res["grew"] < weights / 8, res  # mapped, not copied (a copy would add all 64 MiB)
    assert res["after_run"] < weights / 2, res  # running reads the pages in place
    assert not res["serde"]


# --- lazy programs -------------------------------------------------------------------------------------------

_LAZY_CHECK = textwrap.dedent("""
    import json, sys
    import torch
    import edgetorch.devtools.etrecord as etr
    seen = {"import": "torch._export.serde.serialize" in sys.modules}
    rec = etr.parse_etrecord(sys.argv[1])
    seen["parse"] = "torch._export.serde.serialize" in sys.modules
    x = rec.representative_inputs["forward"][0]
    gm = rec.reference_graph()
    table = rec.handle_table()
    out = gm(*x)
    seen["views"] = "torch._export.serde.serialize" in sys.modules
    seen["dynamo"] = "torch._dynamo" in sys.modules
    seen["methods"] = rec.methods and repr(rec) and "torch._export.serde.serialize" in sys.modules
    ep = rec.exported_program
    seen["program"] = "torch._export.serde.serialize" in sys.modules
    seen["same"] = bool(torch.equal(ep.module()(*x), out[0]))
    print(json.dumps(seen))
""")


def test_programs_are_deserialized_only_on_access(zoo):
    res = _run_py(_LAZY_CHECK, str(zoo["mlp"][4]))
    assert res == {"import": False, "parse": False, "views": False, "dynamo": False, "methods": False,
                   "program": True, "same": True}


def test_bad_program_surfaces_on_access(zoo):
    data = zoo["mlp"][4].read_bytes()
    bad = _rezip(data, {"programs/0/exported_program.json": b"{\"graph_module\": 1}"})
    rec = parse_etrecord(bad)  # structure is fine: parsing succeeds
    assert _same_bits(rec.reference_graph()(*zoo["mlp"][1]["forward"]), pytree.tree_leaves(
        zoo["mlp"][0](*zoo["mlp"][1]["forward"])))
    with pytest.raises(ETRecordFormatError) as ei:
        _ = rec.exported_programs
    assert ei.value.field == "programs/0/exported_program.json"
    assert rec.edge_programs  # the other program is fine
    with pytest.raises(ETRecordFormatError):  # still refused on the next access
        _ = rec.exported_program


# --- hostile content in the new entries ---------------------------------------------------------------------

def _rezip(data: bytes, replace: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, replace.get(info.filename, src.read(info)))
    return reseal_etrecord(out.getvalue())  # edited on purpose: checksums updated to reach the deeper checks


_DEEP = "@deep@"


def _edit(data: bytes, entry: str, edit) -> bytes:
    doc = json.loads(zipfile.ZipFile(io.BytesIO(data)).read(entry))
    edit(doc)
    text = json.dumps(doc).replace(json.dumps(_DEEP), "[" * 100_000 + "1" + "]" * 100_000)  # beyond json.dumps
    return _rezip(data, {entry: text.encode()})


def _first_op(doc):
    return next(n for n in doc["nodes"] if n["op"] == "call_function")


def _set_target(t):
    def edit(doc):
        _first_op(doc)["target"] = t
    return edit


def _deep(depth: int | None):
    def edit(doc):
        arg = _DEEP if depth is None else 1
        for _ in range(depth or 0):
            arg = [arg]
        _first_op(doc)["args"].append(arg)
    return edit


def _attr_name(name):
    def edit(doc):
        doc["attrs"][0]["name"] = name
        next(n for n in doc["nodes"] if n["op"] == "get_attr")["target"] = name
    return edit


REF, HANDLES = "reference/0.json", "handles/0.json"
_HOSTILE = {
    "unknown namespace": (REF, _set_target("os::system.default"), "namespace"),
    "builtins.eval": (REF, _set_target("builtins.eval"), "namespace"),
    "python eval call": (REF, None, "namespace"),  # target set in the test (names the marker file)
    "dunder op": (REF, _set_target("aten::__class__.default"), "namespace"),
    "not an overload": (REF, _set_target("aten::add.overloads"), "not an operator"),
    "namespace attribute": (REF, _set_target("aten::name.default"), "not an operator"),
    "unknown operator function": (REF, _set_target("operator::attrgetter"), "not an allowed operator"),
    "unknown op": (REF, _set_target("aten::definitely_not_an_op.default"), "not an operator"),
    "nesting": (REF, _deep(40), "nested deeper"),
    "huge nesting": (REF, _deep(None), "not valid JSON"),
    "unknown node": (REF, lambda d: _first_op(d)["args"].__setitem__(0, {"node": "nope"}), "not an earlier node"),
    "forward reference": (REF, lambda d: _first_op(d)["args"].__setitem__(0, {"node": "output"}), "earlier node"),
    "tagged value": (REF, lambda d: _first_op(d)["args"].append({"callable": "os.system"}), "malformed argument"),
    "attribute shadows forward": (REF, _attr_name("forward"), "not allowed"),
    "dunder attribute": (REF, _attr_name("__class__"), "not allowed"),
    "bad node name": (REF, lambda d: _first_op(d).__setitem__("name", "a; import os"), "identifier"),
    "call_module": (REF, lambda d: _first_op(d).__setitem__("op", "call_module"), "not allowed"),
    "call_method": (REF, lambda d: _first_op(d).__setitem__("op", "call_method"), "not allowed"),
    "bad tensor record": (REF, lambda d: d["attrs"][0]["tensor"].__setitem__("offset", 10**12), "past the blob"),
    "no output": (REF, lambda d: d["nodes"].pop(), "no output"),
    "bad meta": (REF, lambda d: _first_op(d)["meta"].__setitem__("stack_trace", 10**6), "out of range"),
    "wrong method": (REF, lambda d: d.__setitem__("method", "other"), "does not describe"),
    "future version": (REF, lambda d: d.__setitem__("version", 2), "unsupported format"),
    "handle row": (HANDLES, lambda d: d["nodes"].__setitem__(0, ["1", "x", "aten::add", None, None, False]),
                   "malformed"),
    "handle stack index": (HANDLES, lambda d: d["nodes"][0].__setitem__(3, -1), "out of range"),
    "handle extra key": (HANDLES, lambda d: d.__setitem__("eval", "os.system"), "exactly the keys"),
}


@pytest.mark.parametrize("case", sorted(_HOSTILE))
def test_hostile_view_entries_are_refused(zoo, tmp_path, case):
    entry, edit, match = _HOSTILE[case]
    marker = tmp_path / "pwned"
    data = zoo["mlp"][4].read_bytes()
    if edit is None:
        edit = _set_target(f"__import__('os').system('touch {marker}')")
    bad = _edit(data, entry, edit)
    rec = parse_etrecord(bad)  # the entries are read on first use
    with pytest.raises(ETRecordFormatError, match=match) as ei:
        rec.reference_graph() if entry == REF else rec.handle_table()
    assert ei.value.field == entry and entry in str(ei.value)
    assert not marker.exists()
    assert not any(rec._is_loaded(r) for r in ETRecord._ROLES)  # no fallback to the programs


def test_hostile_view_indices_are_refused_at_parse(zoo):
    data = zoo["mlp"][4].read_bytes()
    for entry, doc, match in (
            ("reference/index.json", {"forward": 7}, "is missing"),
            ("reference/index.json", {"forward": "0"}, "distinct entry numbers"),
            ("handles/index.json", {"forward": 0, "encode": 0}, "distinct entry numbers"),
            ("handles/index.json", [0], "distinct entry numbers")):
        with pytest.raises(ETRecordFormatError, match=match) as ei:
            parse_etrecord(_rezip(data, {entry: json.dumps(doc).encode()}))
        assert entry in str(ei.value)


def test_tensor_region_past_the_end_is_refused(zoo, tmp_path):
    """A central directory that claims more tensor bytes than the file holds: refused before any mapping is
    read (a mapped read past the end would fault)."""
    data = bytearray(zoo["mlp"][4].read_bytes())
    cd = data.rindex(b"PK\x01\x02", 0, data.rindex(b"tensors.bin"))  # central directory header of tensors.bin
    assert data[cd + 46:cd + 57] == b"tensors.bin"
    size = int.from_bytes(data[cd + 24:cd + 28], "little") + 4096
    data[cd + 20:cd + 28] = size.to_bytes(4, "little") * 2  # compressed and uncompressed sizes
    path = tmp_path / "long.etrecord"
    path.write_bytes(bytes(data))
    for src in (path, bytes(data)):
        with pytest.raises(ETRecordFormatError, match="past the end of the file") as ei:
            parse_etrecord(src)
        assert ei.value.field == "tensors.bin"
