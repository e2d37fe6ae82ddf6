"""Numeric debugging across generated tokens: a tiny Llama's prefill (6 tokens) + 5 decode steps on the runtime
with a debug buffer; the Inspector replays the reference on the logged inputs with the KV caches carried across
methods, and its per-execution gap tables are checked against an eager replay of the model."""

from __future__ import annotations

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.etdump import DebugBuffer, read_etdump
from edgetorch.devtools.inspector.generation import execution_records
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.formats import etdump as ed
from edgetorch.models.generation import greedy_generate_with_logits
from edgetorch.models.llama import build_llama_tiny, example_prompt, export_llama
from edgetorch.runtime import Runtime

PROMPT_LEN = 6
NEW_TOKENS = 6  # prefill + 5 decode calls
FAULT_AT = 3  # execution index of the decode call that sees a perturbed cache
CACHE = "layers.0.attention.k_cache"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(eager model, program, prompt, saved ETRecord path). The record is saved before anything runs: an
    in-memory one may share its buffers with the eager model, whose caches the eager replays update."""
    model = build_llama_tiny()
    eps = export_llama(model)
    et = to_edge_transform_and_lower(eps, generate_etrecord=True).to_executorch()
    record = tmp_path_factory.mktemp("record") / "llama.etrecord"
    et.get_etrecord().save(record)
    return model, et, example_prompt(model.config, PROMPT_LEN), record


def _run(compiled, tmp, fault: bool = False):
    """Generates on the runtime with a debug buffer; with ``fault``, perturbs one cached key just before the
    decode call that is execution ``FAULT_AT``. Returns (inspector, generation result, etdump, debug buffer)."""
    _, et, prompt, record = compiled
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    prefill, decode = prog.load_method("prefill"), prog.load_method("decode")
    calls = []

    def step(tokens, pos):
        calls.append(pos)
        if fault and len(calls) == FAULT_AT:
            prog.buffers[CACHE][0, 0, 0, :] += 0.5  # position 0, written by the prefill
        return decode.execute(tokens, pos)

    result = greedy_generate_with_logits(prefill.execute, step, prompt, NEW_TOKENS)
    prog.write_etdump_result_to_file(tmp / "gen.etdp", tmp / "gen.bin")
    insp = Inspector(etdump_path=tmp / "gen.etdp", etrecord=record, debug_buffer_path=tmp / "gen.bin")
    return insp, result, read_etdump(tmp / "gen.etdp"), DebugBuffer(tmp / "gen.bin")


@pytest.fixture(scope="module")
def clean(compiled, tmp_path_factory):
    return _run(compiled, tmp_path_factory.mktemp("clean"))


def _eager_logits(model, records) -> list[torch.Tensor]:
    """The eager model replayed on the same calls: reset cache, prefill, then each decode."""
    model.reset_cache()
    out = []
    with torch.no_grad():
        for rec in records:
            fn = model.prefill if rec.execution.method == "prefill" else model.decode
            out.append(fn(*[x.clone() for x in rec.inputs]))
    return out


def test_every_execution_is_listed_in_order(clean):
    insp, _, _, _ = clean
    ex = insp.executions
    assert [(e.index, e.method, e.run) for e in ex] == \
        [(0, "prefill", 0)] + [(i, "decode", i - 1) for i in range(1, NEW_TOKENS)]


def test_inputs_logged_equal_the_tokens_passed(clean, compiled):
    _, result, etdump, buf = clean
    prompt = compiled[2]
    buf.check(etdump)
    records = execution_records(etdump, buf.value)
    assert len(records) == NEW_TOKENS
    want = [(prompt, torch.arange(PROMPT_LEN))]
    want += [(torch.tensor([[tok]]), torch.tensor([PROMPT_LEN + i])) for i, tok in enumerate(result.tokens[:-1])]
    for rec, (tokens, pos) in zip(records, want):
        assert len(rec.inputs) == 2
        assert torch.equal(rec.inputs[0], tokens) and torch.equal(rec.inputs[1], pos)
    runs = [r for r in etdump.run_data if r.name == ed.EXECUTE_BLOCK]
    inputs = [e.debug_event for e in runs[1].events if e.debug_event is not None and ed.is_input_event(e.debug_event)]
    assert [(d.name, d.output_index, d.instruction_id, d.chain_index) for d in inputs] == \
        [("input:tokens", 0, -1, -1), ("input:input_pos", 1, -1, -1)]
    assert runs[1].events[0].debug_event is inputs[0]  # logged first


def test_input_events_stay_out_of_the_profile(clean):
    insp, _, _, _ = clean
    names = set(insp.to_dataframe()["event_name"])
    assert not any(str(n).startswith(ed.INPUT_EVENT_PREFIX) for n in names)


def test_each_execution_final_row_matches_an_eager_replay(clean, compiled):
    insp, result, etdump, buf = clean
    model = compiled[0]
    records = execution_records(etdump, buf.value)
    eager = _eager_logits(model, records)
    for rec, want in zip(records, eager):
        df = insp.calculate_numeric_gap("MSE", execution=rec.execution.index)
        assert df.attrs["execution"] == rec.execution.index and df.attrs["method"] == rec.execution.method
        last = df.iloc[-1]
        logged = rec.outputs[0]
        ref = last["aot_intermediate_output"].reshape(want.shape)
        torch.testing.assert_close(ref, want, rtol=1e-5, atol=1e-5)  # the replay saw the eager cache state
        assert torch.equal(last["runtime_intermediate_output"].reshape(logged.shape), logged)
        torch.testing.assert_close(logged, want, rtol=1e-4, atol=1e-4)
        gaps = [g[0] for g in df["gap"]]
        assert len(gaps) > 50 and max(gaps) < 1e-10  # portable runs ATen's kernels
        assert df.attrs["output_gap"] < 1e-10
    # the logits of each step are those the generation chose its tokens from
    for i, row in enumerate(result.step_logits):
        torch.testing.assert_close(records[i].outputs[0][0, -1], row, rtol=0, atol=0)


def test_replay_without_state_would_not_match(clean, compiled):
    """The decode tables depend on the cache the earlier executions left: a decode replayed on an empty cache
    gives other logits than the ones the table pairs with the runtime."""
    insp, _, etdump, buf = clean
    model = compiled[0]
    rec = execution_records(etdump, buf.value)[2]
    model.reset_cache()
    with torch.no_grad():
        cold = model.decode(*rec.inputs)
    ref = insp.calculate_numeric_gap("MSE", execution=2).iloc[-1]["aot_intermediate_output"]
    assert (ref.reshape(cold.shape) - cold).abs().max() > 1e-3


def test_generation_gaps_one_row_per_execution(clean):
    insp, _, _, _ = clean
    g = insp.generation_gaps("MSE")
    assert list(g["execution"]) == list(range(NEW_TOKENS))
    assert list(g["method"]) == ["prefill"] + ["decode"] * (NEW_TOKENS - 1)
    assert (g["output_gap"] < 1e-10).all() and (g["worst_local_gap"] < 1e-10).all()
    assert insp.first_divergence_across_executions(1e-10) is None


def test_planted_fault_is_found_at_its_step_and_op(compiled, tmp_path):
    insp, _, _, _ = _run(compiled, tmp_path, fault=True)
    div = insp.first_divergence_across_executions(1e-10, distance="MSE")
    assert div is not None
    assert (div.execution, div.method, div.run) == (FAULT_AT, "decode", FAULT_AT - 1)
    assert any("index_copy" in op or "index_put" in op for op in div.op), div.op
    assert div.row["module"] == "layers.0.attention"
    diff = (div.row["runtime_intermediate_output"] - div.row["aot_intermediate_output"]).abs()
    assert diff[0, 0, 0].min() == pytest.approx(0.5, abs=1e-6)  # exactly the perturbed key...
    diff[0, 0, 0] = 0
    assert diff.max() == 0  # ...and nothing else
    g = insp.generation_gaps("MSE")
    assert (g["output_gap"][:FAULT_AT] < 1e-10).all()
    assert (g["output_gap"][FAULT_AT:] > 1e-8).all()


def test_execution_out_of_range(clean):
    insp, _, _, _ = clean
    with pytest.raises(Exception, match="execution 99"):
        insp.calculate_numeric_gap("MSE", execution=99)


def test_html_report_shows_the_gap_per_execution(compiled, tmp_path):
    from html.parser import HTMLParser

    from edgetorch.devtools.report import write_report

    insp, _, _, _ = _run(compiled, tmp_path, fault=True)
    gen = insp.generation_gaps("MSE")
    path = write_report(tmp_path / "r.html", insp.calculate_numeric_gap("MSE", execution=FAULT_AT),
                        generation_df=gen, threshold=1e-10)

    class Bars(HTMLParser):
        def __init__(self):
            super().__init__()
            self.svg, self.rects, self.titles, self.rows, self._in = 0, [], [], 0, None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "svg" and a.get("class") == "generation":
                self.svg += 1
                self._in = "svg"
            elif tag == "rect" and self._in == "svg":
                self.rects.append(float(a["height"]))
            elif tag == "title" and self._in == "svg":
                self._in = "title"
            elif tag == "table" and "generation" in (a.get("class") or ""):
                self._in = "table"
            elif tag == "tr" and self._in == "table":
                self.rows += 1

        def handle_endtag(self, tag):
            if tag == "title" and self._in == "title":
                self._in = "svg"
            elif tag in ("svg", "table") and self._in in ("svg", "table"):
                self._in = None

        def handle_data(self, data):
            if self._in == "title":
                self.titles.append(data)

    p = Bars()
    p.feed(open(path).read())
    assert p.svg == 1 and len(p.rects) == NEW_TOKENS and p.rows == NEW_TOKENS + 1  # header row
    assert p.titles[FAULT_AT].startswith(f"execution {FAULT_AT} (decode #{FAULT_AT - 1})")
    # log scale: the faulty steps' bars stand far above the exact ones (drawn as stubs)
    assert all(h <= 2.0 for h in p.rects[:FAULT_AT]) and all(h > 20 for h in p.rects[FAULT_AT:])
    # one execution: no per-execution section
    one = write_report(tmp_path / "one.html", None, generation_df=gen.iloc[:1])
    assert "class=\"generation\"" not in open(one).read()


def test_the_replay_uses_the_compact_edge_reference_graphs(compiled, tmp_path):
    """No program is deserialized for the replay: the ETRecord's compact edge reference graphs are used."""
    insp, _, _, _ = _run(compiled, tmp_path)
    gaps = insp.generation_gaps()
    assert len(gaps) == NEW_TOKENS and (gaps["output_gap"] < 1e-10).all()
    assert not insp.etrecord._is_loaded("edge")  # the edge programs were never loaded
