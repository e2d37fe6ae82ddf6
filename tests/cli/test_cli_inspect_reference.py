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
