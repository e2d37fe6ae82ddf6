"""``edgetorch inspect --gap --reference-graph float``: an INT8 program's per-layer quantization table against its
float model, from the saved files. The CLI must print and write what the Python API computes (the numbers
themselves are checked against independent computations in tests/devtools/test_float_reference.py), name the
worst layer, and refuse what it cannot do with a clear message."""

from __future__ import annotations

import ast
import csv
import math
import re

import pytest

from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector.culprits import find_culprits
from edgetorch.export import ExportRecipe, PortableRecipeType, export
from edgetorch.workflows.quant_fallback import record_debug_runs
from tests.cli.conftest import cli
from tests.quant_helpers import TinyConvNet, conv_samples


@pytest.fixture(scope="module")
def files(tmp_path_factory):  # noqa: ANN201
    """ETRecord (with the float program), ETDump and debug buffer of an INT8 TinyConvNet run on 3 samples."""
    folder = tmp_path_factory.mktemp("inspect_float")
    samples = conv_samples(3)
    session = export(TinyConvNet().eval(), samples,
                     ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL), generate_etrecord=True)
    paths, _ = record_debug_runs(session.get_executorch_program_manager(), samples, str(folder))
    return folder, paths


def _float(v: str) -> float:
    return math.nan if v == "" else float(v)


def test_the_table_worst_layers_tsv_and_report_match_the_api(files) -> None:  # noqa: ANN001
    folder, (rec, etdump, debug) = files
    tsv, report = folder / "q.tsv", folder / "q.html"
    r = cli("inspect", "--etdump", etdump, "--etrecord", rec, "--debug-buffer", debug, "--gap",
            "--reference-graph", "float", "--tsv", str(tsv), "--report", str(report))
    assert r.returncode == 0, r.stderr[-3000:]
    api = Inspector(etdump_path=etdump, etrecord=rec, debug_buffer_path=debug).calculate_numeric_gap(
        "MSE", reference_graph="float")
    assert "against the float model" in r.stdout and "(3 sample(s)" in r.stdout
    worst = find_culprits(api, 1).iloc[0]  # one culprit API: the CLI and the report give its answer
    first = r.stdout.split("worst layers", 1)[1].splitlines()[1]
    assert first.strip().startswith("1. #") and ", ".join(worst["aot_ops"]) in first
    assert f"local SQNR {worst['local_sqnr_db']:.1f} dB" in first
    rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
    assert len(rows) == len(api) > 3
    for row, (_, want) in zip(rows, api.iterrows(), strict=True):
        assert row["aot_ops"] == ", ".join(want["aot_ops"])
        for col in ("sqnr_db", "local_sqnr_db", "weight_sqnr_db"):
            got, exp = _float(row[col]), float(want[col])
            assert (math.isnan(got) and math.isnan(exp)) or got == pytest.approx(exp, rel=1e-12, abs=0)
    html = report.read_text()
    local = api["local_sqnr_db"].astype(float)
    assert "id='quant'" in html and html.count("class=\"qbar") == local.map(math.isfinite).sum()
    # the first section is the answer: the worst layer, before any table; exact rows are "exact" markers
    assert re.findall(r"<h2 id='([^']+)'", html)[0] == "quant" and "Culprits" not in html
    answer = html.split("class='answer'>", 1)[1].split("</p>", 1)[0]
    assert f"<b>{', '.join(worst['aot_ops'])}</b>" in answer and html.index(answer) < html.index("<table id='quant'")
    assert html.count('<g class="qexact"') == (local == math.inf).sum() > 0
    assert "graph_map[&#x27;float/forward&#x27;]" in html


