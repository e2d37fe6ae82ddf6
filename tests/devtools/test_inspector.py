"""Inspector end to end: event blocks, profile tables, numeric gaps (exact and with a planted fault), errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector import NumericalComparatorBase, TimeScale
from edgetorch.errors import ArtifactMismatchError, InspectorError
from edgetorch.exir import to_edge
from edgetorch.formats import program as pf
from edgetorch.models import get_spec, list_models, method_module
from edgetorch.runtime import Runtime


def _pipeline(name: str, out: str, runs: int = 1, buffer: object = "auto", reps: bool = True,
              methods: tuple[str, ...] | None = None, perturb=None):
    spec = get_spec(name)
    model = spec.build()
    all_inputs = spec.example_inputs()
    methods = methods or tuple(all_inputs)
    eps = {m: torch.export.export(method_module(model, m), all_inputs[m]) for m in methods}
    et = to_edge(eps, generate_etrecord=True).to_executorch()
    pte = os.path.join(out, "model.pte")
    et.save(pte)
    if perturb is not None:
        perturb(pte, model)
    rec = et.get_etrecord()
    if reps:
        rec.update_representative_inputs({m: [all_inputs[m]] for m in methods})
    rec_path = os.path.join(out, "etrecord.bin")
    rec.save(rec_path)
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=buffer)
    for m in methods:
        for _ in range(runs):
            program.load_method(m).execute(*all_inputs[m])
    dump, dbg = os.path.join(out, "etdump.etdp"), os.path.join(out, "debug.bin")
    program.write_etdump_result_to_file(dump, dbg)
    return model, all_inputs, rec, rec_path, dump, dbg


GAP_MODELS = [n for n in list_models() if not get_spec(n).slow]


@pytest.mark.parametrize("name", GAP_MODELS)
def test_portable_backend_has_zero_gaps_on_every_op(name, tmp_path):
    _, inputs, _rec, rec_path, dump, dbg = _pipeline(name, str(tmp_path))
    insp = Inspector(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg)
    for method in inputs:
        df = insp.calculate_numeric_gap("MSE", method=method)
        assert len(df) > 0
        assert all(g[0] <= 1e-10 for g in df["gap"]), df[["aot_ops", "gap"]]
        cov = insp.last_gap_coverage
        assert cov.runtime_matched == cov.runtime_total
        # independent check of the AOT side: the last row is the model output, computed by eager PyTorch
        with torch.no_grad():
            eager = getattr(get_spec(name).build(), method)(*inputs[method])
        leaves = torch.utils._pytree.tree_leaves(eager)
        last = df.iloc[-1]["aot_intermediate_output"]
        assert any(t.shape == last.shape and torch.equal(t, last) for t in leaves if isinstance(t, torch.Tensor))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_portable_backend_zero_gaps_big_models(name, tmp_path):
    _, _, _, rec_path, dump, dbg = _pipeline(name, str(tmp_path))
    df = Inspector(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg).calculate_numeric_gap("MSE")
    assert len(df) > 20 and all(g[0] <= 1e-10 for g in df["gap"])


def _perturb_weight(pte: str, weight: torch.Tensor, scale: float = 1.5) -> None:
    """Scales the first element of ``weight`` inside the program file (found by its exact bytes)."""
    data = bytearray(open(pte, "rb").read())
    raw = weight.detach().contiguous().numpy().tobytes()
    at = data.find(raw)
    assert at > 0 and data.find(raw, at + 1) == -1
    arr = np.frombuffer(data, dtype=np.float32, count=weight.numel(), offset=at).copy()
    arr[0] = arr[0] * scale + 0.5
    data[at:at + arr.nbytes] = arr.tobytes()
    open(pte, "wb").write(bytes(data))


def test_planted_weight_fault_is_found_at_its_op_with_its_stack_trace(tmp_path):
    def perturb(pte, model):
        _perturb_weight(pte, model.encoder.layers[1].mlp[0].weight)

    _, _, _, rec_path, dump, dbg = _pipeline("vit_tiny", str(tmp_path), perturb=perturb)
    insp = Inspector(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg)
    df = insp.calculate_numeric_gap("MSE")
    nonzero = [i for i, g in enumerate(df["gap"]) if g[0] > 0]
    first = df.iloc[nonzero[0]]
    assert first["runtime_ops"] == ["native_call_addmm.out"]
    assert "layers.1.mlp.0" in first["module"]
    trace = next(iter(first["stacktraces"].values()))
    assert "vit.py" in trace
    # every row before it is exact, and the local gap singles the faulty op out
    assert all(g[0] == 0 for g in df["gap"][: nonzero[0]])
    assert first["local_gap"][0] > 0
    assert all(lg[0] in (0, None) for j, lg in enumerate(df["local_gap"]) if j != nonzero[0])
    culprit = insp.find_culprits(df, top=1).iloc[0]
    assert culprit["aot_ops"] == first["aot_ops"]
    assert insp.first_divergence(df, 0.0)["aot_ops"] == first["aot_ops"]


def test_metrics_against_numpy(tmp_path):
    def perturb(pte, model):
        _perturb_weight(pte, model.fc1.weight, scale=2.0)

    _, _, _, rec_path, dump, dbg = _pipeline("mlp", str(tmp_path), perturb=perturb)
    insp = Inspector(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg)
    df = insp.calculate_numeric_gap("MSE")
    row = df[[g[0] > 0 for g in df["gap"]]].iloc[0]
    a = row["aot_intermediate_output"].double().numpy().ravel()
    b = row["runtime_intermediate_output"].double().numpy().ravel()
    assert np.isclose(row["gap"][0], np.mean((a - b) ** 2))
    idx = row.name
    for metric, want in [("L1", np.sum(np.abs(a - b))), ("MAX_ABS", np.max(np.abs(a - b))),
                         ("SNR", 10 * np.log10(np.mean(a ** 2) / np.mean((a - b) ** 2))),
                         ("COSINE", np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))]:
        got = insp.calculate_numeric_gap(metric).loc[idx, "gap"][0]
        assert np.isclose(got, want, rtol=1e-6), metric

    class MaxRel(NumericalComparatorBase):
        def element_compare(self, x, y):
            return float(((x - y).abs().max() / x.abs().max()).item())

    got = insp.calculate_numeric_gap(MaxRel()).loc[idx, "gap"][0]
    assert np.isclose(got, np.max(np.abs(a - b)) / np.max(np.abs(a)), rtol=1e-6)
    with pytest.raises(ValueError, match="unknown distance"):
        insp.calculate_numeric_gap("HAMMING")


def test_event_blocks_merge_runs_and_link_to_source(tmp_path):
    _, _, rec, _, dump, dbg = _pipeline("small_cnn", str(tmp_path), runs=3)
    insp = Inspector(etdump_path=dump, etrecord=rec, debug_buffer_path=dbg,  # in-memory ETRecord
                     target_time_scale=TimeScale.US)
    blocks = [b for b in insp.event_blocks if b.name != "load"]
    assert len(blocks) == 1 and blocks[0].num_runs == 3
    kernels = [e for e in blocks[0].events if e.name.startswith("native_call_")]
    assert kernels and all(len(e.perf_data.raw) == 3 for e in kernels)
    conv = next(e for e in kernels if "convolution" in e.name)
    assert conv.op_types == ["aten::convolution"]
    assert any("cnn.py" in t for t in conv.stack_traces.values())
    assert conv.module_hierarchy and conv.debug_data and conv.debug_data[0].shape[1] in (16, 32, 64)
    df = insp.to_dataframe()
    assert {"event_block_name", "event_name", "p50 (us)", "op_types", "stack_traces"} <= set(df.columns)
    assert insp.find_total_for_module("conv1") > 0
    tsv = tmp_path / "profile.tsv"
    insp.save_data_to_tsv(tsv)
    assert "native_call_convolution" in tsv.read_text()
    from io import StringIO

    buf = StringIO()
    insp.print_data_tabular(file=buf)
    assert "native_call_convolution" in buf.getvalue()


def test_multi_method_programs_are_inspected_per_method(tmp_path):
    _, inputs, _, rec_path, dump, dbg = _pipeline("two_method", str(tmp_path))
    insp = Inspector(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg)
    assert set(insp.methods) == {"forward", "encode"}
    enc = insp.calculate_numeric_gap("MSE", method="encode")
    fwd = insp.calculate_numeric_gap("MSE", method="forward")
    assert 0 < len(enc) < len(fwd)


def test_errors_are_clear(tmp_path):
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    _, _, _, rec_a, dump_a, dbg_a = _pipeline("mlp", str(tmp_path / "a"), reps=False)
    _, _, _, rec_b, _, _ = _pipeline("small_cnn", str(tmp_path / "b"))
    with pytest.raises(ArtifactMismatchError, match="different|pair"):
        Inspector(etdump_path=dump_a, etrecord=rec_b, debug_buffer_path=dbg_a)
    insp = Inspector(etdump_path=dump_a, etrecord=rec_a, debug_buffer_path=dbg_a)
    with pytest.raises(InspectorError, match="representative inputs"):
        insp.calculate_numeric_gap("MSE")
    with pytest.raises(InspectorError, match="debug buffer"):
        Inspector(etdump_path=dump_a, etrecord=rec_a).calculate_numeric_gap("MSE")
    with pytest.raises(InspectorError, match="exactly one"):
        Inspector()
    with pytest.raises(InspectorError, match="not found"):
        Inspector(etdump_path=tmp_path / "missing.etdp")
    short = tmp_path / "short.bin"
    short.write_bytes(open(dbg_a, "rb").read()[:100])
    with pytest.raises(ArtifactMismatchError, match="truncated"):
        Inspector(etdump_path=dump_a, etrecord=rec_a, debug_buffer_path=short)
    with pytest.raises(InspectorError, match="no execution of method 'encode'"):
        Inspector(etdump_path=dump_a, etrecord=rec_a, debug_buffer_path=dbg_a).calculate_numeric_gap(
            "MSE", method="encode", inputs=(torch.randn(1, 64),))


def test_profile_only_etdump_has_no_gap(tmp_path):
    _, _, _, rec_path, dump, _ = _pipeline("mlp", str(tmp_path), buffer=0)
    insp = Inspector(etdump_path=dump, etrecord=rec_path)
    assert any(e.perf_data for b in insp.event_blocks for e in b.events)
    with pytest.raises(InspectorError, match="no intermediate outputs"):
        insp.calculate_numeric_gap("MSE")


def test_html_report(tmp_path):
    def perturb(pte, model):
        _perturb_weight(pte, model.fc1.weight)

    _, _, _, rec_path, dump, dbg = _pipeline("mlp", str(tmp_path), perturb=perturb)
    insp = Inspector(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg)
    df = insp.calculate_numeric_gap("MSE")
    from edgetorch.devtools.report import write_report

    path = write_report(tmp_path / "r.html", df, insp.to_dataframe(), summary={"model": "mlp"}, threshold=0.0)
    html = open(path).read()
    assert html.count("<svg") == 2 and "<polyline" in html and "fc1" in html
    assert "class='first'" in html


def test_program_constants_segment_is_what_was_perturbed(tmp_path):
    # guards the fault-planting helper: the perturbed bytes are in the constant segment of the program
    spec = get_spec("mlp")
    model = spec.build()
    et = to_edge(torch.export.export(model, spec.example_inputs()["forward"])).to_executorch()
    header = pf.read_header(et.buffer)
    at = et.buffer.find(model.fc1.weight.detach().numpy().tobytes())
    assert header.segment_offset <= at < header.segment_offset + header.segment_size


def _delegate_etdump() -> bytes:
    from edgetorch.formats import etdump as ed

    pe = [ed.ProfileEvent("native_call_add.out", instruction_id=0, start_time=1_000, end_time=3_000),
          ed.ProfileEvent("DELEGATE_CALL", instruction_id=1, start_time=4_000, end_time=10_000),
          ed.ProfileEvent("", instruction_id=1, delegate_debug_id_int=7, delegate_debug_metadata=b"k=v",
                          start_time=50, end_time=80)]  # a delegate counting in its own unit (cycles)
    run = ed.RunData("Execute", "forward", events=[ed.Event(profile_event=p) for p in pe])
    return ed.serialize_etdump(ed.ETDump(run_data=[run]))


def test_delegate_time_converter_and_metadata_parser_apply_to_events_inside_a_delegate():
    seen = []

    def cycles_to_ms(name, t):
        seen.append(name)
        return t / 10.0  # 10 cycles per ms

    insp = Inspector(etdump_data=_delegate_etdump(), delegate_time_scale_converter=cycles_to_ms,
                     delegate_metadata_parser=lambda b: dict([b.decode().split("=")]))
    events = {e.name: e for e in insp.event_blocks[0].events}
    assert events["7"].perf_data.raw == [3.0] and set(seen) == {"7"}  # (80 - 50) / 10, start and end converted
    assert events["native_call_add.out"].perf_data.raw == [pytest.approx(0.002)]  # ns -> ms, not converted
    assert events["7"].delegate_debug_metadatas == [{"k": "v"}] and events["7"].raw_delegate_debug_metadatas == [b"k=v"]
    df = insp.to_dataframe(include_delegate_debug_data=True)
    assert df.loc[df["event_name"] == "7", "delegate_debug_metadata"].item() == [{"k": "v"}]
    plain = Inspector(etdump_data=_delegate_etdump())
    assert {e.name: e for e in plain.event_blocks[0].events}["7"].perf_data.raw == [pytest.approx(30e-6)]
    with pytest.raises(InspectorError, match="callable"):
        Inspector(etdump_data=_delegate_etdump(), delegate_metadata_parser="json")


def test_module_hierarchy_can_be_turned_off(tmp_path):
    _, _, rec, _, dump, dbg = _pipeline("small_cnn", str(tmp_path))
    on = Inspector(etdump_path=dump, etrecord=rec, debug_buffer_path=dbg)
    off = Inspector(etdump_path=dump, etrecord=rec, debug_buffer_path=dbg, enable_module_hierarchy=False)
    assert "module_hierarchy" in on.to_dataframe() and "module_hierarchy" not in off.to_dataframe()
    assert all(not e.module_hierarchy for b in off.event_blocks for e in b.events)
    assert any(e.op_types for b in off.event_blocks for e in b.events)  # still linked to the record
    with pytest.raises(InspectorError, match="enable_module_hierarchy"):
        off.find_total_for_module("conv1")
    assert on.find_total_for_module("conv1") > 0
