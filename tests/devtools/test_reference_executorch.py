"""Issue 26: the reference ExecuTorch's ETDump, debug buffer and ETRecord (made by the reference 1.5.1 with
``tests/data/reference/make_reference_artifacts.py``) read by edgetorch, and the Inspector's numeric gaps checked
against the reference Inspector's own ``calculate_numeric_gap`` tables saved beside them."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.etdump import read_etdump
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.formats import etdump as ed
from edgetorch.formats.etdump_executorch import read_any_etdump
from edgetorch.formats.handles import DELEGATE_CALL, KERNEL
from tests.devtools._reference_data import DATA, FAULTS, assert_reference_rows, debug_buffer, handle_reading, unpack

NAMES = [f"{m}_{b}" for m in ("mlp", "cnn", "mobilenet", "cnn_int8") for b in ("portable", "xnnpack")]
NAMES += ["vit_portable", "vit2h_xnnpack"]  # vit2h: two heads, an unbind XNNPACK splits, a dim-order clone


def _paths(name: str) -> dict[str, str]:
    return {"etdump_path": str(DATA / f"{name}.etdp"), "etrecord": str(DATA / f"{name}_etrecord.bin"),
            "debug_buffer_path": str(debug_buffer(name))}


def _reference(name: str) -> dict:
    return json.loads((DATA / f"{name}_gaps.json").read_text())


@pytest.fixture(scope="module", params=NAMES)
def inspected(request):
    return request.param, Inspector(**_paths(request.param))


def test_etdump_is_read_by_content():
    d = read_etdump(DATA / "cnn_portable.etdp")
    assert d.producer == "executorch"
    assert [r.name for r in d.run_data] == ["Default", "Execute"]
    kernels = [e.profile_event.name for e in d.run_data[1].events
               if e.profile_event is not None and e.profile_event.name.startswith("native_call_")]
    assert kernels[:2] == ["native_call_convolution.out", "native_call__native_batch_norm_legit_no_training.out"]
    # framework events (chain -1) carry no instruction, as in edgetorch's own dumps
    assert all(e.profile_event.instruction_id == -1 for r in d.run_data for e in r.events
               if e.profile_event is not None and e.profile_event.name in ("Method::execute", "Method::init"))
    outs = [e.debug_event for e in d.run_data[1].events
            if e.debug_event is not None and e.debug_event.debug_entry.output]
    assert len(outs) == 1 and outs[0].debug_entry.tensor.sizes == [1, 5]


@pytest.mark.parametrize("name", NAMES)
def test_every_reference_gap_row_is_present_and_equal(name):
    """Every row of the reference Inspector's table (MSE and L1) is in edgetorch's, gap within 1e-6 relative;
    a clean program has no culprit."""
    ins = Inspector(**_paths(name))
    ref = _reference(name)
    assert_reference_rows(ins, ref, name)


def test_events_match_the_reference_inspector(inspected):
    name, ins = inspected
    ref = _reference(name)["events"]
    ours = [[b.name, e.name, e.is_delegated_op, e.delegate_backend_name] for b in ins.event_blocks for e in b.events]
    assert ours == [[r[0], r[1], r[3], r[4]] for r in ref]
    # handles too, but for framework events (the reference gives them instruction 0's handles)
    framework = {"Method::init", "Program::load_method", "Method::execute"}
    for b in ins.event_blocks:
        for e, r in zip(b.events, [r for r in ref if r[0] == b.name]):
            if e.name not in framework:
                assert e.debug_handles == r[2], (name, e.name)


def test_run_output_is_the_programs_output(inspected):
    """The logged program output equals the reference outputs the reference ETRecord recorded (its eager model)."""
    _, ins = inspected
    block = next(b for b in ins.event_blocks if b.name == "Execute")
    (expected,) = ins.etrecord.reference_outputs["forward"][0]
    torch.testing.assert_close(block.run_output[0], expected, rtol=1e-5, atol=1e-5)


def test_etrecord_groups_and_handles():
    rec = parse_etrecord(DATA / "cnn_xnnpack_etrecord.bin")
    assert rec.producer == "executorch"
    groups = rec.handle_groups["forward"]
    calls = [g for g in groups if g.kind == DELEGATE_CALL]
    assert [g.instruction_id for g in calls] == [0, 2] and {g.backend for g in calls} == {"XnnpackBackend"}
    assert [g.handles for g in groups if g.kind == KERNEL] == [(7,)]
    assert rec.num_outputs["forward"] == {0: 1, 2: 1}
    # ATen program: every op got the handle of the edge ops it became (the reference's back-propagation)
    gm = rec.reference_graph("forward")
    from edgetorch.exir.debug_handles import get_debug_handle

    got = {n.name: get_debug_handle(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert got == {"conv2d": 1, "batch_norm": 2, "relu": 3, "max_pool2d": 4, "conv2d_1": 5, "relu_1": 6,
                   "mean": 7, "linear": 8}


def test_programs_are_deserialized_on_first_use():
    """Parsing reads no weights; the numeric gap deserializes no program with torch (its reference graph is built
    from the ATen program's document and weights; the edge program's copy of the weights is never loaded), with
    the same handle table the deserialized edge program gives."""
    rec = parse_etrecord(DATA / "cnn_xnnpack_etrecord.bin")
    assert not any(rec._is_loaded(r) for r in ("aten", "edge", "graph_map"))
    table = rec.handle_table("forward")
    ins = Inspector(etdump_path=DATA / "cnn_xnnpack.etdp", etrecord=rec,
                    debug_buffer_path=debug_buffer("cnn_xnnpack"))
    ins.calculate_numeric_gap("MSE")
    assert not any(rec._is_loaded(r) for r in ("aten", "edge", "graph_map"))
    assert rec._lazy._programs == {}
    from edgetorch.devtools.etrecord._reference import handles_from_program

    assert handles_from_program(rec.edge_programs["forward"], "forward") == table
    # a program whose ATen graph lacks a handle (an unbind XNNPACK splits) is compared with its edge program
    rec2 = parse_etrecord(DATA / "vit2h_xnnpack_etrecord.bin")
    assert handles_from_program(rec2.edge_programs["forward"], "forward") == rec2.handle_table("forward")


def test_delegate_call_inputs_are_trimmed():
    """The reference logs a delegate call's inputs then outputs; with the ETRecord only the outputs remain."""
    ins = Inspector(**_paths("cnn_xnnpack"))
    call = next(e for b in ins.event_blocks for e in b.events if e.name == "DELEGATE_CALL")
    assert [list(t.shape) for t in call.debug_data] == [[1, 16, 4, 4]]
    raw = read_etdump(DATA / "cnn_xnnpack.etdp")
    logged = [e.debug_event for e in raw.run_data[1].events if e.debug_event is not None
              and e.debug_event.instruction_id == 0]
    assert [d.debug_entry.tensor.sizes for d in logged] == [[1, 3, 16, 16], [1, 16, 4, 4]]