def test_the_printed_exclusions_keep_the_worst_layers_float(files, tmp_path) -> None:  # noqa: ANN001
    """The recipe options the CLI prints, applied: every worst layer's row then adds no error of its own."""
    _, (rec, etdump, debug) = files
    r = cli("inspect", "--etdump", etdump, "--etrecord", rec, "--debug-buffer", debug, "--gap",
            "--reference-graph", "float", "--rows", "1", "--worst", "10")
    assert r.returncode == 0, r.stderr[-3000:]
    options = {k: ast.literal_eval(v) for k, v in re.findall(r"(quant_exclude_\w+)=(\[[^\]]*\])", r.stdout)}
    assert options.get("quant_exclude_nodes")  # conv/linear/relu layers are kept by node
    assert options.get("quant_exclude_activations")  # and the outputs of the ranked layers' activations
    samples = conv_samples(3)
    session = export(TinyConvNet().eval(), samples, ExportRecipe.get_recipe(
        PortableRecipeType.INT8_STATIC_PER_CHANNEL, **options), generate_etrecord=True)
    paths, _ = record_debug_runs(session.get_executorch_program_manager(), samples, str(tmp_path))
    table = Inspector(etdump_path=paths[1], etrecord=paths[0], debug_buffer_path=paths[2]).calculate_numeric_gap(
        "MSE", reference_graph="float")
    kept = set(options["quant_exclude_nodes"]) | set(options["quant_exclude_activations"])
    rows = table[[ops[0] in kept for ops in table["aot_ops"]]]
    # the layers kept by node stay rows with no error of their own; a value kept float may leave the table (a
    # float view logs no value of its own): it is no longer quantized either way
    assert {ops[0] for ops in rows["aot_ops"]} >= set(options["quant_exclude_nodes"])
    assert (rows["local_sqnr_db"] == math.inf).all()


def test_output_impact_column_list_and_report(files, tmp_path) -> None:  # noqa: ANN001
    """--impact: each layer's own error injected into the float model; the CLI's column, ranking and report list
    are the Python API's (``output_impact``)."""
    from edgetorch.devtools.inspector.float_reference import output_impact

    _, (rec, etdump, debug) = files
    tsv, report = tmp_path / "i.tsv", tmp_path / "i.html"
    r = cli("inspect", "--etdump", etdump, "--etrecord", rec, "--debug-buffer", debug, "--gap",
            "--reference-graph", "float", "--impact", "--tsv", str(tsv), "--report", str(report))
    assert r.returncode == 0, r.stderr[-3000:]
    inspector = Inspector(etdump_path=etdump, etrecord=rec, debug_buffer_path=debug)
    api = inspector.calculate_numeric_gap("MSE", reference_graph="float")
    impact = output_impact(inspector)
    rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
    for row, h in zip(rows, api["float_debug_handle"], strict=True):
        want = impact.get(h)
        assert (row["output_impact"] == "") if want is None else float(row["output_impact"]) == pytest.approx(want)
    order = sorted((h for h in api["float_debug_handle"] if impact.get(h) is not None), key=lambda h: -impact[h])
    names = {h: ", ".join(ops) for h, ops in zip(api["float_debug_handle"], api["aot_ops"], strict=True)}
    first = r.stdout.split("costing the output most", 1)[1].splitlines()[1]
    assert names[order[0]] in first
    listed = re.findall(r"<ol class='culprits impact'>(.*?)</ol>", report.read_text())[0]
    assert re.findall(r"<b>(.*?)</b>", listed) == [names[h] for h in order[:5]]


def test_the_edge_table_of_a_quantized_program_points_to_the_float_model(files, tmp_path) -> None:  # noqa: ANN001
    """Without --reference-graph the terminal says how to compare with the float model, and the report leads with
    the float-model ranking anyway; the program compared with itself follows under its own heading."""
    _, (rec, etdump, debug) = files
    report = tmp_path / "self.html"
    r = cli("inspect", "--etdump", etdump, "--etrecord", rec, "--debug-buffer", debug, "--gap", "--rows", "3",
            "--report", str(report))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--reference-graph float shows what each layer's quantization costs" in r.stdout
    assert "the report leads with the float-model ranking" in r.stdout
    html = report.read_text()
    api = Inspector(etdump_path=etdump, etrecord=rec, debug_buffer_path=debug).calculate_numeric_gap(
        "MSE", reference_graph="float")
    worst = ", ".join(find_culprits(api, 1).iloc[0]["aot_ops"])
    ids = re.findall(r"<h2 id='([^']+)'", html)
    assert ids[:2] == ["quant", "self"] and "culprits" in ids
    assert f"<b>{worst}</b>" in html.split("class='answer'>", 1)[1].split("</p>", 1)[0]


@pytest.mark.parametrize(("extra", "message"), [
    (("--reference-graph", "float"), "--reference-graph needs --gap"),
    (("--gap", "--reference-graph", "float", "--run", "1"), "--reference-graph float uses every recorded sample"),
    (("--gap", "--reference-graph", "float", "--model-explorer-json", "n.json"), "cannot take the float-model"),
    (("--gap", "--reference-graph", "nosuch"), "nosuch"),
    (("--gap", "--reference-graph", "float", "--worst", "0"), "--worst must be >= 1"),
    (("--gap", "--impact"), "--impact needs --gap --reference-graph float"),
    (("--gap", "--reference-graph", "exported_program", "--impact"), "--impact needs --reference-graph float"),
])
def test_bad_combinations_are_named(files, extra, message) -> None:  # noqa: ANN001
    folder, (rec, etdump, debug) = files
    r = cli("inspect", "--etdump", etdump, "--etrecord", rec, "--debug-buffer", debug, *extra, cwd=str(folder))
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert message in r.stderr and "Traceback" not in r.stderr


