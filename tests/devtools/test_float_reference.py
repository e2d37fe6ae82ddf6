"""Quantization debugging against the float model (``reference_graph="float"``), checked against independent
computations: the converted PT2E module run eagerly (the portable runtime runs the same Q/DQ and float kernels)
and the float model run eagerly, with the statistics recomputed here in float64 from their definitions.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from torch import nn

from edgetorch.devtools import Inspector
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.devtools.inspector.float_reference import rank_quantization_culprits
from edgetorch.errors import InspectorError
from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, StageType, export
from edgetorch.export.quantizer import SymmetricInt8Quantizer, SymmetricQuantizationConfig, float_handle
from edgetorch.formats.handles import DELEGATE_CALL, IN_DELEGATE, KERNEL, KINDS
from edgetorch.runtime import Runtime
from edgetorch.workflows.quant_fallback import (
    coarsen_weight,
    inspect_quantized,
    quantize_pt2e_program,
    selective_fallback,
)
from tests.quant_helpers import node_values

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INT8 = PortableRecipeType.INT8_STATIC_PER_TENSOR


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _samples(n: int = 3) -> list[tuple]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(2, 16, generator=g),) for _ in range(n)]


def _downstream(gm: torch.fx.GraphModule, name: str) -> str:
    """The name of the dequantize after the quantize of node ``name`` in a converted module."""
    node = next(n for n in gm.graph.nodes if n.name == name)
    (q,) = [u for u in node.users if "quantize_per_tensor" in str(u.target)]
    (dq,) = [u for u in q.users if "dequantize" in str(u.target)]
    return dq.name


def _mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()) ** 2).mean())


@pytest.fixture(scope="module")
def portable(tmp_path_factory):  # noqa: ANN001, ANN201
    model, samples = _Mlp().eval(), _samples()
    session = export(model, samples, ExportRecipe.get_recipe(INT8), generate_etrecord=True)
    run = inspect_quantized(session.get_executorch_program_manager(), samples)
    return model, samples, session, run


def test_the_float_program_travels_in_the_etrecord(portable, tmp_path) -> None:  # noqa: ANN001
    model, samples, session, _ = portable
    path = tmp_path / "q.etrecord"
    session.get_etrecord().save(path)
    rec = parse_etrecord(path)
    assert "float/forward" in rec.graph_map
    with torch.no_grad():
        assert torch.equal(rec.graph_map["float/forward"].module()(*samples[0]), model(*samples[0]))
    # every quantized matmul maps to its float linear through the numeric debug handle
    float_linears = {float_handle(n): n.name for n in rec.graph_map["float/forward"].graph.nodes
                     if n.target == torch.ops.aten.linear.default}
    edge = rec.edge_reference_graph("forward")
    mapped = {float_handle(n) for n in edge.graph.nodes if n.target == torch.ops.aten.addmm.default}
    assert len(float_linears) == 3 and mapped == set(float_linears)


def test_float_gap_matches_independent_computation(portable) -> None:  # noqa: ANN001
    model, samples, session, run = portable
    df = run.table.set_index(run.table["aot_ops"].map(lambda ops: ops[0]))
    assert df.attrs["samples"] == 3 and (df["samples"] == 3).all()
    gm = session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]
    relu_dq = _downstream(gm, "relu")
    per: dict[str, list[float]] = {"relu": [], "linear_1": []}
    sig = noise = 0.0
    for (x,) in samples:
        v = node_values(gm, x)
        with torch.no_grad():
            f_relu = torch.relu(model.fc1(x))
            fc2_in = v[relu_dq]
            local_fc2 = model.fc2(fc2_in)  # the float op fed the runtime's dequantized input
        per["relu"].append(_mse(f_relu, v[relu_dq]))
        per["linear_1"].append(_mse(local_fc2, v["linear_1"]))
        sig += float((f_relu.double() ** 2).sum())
        noise += float(((f_relu.double() - v[relu_dq].double()) ** 2).sum())
    assert df.loc["relu", "gap"][0] == pytest.approx(sum(per["relu"]) / 3, rel=1e-4)
    assert df.loc["linear_1", "local_gap"][0] == pytest.approx(sum(per["linear_1"]) / 3, rel=1e-3, abs=1e-12)
    assert df.loc["relu", "sqnr_db"] == pytest.approx(10 * math.log10(sig / noise), abs=1e-3)
    # weight error: the dequantized int8 weight of fc2 vs its float weight
    dq_w = node_values(gm, samples[0][0])[next(n for n in gm.graph.nodes if n.name == "linear_1").args[1].name]
    w = model.fc2.weight.detach().double()
    want = 10 * math.log10(float((w ** 2).sum()) / float(((w - dq_w.double()) ** 2).sum()))
    assert df.loc["linear_1", "weight_sqnr_db"] == pytest.approx(want, abs=1e-3)
    # TFLite's RMSE/scale of the fused fc1+relu output: local RMSE over the output scale
    q = next(iter(next(n for n in gm.graph.nodes if n.name == "relu").users))
    assert df.loc["relu", "output_scale"] == pytest.approx(float(q.args[1]))
    assert 0.0 < df.loc["relu", "rmse_over_scale"] < 1.0
    # the typed kind column: every row of a portable program reads a kernel's output
    assert isinstance(df["kind"].dtype, pd.CategoricalDtype) and list(df["kind"].cat.categories) == list(KINDS)
    assert set(df["kind"].astype(str)) == {KERNEL}


def test_inspector_dispatch_and_culprit_ranking(portable) -> None:  # noqa: ANN001
    _, _, _, run = portable
    again = run.inspector.calculate_numeric_gap("MSE", reference_graph="float")
    assert [g[0] for g in again["gap"]] == [g[0] for g in run.table["gap"]]
    top = rank_quantization_culprits(run.table, top=2)
    assert len(top) == 2 and top["local_sqnr_db"].is_monotonic_increasing


def test_excluded_layer_adds_no_local_error() -> None:
    model, samples = _Mlp().eval(), _samples(2)
    session = export(model, samples, ExportRecipe.get_recipe(INT8, exclude_nodes=("linear_1",)),
                     generate_etrecord=True)
    df = inspect_quantized(session.get_executorch_program_manager(), samples).table
    row = df[df["aot_ops"].map(lambda ops: ops[0]) == "linear_1"].iloc[0]
    assert row["local_gap"][0] < 1e-10 and row["local_sqnr_db"] > 100
    assert row["weight_sqnr_db"] is None or math.isnan(row["weight_sqnr_db"])
    assert not row["quantized"]


def test_lower_level_path_with_a_planted_bad_layer() -> None:
    model, samples = _Mlp().eval(), _samples()
    quantizer = SymmetricInt8Quantizer(SymmetricQuantizationConfig(per_channel=True))
    plain = inspect_quantized(quantize_pt2e_program(model, samples, quantizer), samples).table
    et = quantize_pt2e_program(model, samples, SymmetricInt8Quantizer(SymmetricQuantizationConfig()),
                               edit=lambda gm: coarsen_weight(gm, "linear_1", 8.0))
    planted = inspect_quantized(et, samples).table
    by = {ops[0]: r for ops, (_, r) in zip(planted["aot_ops"], planted.iterrows())}
    before = {ops[0]: r for ops, (_, r) in zip(plain["aot_ops"], plain.iterrows())}
    # 3 bits of weight precision lost: about 18 dB less weight SQNR
    assert before["linear_1"]["weight_sqnr_db"] - by["linear_1"]["weight_sqnr_db"] > 12
    assert rank_quantization_culprits(planted, top=1)["aot_ops"].iloc[0][0] == "linear_1"


def test_ort_rows_inside_the_delegate() -> None:
    pytest.importorskip("onnxruntime")
    model, samples = _Mlp().eval(), _samples(2)
    session = export(model, samples, ExportRecipe.get_recipe(OrtRecipeType.INT8_STATIC_PER_TENSOR),
                     generate_etrecord=True)
    run = inspect_quantized(session.get_executorch_program_manager(), samples)
    df = run.table
    assert {ops[0] for ops in df["aot_ops"]} >= {"linear", "linear_1", "linear_2"}
    last = df[df["aot_ops"].map(lambda ops: ops[0]) == "linear_2"].iloc[0]
    # inside the ONNX Runtime delegate: rows read the delegate's inner ops (or its call's outputs), no kernel
    assert isinstance(df["kind"].dtype, pd.CategoricalDtype)
    assert set(df["kind"].astype(str)) <= {IN_DELEGATE, DELEGATE_CALL} and len(df["kind"].dropna()) == len(df)
    with torch.no_grad():
        want = sum(_mse(model(*s), out[0]) for s, out in zip(samples, run.outputs)) / len(samples)
    assert last["gap"][0] == pytest.approx(want, rel=1e-4, abs=1e-12)


def test_missing_float_program_is_a_typed_error(tmp_path) -> None:  # noqa: ANN001
    model, samples = _Mlp().eval(), _samples(1)
    session = export(model, samples, generate_etrecord=True)
    et = session.get_executorch_program_manager()
    rec = session.get_etrecord()
    rec.save(tmp_path / "f.etrecord")
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    program.load_method("forward").execute(*samples[0])
    program.write_etdump_result_to_file(tmp_path / "f.etdp", tmp_path / "f.bin")
    inspector = Inspector(etdump_path=tmp_path / "f.etdp", etrecord=tmp_path / "f.etrecord",
                          debug_buffer_path=tmp_path / "f.bin")
    with pytest.raises(InspectorError, match="add_float_reference"):
        inspector.calculate_numeric_gap("MSE", reference_graph="float")


def test_selective_fallback_reports_each_step() -> None:
    model, samples = _Mlp().eval(), _samples()
    report = selective_fallback(model, samples, INT8, max_layers=2, latency_repeats=1)
    steps = report.steps
    assert list(steps["step"]) == [0, 1, 2] and steps["kept_float"].iloc[0] == []
    assert 0 < len(steps["kept_float"].iloc[1]) < len(steps["kept_float"].iloc[2])
    # step 0's cosine, recomputed from the converted module (what the portable runtime runs)
    session = export(model, samples, ExportRecipe.get_recipe(INT8))
    gm = session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]
    with torch.no_grad():
        cos = [torch.nn.functional.cosine_similarity(model(*s).double().flatten(), gm(*s).double().flatten(),
                                                     dim=0).item() for s in samples]
    assert steps["cosine"].iloc[0] == pytest.approx(sum(cos) / len(cos), abs=1e-6)
    assert steps["accuracy_recovered"].iloc[0] == 0.0 and (steps["latency_ms"] > 0).all()


def test_example_runs() -> None:
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    res = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quantization_debugging.py"), "--models",
                          "bert", "--samples", "2", "--fallback-layers", "1"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "which layer" in res.stdout and "kept in float" in res.stdout


def test_output_impact_of_the_last_layer_is_its_own_noise(portable) -> None:  # noqa: ANN001
    from edgetorch.devtools.inspector.float_reference import output_impact

    model, samples, session, run = portable
    impact = output_impact(run.inspector)
    last = run.table[run.table["aot_ops"].map(lambda ops: ops[0]) == "linear_2"].iloc[0]
    gm = session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]
    fc3 = next(n for n in gm.graph.nodes if n.name == "linear_2")
    noise = signal = 0.0
    for (x,) in samples:
        v = node_values(gm, x)
        with torch.no_grad():
            local = model.fc3(v[fc3.args[0].name])  # the float op on the runtime's dequantized input
            out = model(x)
        noise += float(((v[_downstream(gm, "linear_2")].double() - local.double()) ** 2).sum())
        signal += float((out.double() ** 2).sum())
    assert impact[last["float_debug_handle"]] == pytest.approx(noise / signal, rel=1e-3)
    assert set(impact) == set(run.table["float_debug_handle"])


def test_every_local_error_injected_into_the_float_model_reproduces_the_runtime(portable) -> None:  # noqa: ANN001
    from edgetorch.devtools.inspector import float_reference as fr

    _, _, _, run = portable
    from edgetorch.devtools.inspector._float_runner import Inject

    ref = run.inspector.float_reference
    assert isinstance(ref, fr.FloatReference) and run.inspector.float_reference is ref  # one per Inspector
    fgm = ref.prepared("forward")[0]
    for (flat, rows, ends, values, _), out in zip(ref.per_sample("forward", None), run.outputs, strict=True):
        noise = {n: rows[n] - values[n][1] for n in ends}
        with torch.no_grad():
            got = Inject(fgm, noise).run(*flat)
        torch.testing.assert_close(got[0], out[0], rtol=0, atol=1e-5)
    steps = fr.simulate_fallback(run.inspector, steps=2)
    assert len(steps) == 2 and {h for h, _ in steps} <= set(run.table["float_debug_handle"])
    assert all(0.0 < c <= 1.0 + 1e-9 for _, c in steps)


def test_float_program_needs_an_etrecord() -> None:
    from edgetorch.errors import ETRecordError, ExportError
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.export.quantizer import capture_float_program

    model, samples = _Mlp().eval(), _samples(1)
    float_ep = capture_float_program(model, samples[0])
    with pytest.raises(ExportError, match="generate_etrecord"):
        to_edge_transform_and_lower(torch.export.export(model, samples[0]), float_program=float_ep)
    plain = torch.export.export(model, samples[0])  # no numeric debug handles: a typed ETRecord error
    with pytest.raises(ETRecordError, match="numeric debug handle"):
        to_edge_transform_and_lower(plain, generate_etrecord=True, float_program=plain)


def test_a_later_table_reuses_what_the_first_read_and_computed(portable) -> None:  # noqa: ANN001

    _, _, _, run = portable
    prep = run.inspector.float_reference.prepared("forward")
    assert prep.runner.floats and prep.readings  # kept by the first table
    again = run.inspector.calculate_numeric_gap("MSE", reference_graph="float")
    run.inspector.float_reference.drop_float_values()
    assert not prep.runner.floats and not prep.readings
    fresh = run.inspector.calculate_numeric_gap("MSE", reference_graph="float")
    for df in (again, fresh):
        for col in ("gap", "local_gap"):
            assert [v[0] for v in df[col]] == [v[0] for v in run.table[col]]
        for col in ("sqnr_db", "local_sqnr_db", "weight_sqnr_db", "rmse_over_scale"):
            assert df[col].equals(run.table[col])  # bit for bit (NaN where the first table has NaN)


def test_a_parsed_record_gives_the_float_graph_without_deserializing_it(portable, tmp_path) -> None:  # noqa: ANN001
    from edgetorch.devtools.etrecord._reference import reference_from_program

    model, samples, session, run = portable
    paths = [str(tmp_path / n) for n in ("q.etrecord", "q.etdp", "q_debug.bin")]
    record = session.get_etrecord()
    record.update_representative_inputs(samples)
    record.save(paths[0])
    rec = parse_etrecord(paths[0])
    fgm = rec.graph_map_reference("float/forward")
    assert fgm is not None and not rec._is_loaded("graph_map")  # the compact view: no program deserialized
    assert rec.graph_map_reference("float/forward") is fgm  # cached
    assert rec.graph_map_reference("nope/forward") is None
    with torch.no_grad():
        assert torch.equal(fgm(*samples[0])[0], model(*samples[0]))
    # the nodes, debug handles and module stacks of the full program's graph
    full = reference_from_program(parse_etrecord(paths[0]).graph_map["float/forward"], "forward")
    assert [(n.name, n.target, n.meta.get("custom"), n.meta.get("nn_module_stack")) for n in fgm.graph.nodes] == \
        [(n.name, n.target, n.meta.get("custom"), n.meta.get("nn_module_stack")) for n in full.graph.nodes]
    # an Inspector on the saved files: the same table as the in-memory record's, the float program never loaded
    program = Runtime.get().load_program(session.get_pte_buffer(), enable_etdump=True, debug_buffer_size="auto")
    method = program.load_method("forward")
    for s in samples:
        method.execute(*s)
    program.write_etdump_result_to_file(paths[1], paths[2])
    inspector = Inspector(etdump_path=paths[1], etrecord=paths[0], debug_buffer_path=paths[2])
    table = inspector.calculate_numeric_gap("MSE", reference_graph="float")
    assert not inspector.etrecord._is_loaded("graph_map")
    assert list(table["aot_ops"]) == list(run.table["aot_ops"])
    for col in ("gap", "local_gap"):
        assert [v[0] for v in table[col]] == [v[0] for v in run.table[col]]
    for col in ("sqnr_db", "local_sqnr_db", "weight_sqnr_db", "rmse_over_scale"):
        assert table[col].equals(run.table[col])


def test_samples_run_in_chunks_give_the_same_table(portable, monkeypatch) -> None:  # noqa: ANN001
    from edgetorch.devtools.inspector import float_reference as fr

    model, samples, session, run = portable
    monkeypatch.setattr(fr, "_CHUNK_ELEMENTS", 1)  # every sample its own chunk (a large model's path)
    run.inspector.float_reference.drop_float_values()
    table = run.inspector.calculate_numeric_gap("MSE", reference_graph="float")
    assert list(table["aot_ops"]) == list(run.table["aot_ops"]) and table.attrs["samples"] == 3
    for col in ("gap", "local_gap"):
        assert [v[0] for v in table[col]] == pytest.approx([v[0] for v in run.table[col]], rel=1e-6)
    for col in ("sqnr_db", "local_sqnr_db", "rmse_over_scale"):
        assert list(table[col]) == pytest.approx(list(run.table[col]), rel=1e-6, nan_ok=True)
    # and against the float model run eagerly: the accumulated error of fc1+relu, float64 from its definition
    gm = session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]
    relu_dq = _downstream(gm, "relu")
    with torch.no_grad():
        want = sum(_mse(torch.relu(model.fc1(x)), node_values(gm, x)[relu_dq]) for (x,) in samples) / 3
    by_op = table.set_index(table["aot_ops"].map(lambda ops: ops[0]))
    assert by_op.loc["relu", "gap"][0] == pytest.approx(want, rel=1e-4)
