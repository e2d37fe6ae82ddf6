"""Terminal output of ``edgetorch demo`` / ``inspect`` (``cli/_table.py``) and ``inspect``'s report outputs:
markup printed as text, file names kept, scientific gaps, tables within the width, a line per step off a
terminal, ``--report`` with the graph and ``--model-explorer-json``."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from rich.console import Console

from edgetorch.cli._table import Steps, culprit_lines, gap_table, sci, short_source
from edgetorch.runtime import Runtime
from tests.cli.conftest import cli

SRC = "/home/someone/projects/deep/path/models/vit.py:155 in forward: x = torch.cat([cls, x], dim=1)"


def _frame(scaled: bool = True) -> pd.DataFrame:
    rows = [{"aot_ops": ["cat"], "runtime_ops": ["native_call_cat.out"], "gap": [1.5e-13], "local_gap": [0.0],
             "source": SRC, "rel_error": 2e-7, "local_rel_error": 0.0, "noise_floor": 1e-6, "verdict": "exact"},
            {"aot_ops": ["linear_[bold]3[/bold]"], "runtime_ops": ["DELEGATE_CALL"], "gap": [2.5e-7],
             "local_gap": [2.5e-7], "source": "/x/y/enc.py:7 in forward: [red]y[/red] = self.fc(x)",
             "rel_error": 3e-3, "local_rel_error": 3e-3, "noise_floor": 1e-6, "verdict": "real"}]
    df = pd.DataFrame(rows)
    return df if scaled else df.drop(columns=["rel_error", "local_rel_error", "noise_floor", "verdict"])


def _render(df: pd.DataFrame, width: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    console.print(gap_table(df, "numeric gap (MSE) [per op]", 0, console))
    return out.getvalue()


@pytest.mark.parametrize("width", [60, 100, 160])
def test_gap_table_prints_markup_as_text_within_the_width(width):
    text = _render(_frame(), width)
    assert all(len(line) <= width for line in text.splitlines())
    assert "vit.py:155" in text and "models/" not in text  # the directory goes, never the file name
    assert "linear_[b" in text  # markup printed as text (rich would have swallowed "[bold]")
    assert "[per op]" in text
    if width >= 160:
        assert "torch.cat([cls, x], dim=1)" in text and "linear_[bold]3[/bold]" in text
        assert "1.500e-13" in text and "2.500e-07" in text
    assert "0.0" not in text.replace("0.000", "")  # never pandas' 6-decimal zeros


def test_short_source_keeps_the_file_name():
    assert short_source(SRC) == "vit.py:155 in forward: x = torch.cat([cls, x], dim=1)"
    assert short_source(SRC, 30) == "vit.py:155 in forward: x = to…"
    assert short_source(SRC, 14).startswith("vit.py:155") and len(short_source(SRC, 14)) <= 14
    assert short_source("") == "" and short_source("model.py:3 in f: y") == "model.py:3 in f: y"


def test_scientific_notation():
    assert sci([1.2345e-14]) == "1.235e-14" and sci(0.0) == "0" and sci([None]) == "" and sci([3.0]) == "3.000e+00"


def test_culprit_lines_only_beyond_noise():
    df = _frame()
    lines = culprit_lines(df, df.iloc[[1]], "MSE")
    assert lines[0].startswith("culprits") and "3.000e-03" in lines[1] and "3e+03 × noise" in lines[1]
    assert "enc.py:7" in lines[1] and "[red]y[/red]" in lines[1]
    clean = culprit_lines(df, df.iloc[[]], "MSE")
    assert clean == ["no op adds error of its own beyond its rounding noise (0 rows within noise, 1 exact)"]
    unscaled = culprit_lines(_frame(False), _frame(False).iloc[[1]], "MSE")
    assert "no noise scale" in unscaled[0]


def test_multi_sample_tables_show_how_often_an_op_is_a_culprit():
    from edgetorch.cli._table import sample_lines

    df = _frame().assign(culprit_frequency=[0.0, 0.75])
    df.attrs.update(samples=8, rank_stability=0.9, top1_agreement=0.5)
    text = _render(df, 160)
    assert "culprit%" in text and "75%" in text
    assert sample_lines(df) == ["over 8 samples (gap columns: the worst sample; *_mean / *_max / *_p99 in the "
                                "table); culprit-set stability 0.90, top-1 agreement 50%"]
    assert sample_lines(_frame()) == []


def test_steps_print_one_line_per_step_off_a_terminal():
    out = io.StringIO()
    with Steps(Console(file=out, width=100), total=2) as steps:
        steps.next("torch.export [fast]")
        steps.next("gaps")
    lines = out.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["[1/2] torch.export [fast]", "[2/2] gaps"]


@pytest.fixture(scope="module")
def dumps(artifacts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("report_cli")
    program = Runtime.get().load_program(artifacts.pte, enable_etdump=True, debug_buffer_size="auto")
    program.load_method("forward").execute(*artifacts.inputs)
    etdump, debug = str(folder / "e.etdp"), str(folder / "d.bin")
    program.write_etdump_result_to_file(etdump, debug)
    return folder, etdump, debug


def test_inspect_report_and_model_explorer_json(artifacts, dumps):
    folder, etdump, debug = dumps
    report, nodes = folder / "r.html", folder / "nodes.json"
    r = cli("inspect", "--etdump", etdump, "--etrecord", artifacts.etrecord, "--debug-buffer", debug, "--gap",
            "--report", str(report), "--model-explorer-json", str(nodes))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[1/3] reading the ETDump" in r.stdout and "[3/3] writing the HTML report" in r.stdout
    assert "Model Explorer node data written to" in r.stdout
    doc = json.loads(nodes.read_text())
    assert set(doc["graph"]["results"]) >= {"linear", "relu", "linear_1"}
    html = report.read_text()
    assert '<svg class="graph"' in html and "data-row=\"0\"" in html


def test_inspect_model_explorer_json_needs_gap(artifacts, dumps, tmp_path):
    _, etdump, debug = dumps
    r = cli("inspect", "--etdump", etdump, "--etrecord", artifacts.etrecord, "--model-explorer-json",
            str(tmp_path / "n.json"))
    assert r.returncode == 2 and r.stderr.startswith("error: --model-explorer-json needs --gap")
    assert not (tmp_path / "n.json").exists()
