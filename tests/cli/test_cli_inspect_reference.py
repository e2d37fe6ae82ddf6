"""``edgetorch inspect`` on the reference ExecuTorch's ETDump, debug buffer and ETRecord (issue 26): the same
flags as on edgetorch's own artifacts."""

from __future__ import annotations

import csv
import json

from tests.cli.conftest import cli
from tests.devtools._reference_data import DATA, debug_buffer


def test_inspect_reference_artifacts(tmp_path):
    name = "cnn_xnnpack"
    args = ["--etdump", str(DATA / f"{name}.etdp"), "--etrecord", str(DATA / f"{name}_etrecord.bin")]
    r = cli("inspect", *args, "--rows", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Convolution (NHWC, F32) IGEMM #1" in r.stdout and "native_call_mean.out" in r.stdout
    tsv, report, me = tmp_path / "gaps.tsv", tmp_path / "report.html", tmp_path / "me.json"
    r = cli("inspect", *args, "--debug-buffer", str(debug_buffer(name)), "--gap", "--tsv", str(tsv),
            "--report", str(report), "--model-explorer-json", str(me))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
    ref = json.loads((DATA / f"{name}_gaps.json").read_text())["gaps"]["MSE"]
    assert len(rows) == len(ref)
    assert "no op adds error" in r.stdout
    assert report.stat().st_size > 10_000 and json.loads(me.read_text())


def _has_reference_runtime() -> bool:
    import importlib.util

    return importlib.util.find_spec("executorch") is not None


def test_run_reference_program_without_the_reference_runtime():
    if _has_reference_runtime():
        import pytest

        pytest.skip("the reference runtime is installed")
    r = cli("run", "--model_path", str(DATA / "cnn_xnnpack.pte"))
    assert r.returncode == 2 and "ExecuTorch program" in r.stderr and "executorch==1.5.1" in r.stderr


def test_run_reference_bundled_program_live(tmp_path):
    """With the optional reference runtime: a reference .bpte runs there, is verified, and its ETDump and debug
    buffer are inspected by edgetorch (CI runs this when the 'reference' extra is installed)."""
    import pytest

    if not _has_reference_runtime():
        pytest.skip("the reference runtime (executorch) is not installed")
    etdp, dbg = tmp_path / "e.etdp", tmp_path / "d.bin"
    # test case 0: the one the ETRecord holds as representative input (the reference ETDump does not say which
    # test case ran: its bundled_input_index stays -1)
    r = cli("run", "--bundled_program_path", str(DATA / "mlp_portable.bpte"), "--output_verification",
            "--dump_intermediate_outputs", "--etdump_path", str(etdp), "--debug_output_path", str(dbg),
            "--debug_buffer_size", "65536")
    assert r.returncode == 0 and "verified successfully" in r.stdout, r.stdout + r.stderr[-2000:]
    r = cli("inspect", "--etdump", str(etdp), "--etrecord", str(DATA / "mlp_portable_etrecord.bin"),
            "--debug-buffer", str(dbg), "--gap")
    assert r.returncode == 0 and "no op adds error" in r.stdout, r.stderr[-2000:]