def test_edgetorch_etdump_still_read():
    e = ed.ETDump(run_data=[ed.RunData("Execute", "forward")])
    assert read_any_etdump(ed.serialize_etdump(e)).producer == "edgetorch"


def test_debug_buffer_is_never_read_whole(tmp_path):
    """A huge (sparse) debug buffer is mapped, not read: only the tensors' bytes are touched."""
    big = tmp_path / "big_debug.bin"
    src = (debug_buffer("mlp_portable")).read_bytes()
    with open(big, "wb") as f:
        f.write(src)
        f.truncate(1 << 30)
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ins = Inspector(etdump_path=DATA / "mlp_portable.etdp", etrecord=DATA / "mlp_portable_etrecord.bin",
                    debug_buffer_path=big)
    df = ins.calculate_numeric_gap("MSE")
    assert len(df) == len(_reference("mlp_portable")["gaps"]["MSE"])
    import mmap

    assert isinstance(ins._debug_buffer._buf, mmap.mmap)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < (256 << 10)  # KiB: far below 1 GiB


def test_size_prefix_is_checked():
    data = (DATA / "mlp_xnnpack.etdp").read_bytes()
    from edgetorch.errors import ETDumpFormatError

    with pytest.raises(ETDumpFormatError, match="truncated") as ei:
        read_any_etdump(data[:-8], "x.etdp")
    assert ei.value.field == "size_prefix"
    bad = bytearray(data)
    struct.pack_into("<I", bad, 0, 1 << 30)
    with pytest.raises(ETDumpFormatError, match="truncated"):
        read_any_etdump(bytes(bad))


def test_planted_faults_are_named_top1():
    """32 reference programs, each with one parameter perturbed before export and run by the reference's
    runtime, debugged against the clean ETRecord: the first culprit covers the perturbed op every time, where
    the reference's largest-gap row does in far fewer (its gap accumulates downstream)."""
    index = json.loads((FAULTS / "index.json").read_text())
    assert len(index) == 32
    records, ours, reference, localized = {}, 0, 0, 0
    for f in index:
        name = f"{f['model']}_{f['backend']}"
        rec = records.get(name) or records.setdefault(name, parse_etrecord(DATA / f"{name}_etrecord.bin"))
        want = handle_reading(rec, f["param"])
        ins = Inspector(etdump_path=FAULTS / f["etdump"], etrecord=rec,
                        debug_buffer_path=unpack(FAULTS / f["debug_buffer"]))
        culprits = ins.find_culprits(ins.calculate_numeric_gap("MSE"))
        top = set(culprits["aot_debug_handle"].iloc[0]) if len(culprits) else set()
        ours += want in top
        reference += want in f["reference_top1_by_gap"]
        localized += len(top) <= 4  # not one delegate row spanning the whole model
    assert ours == 32, ours
    assert reference <= 24 and localized >= 19, (reference, localized)


