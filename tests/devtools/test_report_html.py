"""The HTML report and its graph: structure checks in Python, then the page in a real headless Chromium.

The browser tests need Playwright for Python (a dev dependency) and a Chromium binary (Debian's ``chromium``,
``/usr/bin/chromium``, or ``$EDGETORCH_CHROMIUM``); Playwright never downloads a browser here. Without them the
browser tests are skipped with the reason, unless ``EDGETORCH_REQUIRE_BROWSER=1`` (set by ``.ci/run`` once it
has installed Chromium), where a missing browser fails them.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from html.parser import HTMLParser

import pandas as pd
import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.graph_view import extract_graph, layout, paginate, rows_for_nodes
from edgetorch.devtools.inspector import float_reference  # noqa: F401 - torchao loaded before any test's RSS baseline
from edgetorch.devtools.model_explorer import ModelExplorerError, node_data, write_node_data
from edgetorch.devtools.report import ReportError, write_report


@dataclass
class Run:
    inspector: Inspector
    df: pd.DataFrame
    delegated: bool


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    """small_cnn lowered to ONNX Runtime when installed (one delegate partition), run with a debug buffer."""
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.models import get_model
    from edgetorch.runtime import Runtime

    try:
        from edgetorch.backends.onnxruntime import OrtPartitioner
        parts = [OrtPartitioner()]
    except ImportError:
        parts = []
    d = tmp_path_factory.mktemp("report")
    model, inputs = get_model("small_cnn")
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=parts,
                                     generate_etrecord=True).to_executorch()
    et.save(d / "m.pte")
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    rec.save(d / "etrecord.bin")
    program = Runtime.get().load_program(str(d / "m.pte"), enable_etdump=True, debug_buffer_size="auto")
    program.load_method("forward").execute(*inputs)
    program.write_etdump_result_to_file(str(d / "e.etdp"), str(d / "d.bin"))
    insp = Inspector(etdump_path=str(d / "e.etdp"), etrecord=str(d / "etrecord.bin"),
                     debug_buffer_path=str(d / "d.bin"))
    return Run(insp, insp.calculate_numeric_gap("MSE"), bool(parts))


def _is_call(row: pd.Series) -> bool:
    return list(row["runtime_ops"]) == ["DELEGATE_CALL"]


def _planted(df: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """A copy of ``df`` where one early row adds error far beyond noise (verdict "real"), and the last
    non-delegate row has the largest accumulated gap but only noise locally. Returns (df, culprit, largest)."""
    if "verdict" not in df:
        pytest.skip("the gap table has no scale-aware columns yet")
    df = df.copy()
    rows = [i for i in df.index if not _is_call(df.loc[i])]
    culprit, largest = rows[1], rows[-1]
    floor = df.at[culprit, "noise_floor"] or 1e-6
    df.at[culprit, "local_rel_error"], df.at[culprit, "rel_error"], df.at[culprit, "verdict"] = 1e3 * floor, \
        1e3 * floor, "real"
    df.at[culprit, "local_gap"] = [1e-3]
    df.at[largest, "gap"] = [1.0]
    if df.at[largest, "verdict"] == "real":
        df.at[largest, "verdict"] = "noise"
    for i in df.index:  # everything else within noise
        if i != culprit and df.at[i, "verdict"] == "real":
            df.at[i, "verdict"] = "noise"
    return df, culprit, largest


class _Tags(HTMLParser):
    """Collects start tags with their attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def _tags(html: str) -> list[tuple[str, dict[str, str]]]:
    p = _Tags()
    p.feed(html)
    return p.tags


# -- graph_view ----------------------------------------------------------------------------------------------

def test_graph_has_one_node_per_handle_and_the_delegate_partition(run):
    g = extract_graph(run.inspector.etrecord)
    handles = [n.debug_handle for n in g.nodes if n.kind == "op"]
    assert len(handles) == len(set(handles)) and None not in handles
    assert [n.kind for n in g.nodes].count("input") == 1 and g.nodes[-1].kind == "output"
    ids = {n.id for n in g.nodes}
    assert all(i in ids for n in g.nodes for i in n.inputs)  # getitem and parameters folded away
    conv = g.by_handle()[run.df.iloc[0]["aot_debug_handle"][0]]
    assert conv.op == "convolution" and conv.module == "conv1"
    assert "cnn.py:" in conv.source and "self.conv1(x)" in conv.source and "forward" in conv.stack_trace
    if run.delegated:
        (part,) = g.partitions.values()
        assert part.backend == "onnxruntime" and all(n.partition == part.id for n in g.nodes if n.kind == "op")


