"""End-to-end FP32 export sessions: every model input form, multi-method, artifact_dir, ETRecord, safe loading."""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile

import pytest
import torch

from edgetorch.export import (
    ExportInputError,
    ExportRecipe,
    ExportSession,
    ExportSessionError,
    LoweringRecipe,
    StageType,
    UnsafeModelFileError,
    export,
    load_exported_program,
)
from edgetorch.models import get_spec, method_module
from edgetorch.runtime import Runtime
from tests.conftest import max_rel_err

S = StageType
FP32_RTOL = 1e-5  # relative max error of FP32 programs vs eager


@pytest.fixture(scope="module")
def cnn():
    spec = get_spec("small_cnn")
    return spec.build(), spec.example_inputs()["forward"]


@pytest.fixture(scope="module")
def cnn_session(cnn, tmp_path_factory):
    model, x = cnn
    out = tmp_path_factory.mktemp("artifacts")
    return export(model, [x], name="cnn", artifact_dir=str(out / "sub"), generate_etrecord=True)


def test_fp32_run_method_matches_eager(cnn, cnn_session):
    model, x = cnn
    with torch.no_grad():
        want = model(*x)
        other = torch.randn_like(x[0])
        want_other = model(other)
    assert max_rel_err(cnn_session.run_method()[0], want) <= FP32_RTOL
    assert max_rel_err(cnn_session.run_method("forward", (other,))[0], want_other) <= FP32_RTOL
    assert max_rel_err(cnn_session.run_method("forward", other)[0], want_other) <= FP32_RTOL  # bare tensor accepted


def test_artifact_dir_contents(cnn, cnn_session):
    model, x = cnn
    paths = cnn_session.artifact_paths
    d = os.path.dirname(paths["pte"])
    assert sorted(os.listdir(d)) == ["cnn.etrecord", "cnn.pte", "cnn.summary.json"]
    with open(paths["pte"], "rb") as f:
        assert f.read() == cnn_session.get_pte_buffer()
    method = Runtime.get().load_program(paths["pte"]).load_method("forward")
    with torch.no_grad():
        assert max_rel_err(method.execute_structured(*x), model(*x)) <= FP32_RTOL
    summary = json.loads(open(paths["summary"]).read())
    assert summary["name"] == "cnn" and summary["methods"] == ["forward"]
    assert summary["recipe"] == "portable_fp32" and summary["backend"] == "portable"
    assert summary["pipeline"] == ["SOURCE_TRANSFORM", "QUANTIZE", "TORCH_EXPORT", "TO_EDGE_TRANSFORM_AND_LOWER",
                                   "TO_EXECUTORCH"]
    assert set(summary["stage_durations_ms"]) == set(summary["pipeline"])
    assert all(v >= 0 for v in summary["stage_durations_ms"].values())
    et = cnn_session.get_executorch_program_manager()
    assert summary["memory_plan"]["forward"]["arena_bytes"] == et.memory_plan_report()["forward"]["arena_bytes"] > 0
    assert summary["content_hash"] == et.content_hash
    dele = summary["delegation"]["forward"]
    assert dele["delegated_subgraphs"] == 0 and dele["non_delegated_nodes"] > 0
    assert dele["by_operator"]["convolution"] == {"delegated": 0, "non_delegated": 3}
    assert summary["files"] == {"pte": "cnn.pte", "etrecord": "cnn.etrecord", "summary": "cnn.summary.json"}
    from edgetorch.devtools.etrecord import parse_etrecord  # imported here: another package, edited concurrently

    record = parse_etrecord(paths["etrecord"])
    assert record.program_hash == et.content_hash
    assert record.methods == ["forward"]
    assert torch.equal(record.representative_inputs["forward"][0][0], x[0])


def test_save_to_pte_and_delegation_print(cnn_session, tmp_path, capsys):
    path = cnn_session.save_to_pte(str(tmp_path / "copy"))
    assert path.endswith("copy.pte") and open(path, "rb").read() == cnn_session.get_pte_buffer()
    with pytest.raises(ExportInputError, match="needs a file name"):
        cnn_session.save_to_pte("")
    with pytest.raises(ExportSessionError, match="cannot write"):
        cnn_session.save_to_pte(str(tmp_path / "copy.pte" / "x.pte"))  # parent is a file
    cnn_session.print_delegation_info()
    out = capsys.readouterr().out
    assert "Method: forward" in out and "Total delegated subgraphs: 0" in out and "convolution" in out
    assert cnn_session.get_etrecord().program_hash == cnn_session.get_executorch_program_manager().content_hash