def test_a_float_program_without_a_float_reference_is_a_clear_error(artifacts, tmp_path) -> None:  # noqa: ANN001
    """The float MLP of the shared CLI artifacts: its ETRecord holds no float program to compare with."""
    from edgetorch.runtime import Runtime

    program = Runtime.get().load_program(artifacts.pte, enable_etdump=True, debug_buffer_size="auto")
    program.load_method("forward").execute(*artifacts.inputs)
    etdump, debug = str(tmp_path / "e.etdp"), str(tmp_path / "d.bin")
    program.write_etdump_result_to_file(etdump, debug)
    r = cli("inspect", "--etdump", etdump, "--etrecord", artifacts.etrecord, "--debug-buffer", debug, "--gap",
            "--reference-graph", "float")
    assert r.returncode == 2 and "no float program" in r.stderr and "Traceback" not in r.stderr


def test_an_ort_int8_delegate_says_how_much_exposing_its_values_changed_it(tmp_path) -> None:  # noqa: ANN001
    """Inside an ONNX Runtime INT8 delegate the rows come from the exposing session: the table says how far its
    outputs were from the plain session's (the observer effect), in the terminal and the report."""
    from edgetorch.export import OrtRecipeType

    samples = conv_samples(2)
    session = export(TinyConvNet().eval(), samples, ExportRecipe.get_recipe(OrtRecipeType.INT8_STATIC_PER_CHANNEL),
                     generate_etrecord=True)
    rec, etdump, debug = record_debug_runs(session.get_executorch_program_manager(), samples, str(tmp_path))[0]
    report = tmp_path / "r.html"
    r = cli("inspect", "--etdump", etdump, "--etrecord", rec, "--debug-buffer", debug, "--gap",
            "--reference-graph", "float", "--report", str(report))
    assert r.returncode == 0, r.stderr[-3000:]
    effect = Inspector(etdump_path=etdump, etrecord=rec, debug_buffer_path=debug).observer_effect
    assert effect is not None  # a quantized delegate's first debug run measures it ("auto")
    assert f"observer effect {effect:.3g} relative" in r.stdout
    assert f"observer effect {effect:.3g} relative" in report.read_text()


def test_each_layers_exclusions_alone_keep_it_float(files, tmp_path) -> None:  # noqa: ANN001
    """One worst layer at a time: its printed exclusions keep that row float. A relu fused into a conv needs the
    conv kept too (excluding the relu alone leaves the pattern's output quantized)."""
    from edgetorch.cli._quant_table import exclusions
    from edgetorch.devtools.inspector.float_reference import float_graph

    _, (rec, etdump, debug) = files
    inspector = Inspector(etdump_path=etdump, etrecord=rec, debug_buffer_path=debug)
    table = inspector.calculate_numeric_gap("MSE", reference_graph="float")
    fgm = float_graph(inspector)
    relu = table[[ops[0] == "relu" for ops in table["aot_ops"]]]
    assert exclusions(relu, fgm) == (["conv2d", "relu"], ["relu"])  # its output: the next conv's input
    samples = conv_samples(3)
    for k, (_, row) in enumerate(table[table["local_sqnr_db"] < math.inf].iterrows()):
        nodes, values = exclusions(table.loc[[row.name]], fgm)
        session = export(TinyConvNet().eval(), samples, ExportRecipe.get_recipe(
            PortableRecipeType.INT8_STATIC_PER_CHANNEL, quant_exclude_nodes=nodes, quant_exclude_activations=values),
            generate_etrecord=True)
        paths, _ = record_debug_runs(session.get_executorch_program_manager(), samples, str(tmp_path / str(k)))
        after = Inspector(etdump_path=paths[1], etrecord=paths[0], debug_buffer_path=paths[2]).calculate_numeric_gap(
            "MSE", reference_graph="float")
        same = after[[ops[0] == row["aot_ops"][0] for ops in after["aot_ops"]]]
        assert (same["local_sqnr_db"] == math.inf).all(), (row["aot_ops"], nodes, values)