def test_every_row_but_delegate_calls_belongs_to_exactly_one_node(run):
    g = extract_graph(run.inspector.etrecord)
    groups = [(k, tuple(r["aot_debug_handle"]), int(r["instruction_id"]) if _is_call(r) else None)
              for k, (_, r) in enumerate(run.df.iterrows())]
    node_row, part_row = rows_for_nodes(g, groups)
    assert sorted(node_row.values()) == [k for k, (_, r) in enumerate(run.df.iterrows()) if not _is_call(r)]
    assert len(set(node_row)) == len(node_row)
    calls = [k for k, (_, r) in enumerate(run.df.iterrows()) if _is_call(r)]
    assert sorted(part_row.values()) == calls


def test_layout_pages_and_layers(run):
    g = extract_graph(run.inspector.etrecord)
    lay = layout(g, max_nodes=6)
    assert sum(len(p) for p in lay.pages) == len(g.nodes) and all(2 <= len(p) <= 6 for p in lay.pages[:-1])
    for n in g.nodes:  # an edge on one page always goes down
        for src in n.inputs:
            a, b = lay.placed[src], lay.placed[n.id]
            assert a.page < b.page or (a.page == b.page and a.layer < b.layer)
    assert layout(g).pages == [[n.id for n in g.nodes]]
    with pytest.raises(ValueError, match="max_nodes"):
        paginate(g, 1)


# -- the report ---------------------------------------------------------------------------------------------

def test_report_graph_nodes_rows_and_culprits(run, tmp_path):
    df, culprit, largest = _planted(run.df)
    path = write_report(tmp_path / "r.html", df, run.inspector.to_dataframe(), etrecord=run.inspector.etrecord)
    html = open(path).read()
    tags = _tags(html)
    nodes = [a for t, a in tags if t == "g" and "gn" in a.get("class", "").split()]
    rows = {a["id"]: a for t, a in tags if t == "tr" and a.get("id", "").startswith("r")}
    assert len(rows) == len(df)
    linked = [int(a["data-row"]) for a in nodes if "data-row" in a]
    assert sorted(linked) == [k for k, (_, r) in enumerate(df.iterrows()) if not _is_call(r)]
    for a in nodes:  # the row names its node back
        if "data-row" in a:
            assert rows[f"r{a['data-row']}"]["data-node"] == a["data-id"]
    # pink rows and starred nodes: the planted culprit, not the largest accumulated gap
    pos = list(df.index)
    assert [k for k, a in rows.items() if "culprit" in a.get("class", "")] == [f"r{pos.index(culprit)}"]
    starred = [a["data-row"] for a in nodes if "culprit" in a["class"].split()]
    assert starred == [str(pos.index(culprit))] and str(pos.index(largest)) not in starred
    assert "Culprits: ops that add error beyond noise" in html and html.count("<li>") >= 1
    assert ("(delegate)" in html) == run.delegated
    data = json.loads(re.search(r"<script type='application/json' id='edata'>(.*?)</script>", html, re.S)[1])
    assert set(data["nodes"]) == {a["data-id"] for a in nodes}
    assert all(int(k) < len(data["traces"]) for n in data["nodes"].values() for k in n["tr"].split(",") if k)
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html


def test_clean_table_names_no_culprit_and_unscaled_tables_degrade(run, tmp_path):
    clean = run.df.copy()
    if "verdict" in clean:
        clean["verdict"] = ["exact" if v == "exact" else "noise" for v in clean["verdict"]]
    html = open(write_report(tmp_path / "c.html", clean, etrecord=run.inspector.etrecord)).read()
    assert "class='culprit'" not in html and "★</text>" not in html
    bare = run.df.drop(columns=[c for c in ("rel_error", "local_rel_error", "noise_floor", "verdict")
                                if c in run.df])
    html = open(write_report(tmp_path / "b.html", bare, etrecord=run.inspector.etrecord)).read()
    assert "no noise scale" in html and "class='culprit'" not in html and "<svg class=\"graph\"" in html


