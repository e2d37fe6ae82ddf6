"""``edgetorch inspect`` on what ``edgetorch generate --etdump`` records: the gap table of any call (``--execution K``,
or ``--method``/``--run`` mapped to the call that ran it), every call (``--execution all``), the per-call chart in
the report without ``--gap``, and ``--rows`` bounding the profile."""

from __future__ import annotations

import csv
import re

import pytest

from edgetorch.devtools import Inspector
from tests.cli.conftest import cli

TOKENS = 4  # prefill + 3 decode calls


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    r = cli("generate", "--tokens", str(TOKENS), "--prompt-len", "5", "--out", str(out), "--etdump")
    assert r.returncode == 0, r.stderr[-3000:]
    return out, ["inspect", "--etdump", str(out / "etdump.etdp"), "--etrecord", str(out / "etrecord.bin"),
                 "--debug-buffer", str(out / "debug_buffer.bin")]


def test_gap_of_the_default_method_and_of_a_decode_run(recording):
    _, base = recording
    r = cli(*base, "--gap", "--rows", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "per op of 'prefill'" in r.stdout and "no op adds error" in r.stdout
    r = cli(*base, "--gap", "--method", "decode", "--run", "1", "--rows", "3")
    assert r.returncode == 0, r.stderr[-2000:]  # no representative input for decode: its logged inputs are used
    assert "per op of call 2 ('decode' run 1)" in r.stdout and "no op adds error" in r.stdout


def test_execution_k_tsv_holds_the_python_gaps(recording, tmp_path):
    out, base = recording
    r = cli(*base, "--execution", "2", "--rows", "2", "--tsv", str(tmp_path / "g.tsv"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "per op of call 2 ('decode' run 1)" in r.stdout
    with open(tmp_path / "g.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    insp = Inspector(etdump_path=out / "etdump.etdp", etrecord=out / "etrecord.bin",
                     debug_buffer_path=out / "debug_buffer.bin")
    df = insp.calculate_numeric_gap("MSE", execution=2)
    assert len(rows) == len(df) > 50
    assert [float(r["gap"]) for r in rows] == pytest.approx([g[0] for g in df["gap"]], abs=1e-30)
    assert [r["aot_ops"] for r in rows] == [", ".join(o) for o in df["aot_ops"]]


def test_every_execution(recording, tmp_path):
    _, base = recording
    r = cli(*base, "--execution", "all", "--rows", "2", "--report", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr[-2000:]
    calls = re.findall(r"call +(\d+) (prefill|decode) +run +(\d+): output gap (\S+),.*; (\d+) culprit", r.stdout)
    assert [(int(c), m, int(k)) for c, m, k, _, _ in calls] == \
        [(0, "prefill", 0)] + [(i, "decode", i - 1) for i in range(1, TOKENS)]
    assert all(g == "0" and n == "0" for *_, g, n in calls)  # the portable runtime is exact
    assert f"no culprit in any of the {TOKENS} calls" in r.stdout
    assert "per execution" in (tmp_path / "r.html").read_text()


def test_report_without_gap_has_the_per_call_chart_and_rows_bound_the_profile(recording, tmp_path):
    _, base = recording
    r = cli(*base, "--rows", "5", "--report", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr[-2000:]
    html = (tmp_path / "r.html").read_text()
    assert "Final-output gap (MSE) per execution" in html
    more = re.search(r"\.\.\. (\d+) more rows \(--rows 0 shows all\)", r.stdout)
    assert more and int(more.group(1)) > 20
    body = [ln for ln in r.stdout.splitlines() if ln.startswith("│")]
    assert len(body) == 5
    r = cli(*base, "--rows", "0", "--tsv", str(tmp_path / "p.tsv"))
    assert r.returncode == 0 and "more rows" not in r.stdout
    with open(tmp_path / "p.tsv") as f:
        assert len(list(csv.DictReader(f, delimiter="\t"))) == 5 + int(more.group(1))


def test_bad_execution_exits_2(recording):
    _, base = recording
    for value, msg in (("x", "call index"), ("-1", ">= 0"), ("9", "not in the ETDump")):
        r = cli(*base, "--execution", value)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
