"""``edgetorch run``: verification, ETDump / debug-buffer dumps, clear errors, light start-up; the Pipeline 2
example end to end."""

from __future__ import annotations

import os
import sys

import torch

from edgetorch.devtools.etdump import DebugBuffer
from edgetorch.devtools.inspector import Inspector
from edgetorch.formats import etdump as ed
from tests.cli.conftest import ROOT, cli

HEAVY = ("edgetorch.exir", "edgetorch.export", "edgetorch.devtools.inspector", "pandas", "rich", "onnx",
         "onnxruntime", "torch._dynamo", "torch._inductor")


def _imported(stderr: str) -> set[str]:
    mods = set()
    for line in stderr.splitlines():
        if line.startswith("import time:"):
            mods.add(line.rsplit("|", 1)[-1].strip())
    return mods


def test_verification_passes_and_intermediates_load_in_inspector(artifacts, tmp_path):
    etdump, debug = str(tmp_path / "out" / "run.etdp"), str(tmp_path / "out" / "debug.bin")
    r = cli("run", "--bundled_program_path", artifacts.bpte, "--output_verification", "--dump_intermediate_outputs",
            "--debug_buffer_size", "auto", "--etdump_path", etdump, "--debug_output_path", debug,
            python_flags=("-X", "importtime"))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == f"Model file {artifacts.bpte} is loaded."
    assert lines[1] == "Running method forward (test case 0)"
    assert lines[2].startswith("Model executed successfully")
    assert "Model verified successfully (rtol=0.001, atol=1e-05)" in r.stdout
    assert "output 0 (float32 [1, 10]): max abs error" in r.stdout and "mean relative error" in r.stdout
    heavy = {m for m in _imported(r.stderr) for h in HEAVY if m == h or m.startswith(h + ".")}
    assert not heavy, f"edgetorch run imported {sorted(heavy)}"
    inspector = Inspector(etdump_path=etdump, etrecord=artifacts.etrecord, debug_buffer_path=debug)
    block = [b for b in inspector.event_blocks if b.name == ed.EXECUTE_BLOCK][0]
    assert block.bundled_input_index == 0
    df = inspector.calculate_numeric_gap("MSE")
    assert len(df) >= 5 and all(g[0] is not None and g[0] <= 1e-12 for g in df["gap"])
    assert {"linear", "relu"} <= {op for ops in df["aot_ops"] for op in ops}