def test_report_multi_sample_section_and_long_graphs_paginate(run, tmp_path):
    df = run.df.copy()
    local = [v[0] or 0.0 for v in df["local_gap"]]
    df["local_gap_mean"], df["local_gap_max"] = local, [2 * v + 1e-9 for v in local]
    df["culprit_frequency"], df["top1_frequency"] = [0.0] * len(df), [0.0] * len(df)
    df.loc[df.index[2], ["culprit_frequency", "top1_frequency"]] = [0.5, 0.25]
    df.attrs["samples"] = pd.DataFrame({"sample": range(4), "output_gap": [1e-9, 2e-9, 0.0, 5e-8]})
    df.attrs["rank_stability"] = 0.75
    html = open(write_report(tmp_path / "s.html", df, etrecord=run.inspector.etrecord, max_page_nodes=6)).read()
    assert "Over 4 samples" in html and 'class="chart per-sample"' in html and 'class="chart samples"' in html
    assert "<th>local_gap_max</th>" in html and "<th>culprit_frequency</th>" in html
    assert "culprit-set stability 0.75" in html
    assert f"{', '.join(df.iloc[2]['aot_ops'])}: a culprit in 50% of the samples, first in 25%" in html
    pages = [a for t, a in _tags(html) if t == "div" and a.get("class") == "gpage"]
    assert len(pages) >= 3 and sum("hidden" not in a for a in pages) == 1
    assert "class=\"stub\"" in html  # an input from another page
    with pytest.raises(ReportError):
        write_report(tmp_path / "x.html", df, max_page_nodes=1)


def test_model_explorer_node_data(run, tmp_path):
    df = run.df
    path = write_node_data(tmp_path / "n.json", df)
    doc = json.load(open(path))
    (graph,) = doc.values()
    assert list(doc) == ["graph"] and isinstance(graph["results"], dict)
    names = {n for ops, r in zip(df["aot_ops"], df["runtime_ops"]) if list(r) != ["DELEGATE_CALL"] for n in ops}
    assert names <= set(graph["results"])
    for item in graph["results"].values():
        assert set(item) == {"value", "bgColor"} and isinstance(item["value"], float)
        assert re.fullmatch(r"#[0-9a-f]{6}", item["bgColor"])
    if "verdict" in df:  # the noise ratio, with the report's thresholds
        assert [t["value"] for t in graph["thresholds"]][:3] == [0, 1, 100]
    single = node_data(df, value="local_gap", graph_id=None)
    assert "results" in single and "gradient" in single
    with pytest.raises(ModelExplorerError, match="no column"):
        node_data(df, value="nope")


# -- in a real browser -----------------------------------------------------------------------------------------

BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run"]


