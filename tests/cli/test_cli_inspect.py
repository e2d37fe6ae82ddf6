"""``edgetorch inspect``: profile table, numeric-gap table (on the bundled test case that ran), TSV, HTML report
and clear errors."""

from __future__ import annotations

import csv

import pytest
import torch

from edgetorch.devtools.bundled_program import load_bundled_program
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.runtime import Runtime
from tests.cli.conftest import cli


@pytest.fixture(scope="module")
def dumps(artifacts, tmp_path_factory):
    """ETDump + debug buffer of bundled test case 1 (not 0: the gap must use the inputs that really ran)."""
    folder = tmp_path_factory.mktemp("inspect")
    case = load_bundled_program(artifacts.bpte).method_test_suites[0].test_cases[1]
    program = Runtime.get().load_program(artifacts.bpte, enable_etdump=True, debug_buffer_size="auto")
    program.tracer.set_bundled_input_index(1)
    program.load_method("forward").execute(*case.inputs)
    etdump, debug = str(folder / "etdump.etdp"), str(folder / "debug_output.bin")
    program.write_etdump_result_to_file(etdump, debug)
    return folder, etdump, debug


def test_profile_table_and_tsv(artifacts, dumps):
    folder, etdump, _ = dumps
    tsv = folder / "profile.tsv"
    r = cli("inspect", "--etdump", etdump, "--etrecord", artifacts.etrecord, "--tsv", str(tsv))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "edgetorch profile" in r.stdout and "native_call_addmm.out" in r.stdout and "Method::execute" in r.stdout
    rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
    assert any(row["event_name"] == "native_call_addmm.out" for row in rows)


def test_gap_table_tsv_and_report(artifacts, dumps):
    folder, etdump, debug = dumps
    tsv, report = folder / "gaps.tsv", folder / "report.html"
    r = cli("inspect", "--etdump", etdump, "--etrecord", artifacts.etrecord, "--debug-buffer", debug, "--gap", "mse",
            "--tsv", str(tsv), "--report", str(report), "--method", "forward")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "numeric gap (MSE) per op of 'forward'" in r.stdout
    assert "matched" in r.stdout and "no op adds error of its own" in r.stdout
    rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
    assert len(rows) >= 5 and {"aot_ops", "runtime_ops", "gap", "local_gap"} <= set(rows[0])
    assert all(float(row["gap"]) <= 1e-12 for row in rows)  # compared with test case 1's own inputs
    assert any("linear" in row["aot_ops"] for row in rows)
    html = report.read_text()
    assert "<svg" in html and "coverage" in html


def test_errors(artifacts, dumps, tmp_path):
    _, etdump, debug = dumps

    def err(*args: str) -> str:
        r = cli("inspect", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
        return r.stderr

    assert "--etdump file not found" in err("--etdump", str(tmp_path / "none.etdp"))
    assert "--gap needs --etrecord" in err("--etdump", etdump, "--gap", "MSE")
    assert "--gap needs --debug-buffer" in err("--etdump", etdump, "--etrecord", artifacts.etrecord, "--gap", "MSE")
    assert "--gap must be one of" in err("--etdump", etdump, "--etrecord", artifacts.etrecord, "--debug-buffer",
                                         debug, "--gap", "fuzzy")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "is not a directory" in err("--etdump", etdump, "--tsv", str(blocker / "x.tsv"))
    # an ETRecord of another program: the content hashes differ
    other = tmp_path / "other_etrecord.bin"
    m = torch.nn.Linear(64, 10)
    et = to_edge_transform_and_lower(torch.export.export(m, (torch.randn(1, 64),)), generate_etrecord=True)
    et.to_executorch().get_etrecord().save(other)
    assert "the ETRecord describes program" in err("--etdump", etdump, "--etrecord", str(other))


def test_gap_of_a_quantized_ort_delegate_reports_the_observer_effect(tmp_path):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.export.quantizer import SymmetricInt8Quantizer
    from edgetorch.models import get_model

    model, inputs = get_model("small_cnn")
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), SymmetricInt8Quantizer())
    prepared(*inputs)
    q = convert_pt2e(prepared)
    et = to_edge_transform_and_lower(torch.export.export(q, inputs), partitioner=[OrtPartitioner()],
                                     generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    rec.save(str(tmp_path / "etrecord.bin"))
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    program.load_method("forward").execute(*inputs)
    etdump, debug, report = tmp_path / "q.etdp", tmp_path / "q.bin", tmp_path / "q.html"
    program.write_etdump_result_to_file(etdump, debug)
    r = cli("inspect", "--etdump", str(etdump), "--etrecord", str(tmp_path / "etrecord.bin"), "--debug-buffer",
            str(debug), "--gap", "mse", "--report", str(report))
    assert r.returncode == 0, r.stderr[-3000:]
    # whether exposing the Q/DQ values stops ORT fusing them into integer kernels depends on this CPU: the
    # expectation is the exposing session's final outputs against the plain run's, computed here
    from edgetorch.backends.onnxruntime.runtime import OrtDelegate
    from edgetorch.exir.backend import lowered_module_of
    from edgetorch.formats.etdump import OBSERVER_EFFECT_TOLERANCE
    from tests.backends.onnxruntime._util import delegate_calls, rel_err

    lowered = to_edge_transform_and_lower(torch.export.export(q, inputs), partitioner=[OrtPartitioner()])
    h = OrtDelegate(lowered_module_of(delegate_calls(lowered.exported_program())[0]).processed_bytes, {})
    _, finals = h.capture_intermediates([inputs[0].clone()])
    plain = Runtime.get().load_program(et.buffer).load_method("forward").execute(*inputs)[0]
    exceeds = rel_err(finals[0], plain) > OBSERVER_EFFECT_TOLERANCE
    html = report.read_text()
    assert "observer effect" in r.stdout and "<b>Observer effect</b>" in html, r.stdout[-2000:]
    if exceeds:
        assert f"(> {OBSERVER_EFFECT_TOLERANCE:g})" in r.stdout, r.stdout[-2000:]
        assert "ObserverEffectWarning" in r.stderr and "class='warn'" in html
    else:
        assert f"(<= {OBSERVER_EFFECT_TOLERANCE:g})" in r.stdout, r.stdout[-2000:]
        assert "ObserverEffectWarning" not in r.stderr and "class='warn'" not in html