def test_three_runs_of_one_program():
    """One loaded reference program run on three inputs: one block of three runs; each run's logged values are
    its own (the last kernel's equals the output the reference runtime returned), each run's gap table is
    computed from its own input, run 0's equals the reference Inspector's table of the single run on that
    input, and no run names a culprit."""
    rec = parse_etrecord(DATA / "mlp_portable_etrecord.bin")
    info = json.loads((DATA / "mlp_portable_3runs_inputs.json").read_text())
    xs = [torch.tensor(x) for x in info["inputs"]]
    rec.update_representative_inputs([(x,) for x in xs])
    ins = Inspector(etdump_path=DATA / "mlp_portable_3runs.etdp", etrecord=rec,
                    debug_buffer_path=unpack(DATA / "mlp_portable_3runs_debug.bin.gz"))
    (block,) = [b for b in ins.event_blocks if b.name == "Execute"]
    assert block.num_runs == 3
    last = [e for e in block.events if e.name == "native_call_addmm.out"][-1]
    assert len(last.perf_data.raw) == 3
    single = {tuple(r["aot_debug_handle"]): r["gap"][0] for r in _reference("mlp_portable")["gaps"]["MSE"]}
    for k in range(3):
        torch.testing.assert_close(last.run_debug_data[k][0], torch.tensor(info["runtime_outputs"][k]))
        df = ins.calculate_numeric_gap("MSE", run=k)
        assert len(ins.find_culprits(df)) == 0
        if k == 0:
            assert {tuple(h): g[0] for h, g in zip(df["aot_debug_handle"], df["gap"])} == pytest.approx(single,
                                                                                                     rel=1e-6)


def test_graph_map_entries():
    """A reference record with an ``edge_after_transform`` graph and an extra recorded module: both read into
    ``graph_map`` (on first use), runnable, and the transformed graph serves as gap reference for the same run."""
    rec = parse_etrecord(DATA / "mlp_extras_etrecord.bin")
    assert sorted(rec.graph_map_names()) == ["aux/forward", "edge_after_transform/forward"]
    (x,) = rec.representative_inputs["forward"][0]
    aux = rec.graph_map["aux/forward"]
    torch.manual_seed(26)
    torch.testing.assert_close(aux.module()(x), torch.nn.Linear(16, 4)(x))
    ins = Inspector(etdump_path=DATA / "mlp_portable.etdp", etrecord=rec,
                    debug_buffer_path=debug_buffer("mlp_portable"))
    assert ins.get_exported_program("aux") is aux
    df = ins.calculate_numeric_gap("MSE", reference_graph="edge_after_transform")
    assert df.attrs["reference_graph"] == "edge_after_transform" and len(ins.find_culprits(df)) == 0
    ref = {tuple(r["aot_debug_handle"]): r["gap"][0] for r in _reference("mlp_portable")["gaps"]["MSE"]}
    ours = {tuple(h): g[0] for h, g in zip(df["aot_debug_handle"], df["gap"])}
    assert set(ours) == set(ref)  # the edge graph's ops, one row per handle as in the reference's ATen table


def test_two_methods_in_one_reference_etdump():
    """The reference's runs do not name their method: each is matched to the ETRecord method whose instructions
    and kernels it ran; both get gap tables (``head`` against its edge program: the reference records the ATen
    program of ``forward`` only), equal for ``forward`` to the reference Inspector's, no culprit, and each
    block's program output is what the reference runtime returned for that method."""
    rec = parse_etrecord(DATA / "mm_portable_etrecord.bin")
    io = json.loads((DATA / "mm_portable_io.json").read_text())
    rec.update_representative_inputs({"head": [(torch.tensor(io["head_input"]),)]})
    ins = Inspector(etdump_path=DATA / "mm_portable.etdp", etrecord=rec,
                    debug_buffer_path=unpack(DATA / "mm_portable_debug.bin.gz"))
    assert sorted(ins.methods) == ["forward", "head"]
    single = {tuple(r["aot_debug_handle"]): r["gap"][0] for r in _reference("mlp_portable")["gaps"]["MSE"]}
    for m in ("forward", "head"):
        df = ins.calculate_numeric_gap("MSE", method=m)
        assert len(df) == (5 if m == "forward" else 2) and len(ins.find_culprits(df)) == 0
        if m == "forward":
            assert {tuple(h): g[0] for h, g in zip(df["aot_debug_handle"], df["gap"])} == pytest.approx(single,
                                                                                                     rel=1e-6)
        (block,) = [b for b in ins.event_blocks if b.method == m and b.name == "Execute"]
        torch.testing.assert_close(block.run_output[0], torch.tensor(io["outputs"][m]))