def _chromium() -> str:
    exe = os.environ.get("EDGETORCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return exe or ""


@pytest.fixture(scope="module")
def browser():
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    required = os.environ.get("EDGETORCH_REQUIRE_BROWSER") == "1"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            raise
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    exe = _chromium()
    if not exe:
        if required:
            pytest.fail("EDGETORCH_REQUIRE_BROWSER=1 but no chromium binary was found")
        pytest.skip("no chromium binary (apt-get install chromium, or set EDGETORCH_CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=BROWSER_ARGS)
        yield b
        b.close()


def _open(browser, path: str, width: int):
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: errors.append(f"request {r.url}") if not r.url.startswith(("file:", "data:"))
            else None)
    page.goto("file://" + os.path.abspath(path))
    return page, errors


def test_report_in_chromium(browser, run, tmp_path):
    df, culprit, _ = _planted(run.df)
    path = write_report(tmp_path / "r.html", df, run.inspector.to_dataframe(), etrecord=run.inspector.etrecord,
                        max_page_nodes=6)
    page, errors = _open(browser, str(path), 1280)
    non_call = [k for k, (_, r) in enumerate(df.iterrows()) if not _is_call(r)]
    rows = page.eval_on_selector_all(".gn[data-row]", "els => els.map(e => +e.dataset.row)")
    assert sorted(rows) == non_call
    # click a node on the visible page: the panel shows its row, the row is selected
    node = page.locator(".gpage:not([hidden]) .gn[data-row]").nth(1)
    k = node.get_attribute("data-row")
    node.click()
    panel = page.inner_text("#nodeinfo")
    assert df.iloc[int(k)]["aot_ops"][0] in panel and "stack trace" in panel and "cnn.py" in panel
    assert page.get_attribute(f"#r{k}", "class").split()[-1] == "sel"
    # a row's # finds its node on another page
    last = non_call[-1]
    page.click(f"#r{last} td.rowlink")
    target = page.locator(f".gn[data-row='{last}']")
    assert "sel" in target.get_attribute("class") and target.is_visible()
    assert page.locator(".gpage:not([hidden])").count() == 1
    # the culprit is pink and starred; filtering by culprits leaves its row only
    page.select_option("#fv", "culprit")
    visible = page.eval_on_selector_all("#gaps tbody tr", "rs => rs.filter(r => !r.hidden).map(r => r.id)")
    assert visible == [f"r{list(df.index).index(culprit)}"]
    page.select_option("#fv", "")
    page.fill("#flt", "relu")
    visible = page.eval_on_selector_all("#gaps tbody tr", "rs => rs.filter(r => !r.hidden).length")
    assert 0 < visible < len(df)
    # sorting by a numeric column orders the rows
    page.fill("#flt", "")
    page.click("#gaps thead th:nth-child(4)")
    vals = page.eval_on_selector_all("#gaps tbody tr td:nth-child(4)", "ts => ts.map(t => t.dataset.v)")
    nums = [float(v) for v in vals if v]
    assert nums == sorted(nums)
    assert errors == []


def test_report_fits_a_phone_screen(browser, run, tmp_path):
    path = write_report(tmp_path / "p.html", run.df, run.inspector.to_dataframe(), etrecord=run.inspector.etrecord,
                        summary={"program": "/a/very/long/path/" + "x" * 200 + ".pte"})
    page, errors = _open(browser, str(path), 390)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.locator(".gpage:not([hidden]) .gn[data-row]").first.click()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert errors == []


def test_a_minimal_gap_table_still_makes_a_report(tmp_path):
    """Tables from other sources (no handles, no scale, no stack traces) degrade: no graph, no culprit."""
    df = pd.DataFrame({"aot_ops": [["a"], ["b"]], "runtime_ops": [["x"], ["y"]], "gap": [[1e-9], [0.0]],
                       "local_gap": [[1e-9], [None]]})
    df.attrs["samples"] = 1
    html = open(write_report(tmp_path / "m.html", df)).read()
    assert "1.000e-09" in html and "no noise scale" in html and "id='samples'" not in html
    assert "<svg class=\"graph\"" not in html and "class='culprit'" not in html


def test_two_partitions_and_shared_handles_from_a_hand_made_graph():
    """graph_from_module on a traced function: ops sharing a handle merge, getitem folds, each delegate call's
    handles form its partition, and DELEGATE_CALL rows go to their partition by instruction id."""
    from types import SimpleNamespace

    from edgetorch.devtools.graph_view import graph_from_module, partitions_of
    from edgetorch.exir.debug_handles import set_debug_handle

    def f(x):
        a = torch.relu(x)
        b = torch.neg(a)          # same handle as relu: one ATen op decomposed into two
        parts = torch.split(b, 2)
        return torch.sin(parts[0]) + torch.cos(parts[1])

    gm = torch.fx.symbolic_trace(f)
    handles = iter([1, 1, 2, 3, 4, 5])
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target.__name__ != "getitem":
            set_debug_handle(n, next(handles))
    rec = SimpleNamespace(delegate_map={"forward": {0: {"name": "onnxruntime"}, 4: {"name": "onnxruntime"}}},
                          debug_handle_map={"forward": {0: [1, 2], 4: [3, 4, 5]}})
    g = graph_from_module(gm, partitions=partitions_of(rec, "forward"))
    ops = {n.id: n for n in g.nodes}
    assert ops["h1"].op == "relu, neg" and ops["h1"].names == ["relu", "neg"]
    assert ops["h3"].inputs == ["h2"] and ops["h4"].inputs == ["h2"]  # split's getitems folded into split
    assert ops["h5"].inputs == ["h3", "h4"] and ops["output"].inputs == ["h5"]
    assert [ops[h].partition for h in ("h1", "h2", "h3", "h5")] == ["onnxruntime #0"] * 2 + ["onnxruntime #4"] * 2
    node_row, part_row = rows_for_nodes(g, [(0, (1,), None), (1, (1, 2), 0), (2, (2,), None), (3, (3, 4, 5), 4),
                                            (4, (5,), None), (5, (4, 5), None)])
    assert node_row == {"h1": 0, "h2": 2, "h5": 4} and part_row == {"onnxruntime #0": 1, "onnxruntime #4": 3}


# -- the quantization section (a float-reference table) -----------------------------------------------------------

@pytest.fixture(scope="module")
def quant_table() -> pd.DataFrame:
    """The float-reference gap table of an INT8 TinyConvNet (portable) over 3 samples."""
    from edgetorch.export import ExportRecipe, PortableRecipeType, export
    from edgetorch.workflows.quant_fallback import inspect_quantized
    from tests.quant_helpers import TinyConvNet, conv_samples

    samples = conv_samples(3)
    session = export(TinyConvNet().eval(), samples,
                     ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL), generate_etrecord=True)
    return inspect_quantized(session.get_executorch_program_manager(), samples).table