def test_unwritable_artifact_dir_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    spec = get_spec("mlp")
    with pytest.raises(ExportSessionError, match="cannot write the export artifacts"):
        export(spec.build(), [spec.example_inputs()["forward"]], artifact_dir=str(blocker / "out"))


def test_pipeline_without_executorch_writes_summary_only(tmp_path):
    spec = get_spec("mlp")
    s = export(spec.build(), [spec.example_inputs()["forward"]],
               ExportRecipe(pipeline_stages=[S.TORCH_EXPORT, S.TO_EDGE]), artifact_dir=str(tmp_path))
    assert os.listdir(tmp_path) == ["model.summary.json"]
    summary = json.loads((tmp_path / "model.summary.json").read_text())
    assert "pte_bytes" not in summary and summary["delegation"]["forward"]["delegated_subgraphs"] == 0
    assert s.artifact_paths == {"summary": str(tmp_path / "model.summary.json")}


def test_multi_method_with_dict_inputs():
    spec = get_spec("two_method")
    model = spec.build()
    inputs = spec.example_inputs()
    modules = {m: method_module(model, m) for m in inputs}
    s = export(modules, {m: [x] for m, x in inputs.items()})
    assert s.get_executorch_program_manager().methods == {"forward", "encode"}
    with torch.no_grad():
        for m, x in inputs.items():
            assert max_rel_err(s.run_method(m, x)[0], getattr(model, m)(*x)) <= FP32_RTOL
            assert s.get_example_input(m) == x
            assert isinstance(s.get_exported_program(m), torch.export.ExportedProgram)


def test_exported_program_inputs():
    spec = get_spec("two_method")
    model = spec.build()
    inputs = spec.example_inputs()
    eps = {m: torch.export.export(method_module(model, m), x) for m, x in inputs.items()}
    s = export(eps)  # no example inputs needed
    assert s.pipeline_stages == [S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH]
    assert s.get_exported_program("encode") is eps["encode"]
    with pytest.raises(ExportSessionError, match="no example inputs for method 'forward'"):
        s.run_method("forward")[0]
    with torch.no_grad():
        x = inputs["encode"]
        assert max_rel_err(s.run_method("encode", x)[0], model.encode(*x)) <= FP32_RTOL
    single = export(eps["forward"], [inputs["forward"]])
    with torch.no_grad():
        assert max_rel_err(single.run_method()[0], model(*inputs["forward"])) <= FP32_RTOL


def test_graph_module_input_skips_quantization(cnn):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgetorch.export.quantizer import SymmetricInt8Quantizer

    model, x = cnn
    prepared = prepare_pt2e(torch.export.export(model, x).module(), SymmetricInt8Quantizer())
    with torch.no_grad():
        prepared(*x)
    quantized = convert_pt2e(prepared)
    s = export(quantized, [x])
    assert s.pipeline_stages == [S.TORCH_EXPORT, S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH]
    with torch.no_grad():
        want = quantized(*x)
    assert max_rel_err(s.run_method()[0], want) <= FP32_RTOL  # the runtime matches the fake-quantized graph


def test_recipe_passes_are_applied():
    spec = get_spec("mlp")
    model, x = spec.build(), spec.example_inputs()["forward"]
    seen: list = []

    def aten_pass(method, ep):
        seen.append(("aten", method))
        return ep

    def edge_factory(method, ep):
        def count_nodes(gm):
            seen.append(("edge", method, len(gm.graph.nodes)))
        return [count_nodes]

    def manager_pass(epm):
        seen.append(("manager", sorted(epm.methods)))
        return epm

    lowering = LoweringRecipe(edge_transform_passes=[edge_factory], edge_manager_transform_passes=[manager_pass])
    recipe = ExportRecipe(aten_transform_passes=[aten_pass], lowering_recipe=lowering,
                          pipeline_stages=[S.TORCH_EXPORT, S.TO_EDGE, S.EDGE_PROGRAM_MANAGER_TRANSFORM,
                                           S.TO_EXECUTORCH])
    s = export(model, [x], recipe)
    assert [e[0] for e in seen] == ["aten", "edge", "manager"]
    with torch.no_grad():
        assert max_rel_err(s.run_method()[0], model(*x)) <= FP32_RTOL
    bad = ExportRecipe(aten_transform_passes=[lambda method, ep: None])
    with pytest.raises(ExportSessionError, match="ATen pass .* returned NoneType"):
        export(model, [x], bad)
    bad_manager = ExportRecipe(lowering_recipe=LoweringRecipe(edge_manager_transform_passes=[lambda epm: 1]),
                               pipeline_stages=[S.TORCH_EXPORT, S.TO_EDGE, S.EDGE_PROGRAM_MANAGER_TRANSFORM])
    with pytest.raises(ExportSessionError, match="returned int, not an EdgeProgramManager"):
        export(model, [x], bad_manager)