def test_verification_fails_on_altered_expected_output(artifacts, tmp_path):
    r = cli("run", "--bundled_program_path", artifacts.bad_bpte, "--output_verification", "--num_executions", "2",
            cwd=str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Model executed successfully (2 executions" in r.stdout
    assert "Bundle verification failed (rtol=0.001, atol=1e-05): 1 of 1 output(s) differ" in r.stdout
    stats = [line for line in r.stdout.splitlines() if line.startswith("  output 0")][0]
    assert "1 of 10 elements outside tolerance" in stats
    assert "max abs error 0.5" in stats and "mean abs error 0.05" in stats
    assert "max relative error" in stats and "mean relative error" in stats
    assert not os.listdir(tmp_path)  # nothing dumped without dump flags / --etdump_path
    loose = cli("run", "--bundled_program_path", artifacts.bad_bpte, "--output_verification", "--atol", "1")
    assert loose.returncode == 0 and "Model verified successfully (rtol=0.001, atol=1)" in loose.stdout


def test_dump_outputs_and_profile_only(artifacts, tmp_path):
    r = cli("run", "--bundled_program_path", artifacts.bpte, "--testset_idx", "1", "--dump_outputs",
            "--print_output", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Output 0: tensor(" in r.stdout
    dump = ed.deserialize_etdump((tmp_path / "etdump.etdp").read_bytes())  # default paths
    run = [x for x in dump.run_data if x.name == ed.EXECUTE_BLOCK][0]
    assert run.bundled_input_index == 1
    outs = [e.debug_event for e in run.events if e.debug_event is not None]
    assert len(outs) == 1 and outs[0].debug_entry.output and outs[0].instruction_id == -1
    assert run.events[-1].profile_event.name == ed.METHOD_EXECUTE
    got = DebugBuffer(str(tmp_path / "debug_output.bin")).tensor(outs[0].debug_entry.tensor)
    from edgetorch.devtools.bundled_program import load_bundled_program

    want = load_bundled_program(artifacts.bpte).method_test_suites[0].test_cases[1].expected_outputs[0]
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)

    p = cli("run", "--model_path", artifacts.pte, "--etdump_path", str(tmp_path / "prof.etdp"), "--method",
            "forward", cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Inputs: 1 filled with ones" in p.stdout and "ETDump written to" in p.stdout
    prof = ed.deserialize_etdump((tmp_path / "prof.etdp").read_bytes())
    events = [e for x in prof.run_data if x.name == ed.EXECUTE_BLOCK for e in x.events]
    assert any(e.profile_event is not None and e.profile_event.name.startswith("native_call_") for e in events)
    assert not any(e.debug_event is not None for e in events)  # profiling only


def test_bad_inputs_give_one_line_errors(artifacts, tmp_path):
    def err(*args: str) -> str:
        r = cli("run", *args, cwd=str(tmp_path))
        assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
        return r.stderr

    assert "bundled program file not found: missing.bpte" in err("--bundled_program_path", "missing.bpte")
    assert "model_bundled.bpte" in err()  # the reference runner's default path
    assert "program file not found" in err("--model_path", str(tmp_path / "x.pte"))
    assert "no test cases for method 'encode'" in err("--bundled_program_path", artifacts.bpte, "--method", "encode")
    assert "has no method 'encode'" in err("--model_path", artifacts.pte, "--method", "encode")
    assert "--testset_idx 3 is out of range" in err("--bundled_program_path", artifacts.bpte, "--testset_idx", "3")
    assert "has no expected outputs" in err("--bundled_program_path", artifacts.bpte, "--testset_idx", "2",
                                            "--output_verification")
    assert "plain program (.pte)" in err("--bundled_program_path", artifacts.pte)
    assert "needs a bundled program" in err("--model_path", artifacts.pte, "--output_verification")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "is not a directory" in err("--bundled_program_path", artifacts.bpte, "--etdump_path",
                                       str(blocker / "e.etdp"))
    assert "--debug_output_path" in err("--bundled_program_path", artifacts.bpte, "--dump_intermediate_outputs",
                                        "--debug_output_path", str(blocker / "sub" / "d.bin"))
    assert "is a directory" in err("--bundled_program_path", artifacts.bpte, "--etdump_path", str(tmp_path))
    data = bytearray(open(artifacts.bpte, "rb").read())
    corrupt = tmp_path / "corrupt.bpte"
    corrupt.write_bytes(bytes(data[:len(data) - 100]))
    assert "truncated" in err("--bundled_program_path", str(corrupt))
    data[-5] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    assert "checksum" in err("--bundled_program_path", str(corrupt))
    r = cli("run", "--bundled_program_path", artifacts.bpte, "--debug_buffer_size", "lots")
    assert r.returncode == 2 and "expected a number of bytes" in r.stderr  # argparse usage error


def test_debug_buffer_too_small_fails_the_run(artifacts, tmp_path):
    r = cli("run", "--bundled_program_path", artifacts.bpte, "--dump_intermediate_outputs", "--debug_buffer_size",
            "1K", cwd=str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr  # a user error, found before running (issue 23)
    assert r.stderr.startswith("error: --debug_buffer_size 1024 is too small")
    assert "Traceback" not in r.stderr and not os.path.exists(tmp_path / "debug_output.bin")


def test_numerical_debugging_cli_example(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import numerical_debugging_cli
    finally:
        sys.path.pop(0)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.path.join(ROOT, "src")  # for the `python -m edgetorch run` subprocess
    try:
        df = numerical_debugging_cli.main(["--model", "vit_tiny", "--backend", "portable", "--out", str(tmp_path)])
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert len(df) > 10 and all(g[0] is not None and g[0] <= 1e-10 for g in df["gap"])
    for f in ("bundled_program.bpte", "etrecord.bin", "etdump.etdp", "debug_output.bin"):
        assert (tmp_path / f).exists()