def _bars(html: str) -> list[tuple[int, bool]]:
    """(row, worst) of every bar of the SQNR chart."""
    return [(int(m.group(2)), "worst" in m.group(1))
            for m in re.finditer(r'<rect class="(qbar[^"]*)" data-row="(\d+)"', html)]


def test_quant_section_names_the_worst_layers_in_rank_order(quant_table, tmp_path) -> None:  # noqa: ANN001
    from edgetorch.devtools.inspector.culprits import find_culprits

    html = open(write_report(tmp_path / "q.html", None, quant_df=quant_table)).read()
    ranked = find_culprits(quant_table, 5)  # the one culprit API's ranking of the float table
    pos = {label: k for k, label in enumerate(quant_table.index)}
    worst = [pos[i] for i in ranked.index]
    assert re.findall(r"<li><a href='#q(\d+)'>", html) == [str(k) for k in worst]
    bars = _bars(html)
    assert [r for r, _ in bars] == [k for k, v in enumerate(quant_table["local_sqnr_db"]) if math.isfinite(v)]
    assert sorted(r for r, w in bars if w) == sorted(worst)
    assert len(re.findall(r"<tr id='q\d+'", html)) == len(quant_table)
    assert len(re.findall(r"<tr id='q\d+' class='culprit'>", html)) == len(worst)
    # the scale ends 10 dB above the quantized rows' best: a row beyond it (e.g. no error at all, infinite local
    # SQNR) is drawn to the top and marked
    q = quant_table[quant_table["quantized"]]
    top = math.ceil(max(v for v in [*q["local_sqnr_db"], *q["sqnr_db"]] if math.isfinite(v)) / 10) * 10 + 10
    beyond = [k for k, v in enumerate(quant_table["local_sqnr_db"]) if math.isfinite(v) and v > top]
    assert html.count('class="qinf"') == len(beyond)
    # an exact row (infinite local SQNR) is a marker labelled "exact", not a bar
    exact = [k for k, v in enumerate(quant_table["local_sqnr_db"]) if v == math.inf]
    assert exact and re.findall(r'<g class="qexact" data-row="(\d+)"', html) == [str(k) for k in exact]
    assert "<a href='#quant'>quantization</a>" in html


def test_quant_df_must_be_a_float_reference_table(run, tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ReportError, match="float-reference gap table"):
        write_report(tmp_path / "x.html", run.df, quant_df=run.df)


def test_quant_section_in_chromium(browser, quant_table, tmp_path) -> None:  # noqa: ANN001
    path = write_report(tmp_path / "q.html", None, quant_df=quant_table)
    page, errors = _open(browser, str(path), 1280)
    bars = page.eval_on_selector_all("#sqnr rect.qbar", "els => els.map(e => e.getBoundingClientRect().height)")
    local = quant_table["local_sqnr_db"].astype(float)
    assert len(bars) == local.map(math.isfinite).sum() and all(h > 0 for h in bars)
    # a higher local SQNR draws a taller bar
    finite = list(zip([v for v in local if math.isfinite(v)], bars, strict=True))
    assert [h for _, h in sorted(finite)] == sorted(h for _, h in finite)
    # sorting by local SQNR puts the worst layer first
    page.click("#quant thead th:nth-child(5)")
    first = page.eval_on_selector("#quant tbody tr", "r => r.id")
    assert first == "q" + page.eval_on_selector("ol.culprits li a", "a => a.getAttribute('href').slice(2)")
    assert errors == []
    phone, errors = _open(browser, str(path), 390)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390 and errors == []