def test_dynamic_shapes_reach_torch_export():
    spec = get_spec("mlp")
    model, x = spec.build(), spec.example_inputs()["forward"]
    batch = torch.export.Dim("batch", min=1, max=8)
    x2 = (torch.randn(2, x[0].shape[1]),)
    s = export(model, [x2], dynamic_shapes={"forward": ({0: batch},)})
    (sym,) = s.get_executorch_program().plan("forward").symbols
    assert sym.max == 8
    for b in (2, 5, 8):  # the program runs every batch size within the bound
        xb = torch.randn(b, x[0].shape[1])
        assert max_rel_err(s.run_method("forward", (xb,))[0], model(xb)) <= FP32_RTOL


# -- saved ExportedProgram paths --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_ep(tmp_path_factory):
    spec = get_spec("mlp")
    model, x = spec.build(), spec.example_inputs()["forward"]
    path = str(tmp_path_factory.mktemp("saved") / "mlp.pt2")
    torch.export.save(torch.export.export(model, x), path)
    return model, x, path


def test_saved_exported_program_path(saved_ep):
    model, x, path = saved_ep
    s = export(path, [x])
    assert s.input_model_type == "ExportedProgram"
    with torch.no_grad():
        assert max_rel_err(s.run_method()[0], model(*x)) <= FP32_RTOL


def _rewrite(path: str, out: str, edit) -> None:
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)


def _mark_pwned() -> None:
    os.environ["EDGETORCH_PWNED"] = "1"


class _Payload:
    """Unpickling this calls ``_mark_pwned``: stands for arbitrary code in a malicious file."""

    def __reduce__(self):
        return (_mark_pwned, ())


def test_unsafe_archives_are_refused(saved_ep, tmp_path):
    _, x, path = saved_ep

    def pickled_sample_inputs(name, data):
        if "sample_inputs/" in name:
            buf = io.BytesIO()
            torch.save(_Payload(), buf)  # needs weights_only=False: torch.export.load would fall back to it
            return buf.getvalue()
        return data

    def pickled_weight(name, data):
        if name.endswith("model_weights_config.json"):
            cfg = json.loads(data)
            first = next(iter(cfg["config"]))
            cfg["config"][first]["use_pickle"] = True
            return json.dumps(cfg).encode()
        return data

    cases = {"sample": (pickled_sample_inputs, "sample_inputs/model.pt cannot be read"),
             "weight": (pickled_weight, "is a pickled tensor payload")}
    for key, (edit, message) in cases.items():
        bad = str(tmp_path / f"{key}.pt2")
        _rewrite(path, bad, edit)
        with pytest.raises(UnsafeModelFileError, match=message):
            export(bad, [x])
        assert "EDGETORCH_PWNED" not in os.environ
    legacy_path = str(tmp_path / "legacy.pt2")
    with zipfile.ZipFile(legacy_path, "w") as z:
        z.writestr("version", "8.0")
        z.writestr("serialized_example_inputs.pt", pickle.dumps(1))
    with pytest.raises(UnsafeModelFileError, match="legacy"):
        load_exported_program(legacy_path)
    not_zip = tmp_path / "plain.pt2"
    not_zip.write_bytes(b"hello")
    with pytest.raises(ExportInputError, match="not a saved ExportedProgram"):
        ExportSession(str(not_zip))


def test_source_transform_with_torchao_config():
    """An AO config (torchao ``quantize_``) runs in SOURCE_TRANSFORM on a copy of the model; the program runs."""
    from torchao.quantization import Int8WeightOnlyConfig

    from edgetorch.export import AOQuantizationConfig, QuantizationRecipe

    spec = get_spec("mlp")
    model, x = spec.build(), spec.example_inputs()["forward"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    recipe = ExportRecipe(quantization_recipe=QuantizationRecipe(
        ao_quantization_configs=[AOQuantizationConfig(Int8WeightOnlyConfig())]))
    s = export(model, [x], recipe)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the user's model is untouched
    ep = s.get_exported_program()
    assert any(v.dtype == torch.int8 for v in ep.state_dict.values()) or \
        any(v.dtype == torch.int8 for v in ep.constants.values() if isinstance(v, torch.Tensor))
    with torch.no_grad():
        assert max_rel_err(s.run_method()[0], model(*x)) <= 0.05  # int8 weights, float activations: measured 0.006