# -- an INT8 program's report leads with its float-model answer ----------------------------------------------------

def _h2_ids(html: str) -> list[str]:
    return re.findall(r"<h2 id='([^']+)'", html)


def _worst_name(table: pd.DataFrame) -> str:
    from edgetorch.devtools.inspector.culprits import find_culprits

    return ", ".join(find_culprits(table, top=1).iloc[0]["aot_ops"])


def test_an_int8_report_leads_with_the_float_ranking(run, quant_table, tmp_path) -> None:  # noqa: ANN001
    """With a float-reference table the first section is the float-model ranking naming the worst layer, and the
    comparison with the program itself follows under its own heading; a float table passed as gap_df is routed
    there too."""
    worst = _worst_name(quant_table)
    html = open(write_report(tmp_path / "both.html", run.df, quant_df=quant_table,
                             etrecord=run.inspector.etrecord)).read()
    ids = _h2_ids(html)
    assert ids[:2] == ["quant", "self"] and ids.index("culprits") > 1
    first = html.split("<h2 id='self'>", 1)[0]
    assert "Worst layer: <a href='#q" in first and worst in first.split("class='answer'>", 1)[1][:400]
    assert html.index("<a href='#quant'>") < html.index("<a href='#culprits'>")
    alone = open(write_report(tmp_path / "alone.html", quant_table)).read()
    assert _h2_ids(alone)[0] == "quant" and "id='culprits'" not in alone and worst in alone


def test_the_first_section_says_where_the_output_is_lost_and_what_is_not_ranked(quant_table, tmp_path) -> None:  # noqa: ANN001
    from edgetorch.devtools.inspector.culprits import find_culprits

    df = quant_table.copy()
    df.attrs = dict(quant_table.attrs)
    finite = [i for i, v in zip(df.index, df["local_sqnr_db"], strict=True) if math.isfinite(v)]
    lost, silent = finite[-1], finite[0]
    df.iloc[df.index.get_loc(lost):, df.columns.get_loc("sqnr_db")] = -3.0  # from here on the noise exceeds the signal
    df.at[silent, "local_sqnr_db"] = -math.inf  # a float output that is zero: no signal
    found = find_culprits(df)
    html = open(write_report(tmp_path / "lost.html", None, quant_df=df)).read()
    head = html.split("<h3>", 1)[0]
    assert f"The output is lost from {found.attrs['lost_from']}" in head.replace("&#x27;", "'")
    assert "without a float signal" in head and "exact (no quantization error)" in head
    pos = list(df.index).index(silent)
    assert re.findall(r'<g class="qnosig" data-row="(\d+)"', html) == [str(pos)]
    assert f'data-row="{pos}" x=' not in html  # no bar for it


def test_the_int8_first_screen_in_chromium(browser, run, quant_table, tmp_path) -> None:  # noqa: ANN001
    """On a 1280x900 screen the first heading is the float-model section and the worst layer is visible; exact
    rows are drawn as "exact" markers, not as bars."""
    path = write_report(tmp_path / "s.html", run.df, quant_df=quant_table, etrecord=run.inspector.etrecord)
    page, errors = _open(browser, str(path), 1280)
    assert page.eval_on_selector("h2", "h => h.id") == "quant"
    answer = page.locator("p.answer").first
    assert _worst_name(quant_table) in answer.inner_text()
    assert answer.bounding_box()["y"] + answer.bounding_box()["height"] <= 900
    marks = page.eval_on_selector_all("#sqnr g.qexact", "gs => gs.map(g => g.textContent)")
    assert marks and all("exact" in m for m in marks)
    row = page.eval_on_selector("#sqnr g.qexact", "g => g.dataset.row")
    assert page.locator(f"#sqnr rect.qbar[data-row='{row}']").count() == 0
    assert errors == []
