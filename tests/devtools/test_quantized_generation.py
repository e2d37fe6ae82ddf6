"""A low-bit (8da4w) llama_tiny generation recorded with an ETDump, debugged against the float model per token and
per quantized layer (``Inspector.quantized_generation_table``): the SQNRs equal an independent computation
(torchao's own quantized eager model against the float eager model, layer inputs and outputs captured with forward
hooks, fed the same tokens), and a layer planted with outlier weights (one per int4 group: every group scale is
ruined) is named first."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector.quantized_generation import pivot, sqnr_db
from edgetorch.export import ExportRecipe, PortableRecipeType, export
from edgetorch.models.generation import greedy_generate_with_logits
from edgetorch.models.llama import build_llama_tiny, example_prompt, llama_dynamic_shapes, llama_method_inputs
from edgetorch.runtime import Runtime

pytest.importorskip("torchao")

PLANTED = "layers.0.attention.wv"
PROMPT, TOKENS = 5, 4
#: the runtime's kernels vs torchao's eager arithmetic (2e-2 relative per op, tests/runtime/test_lowbit.py) move
#: a ~20 dB SQNR by well under this
DB_TOL = 1.0


def _plant_outliers(model: torch.nn.Module, path: str) -> None:
    w = model.get_submodule(path).weight
    with torch.no_grad():
        # one outlier per group of 32, 4x the largest weight: the group's int4 step grows 4x and half the other
        # weights round to zero (a far larger outlier would dominate the layer's output and hide its own noise)
        w[:, ::32] = 4 * w.abs().max()


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """The planted model, recipe, prompt, runtime tokens and the directory of the .pte, ETRecord and ETDump."""
    torch.manual_seed(0)
    model = build_llama_tiny().eval()
    _plant_outliers(model, PLANTED)
    recipe = ExportRecipe.get_recipe(PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR)
    inputs = llama_method_inputs(model.config)
    session = export({"prefill": model, "decode": model}, {k: [v] for k, v in inputs.items()}, recipe,
                     dynamic_shapes=llama_dynamic_shapes(model.config), generate_etrecord=True)
    d = tmp_path_factory.mktemp("q4gen")
    session.get_executorch_program_manager().save(str(d / "model.pte"))
    prompt = example_prompt(model.config, PROMPT)
    with torch.no_grad():  # the eager model runs before the ETRecord is saved: its cache holds this prompt
        model.prefill(prompt, torch.arange(PROMPT))
    session.get_etrecord().save(str(d / "etrecord.bin"))
    prog = Runtime.get().load_program(str(d / "model.pte"), enable_etdump=True, debug_buffer_size="auto")
    got = greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                      prompt, TOKENS)
    prog.write_etdump_result_to_file(str(d / "etdump.etdp"), str(d / "debug_buffer.bin"))
    return model, recipe, prompt, got.tokens, d


def _inspector(d):
    return Inspector(etdump_path=d / "etdump.etdp", etrecord=d / "etrecord.bin",
                     debug_buffer_path=d / "debug_buffer.bin")


@pytest.fixture(scope="module")
def recorded(recording):
    model, recipe, prompt, tokens, d = recording
    return model, recipe, prompt, tokens, _inspector(d).quantized_generation_table(copy.deepcopy(model), impact=True)


class _Capture:
    def __init__(self, model: torch.nn.Module) -> None:
        self.values: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear):
                m.register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        def hook(_m, args, out):
            self.values[name] = (args[0].detach(), out.detach())
        return hook


def _inject_noise(fl, method, args, path, err, clean):
    """The float model with ``err`` added to layer ``path``'s output: its logit noise power against ``clean``."""
    h = fl.get_submodule(path).register_forward_hook(lambda _m, _i, y: y + err.reshape(y.shape))
    try:
        return float((getattr(fl, method)(*args) - clean).double().pow(2).sum())
    finally:
        h.remove()


def _independent(model, recipe, prompt, tokens):
    """Per execution: {layer: (accumulated, local) SQNR, logit share, own SQNR} and (torchao's greedy token, the
    float model's), from torchao's quantized eager model and the float eager model run on the same tokens as the
    runtime (the share: torchao's local error of the layer injected alone into the float model; own: torchao's
    quantized layer fed the float model's own input of the layer)."""
    from torchao.quantization import quantize_

    fl = copy.deepcopy(model)
    q = copy.deepcopy(model)
    for c in recipe.quantization_recipe.ao_quantization_configs:
        quantize_(q, c.ao_base_config, c.filter_fn)
    cap_f, cap_q = _Capture(fl), _Capture(q)
    fl.reset_cache()
    q.reset_cache()
    calls = [("prefill", (prompt, torch.arange(PROMPT)))]
    calls += [("decode", (torch.tensor([[t]]), torch.tensor([PROMPT + i]))) for i, t in enumerate(tokens[:-1])]
    out = []
    with torch.no_grad():
        for method, args in calls:
            lq = getattr(q, method)(*args)
            clean = getattr(fl, method)(*args)
            errs = {}
            for name, (x, y) in cap_q.values.items():
                lin = model.get_submodule(name)
                errs[name] = y - torch.nn.functional.linear(x, lin.weight, lin.bias)
            noise = {name: _inject_noise(fl, method, args, name, e, clean) for name, e in errs.items()}
            lf = getattr(fl, method)(*args)  # clean again: the injected runs wrote this call's cache slots
            total = float((lq - lf).double().pow(2).sum())
            layers = {}
            for name, (x, y) in cap_q.values.items():
                local = sqnr_db(y - errs[name], y)
                xf, yf = cap_f.values[name]
                own = sqnr_db(yf, q.get_submodule(name)(xf))
                layers[name] = (sqnr_db(yf, y), local, noise[name] / total, own)
            out.append((layers, int(lq[0, -1].argmax()), int(lf[0, -1].argmax())))
    return out


def test_table_matches_torchao_eager_against_float_eager(recorded):
    model, recipe, prompt, tokens, df = recorded
    assert list(df["execution"].unique()) == list(range(TOKENS))
    assert df.groupby("execution").size().eq(15).all()  # every quantized linear, every token
    assert df[["sqnr_db", "local_sqnr_db", "own_sqnr_db"]].notna().all().all()
    want = _independent(model, recipe, prompt, tokens)
    worst, worst_share = 0.0, 0.0
    for row in df.itertuples():
        acc, local, share, own = want[row.execution][0][row.layer]
        worst = max(worst, abs(row.sqnr_db - acc), abs(row.local_sqnr_db - local), abs(row.own_sqnr_db - own))
        if share >= 0.05:  # a tiny share is a ratio of tiny noises: the kernels' own rounding moves it most
            worst_share = max(worst_share, abs(10 * math.log10(row.logit_share / share)))
    assert worst <= DB_TOL, worst
    assert worst_share <= DB_TOL / 2, worst_share
    assert (df["logit_share"] >= 0).all()
    toks = df.attrs["tokens"]
    assert list(toks["runtime_token"]) == tokens
    assert list(toks["float_token"]) == [f for _, _, f in want]
    diverged = next((i for i, (r, f) in enumerate(zip(tokens, toks["float_token"])) if r != f), None)
    assert df.attrs["first_divergence"] == diverged


def test_planted_outlier_layer_is_named_first(recorded):
    *_, df = recorded
    assert df.attrs["responsible_layer"] == PLANTED
    local = pivot(df)
    assert list(local.columns)[:3] == ["layers.0.attention.wq", "layers.0.attention.wk", PLANTED]
    ranking = df.attrs["ranking"]  # mean own SQNR: the layer's quantized op on the float model's own input
    assert ranking.index[0] == PLANTED and ranking.iloc[0] < ranking.iloc[1] - 3  # by a margin (dB)
    assert ranking[PLANTED] == pytest.approx(pivot(df, "own_sqnr_db")[PLANTED].mean())
    assert df.attrs["abnormal"] == [PLANTED]  # the only layer whose own error is out of line
    # one decode token is a 32-value sample: the planted layer is the worst of most tokens, not necessarily all
    assert (local.idxmin(axis=1) == PLANTED).sum() >= TOKENS - 1
    if df.attrs["first_divergence"] is not None:
        assert local.loc[df.attrs["first_divergence"]].idxmin() == PLANTED
    # its error alone costs the logits more than any other layer's
    assert df.groupby("layer")["logit_share"].mean().idxmax() == PLANTED


def test_report_heat_maps_token_by_layer(recorded, tmp_path):
    import re

    from edgetorch.devtools.report import write_report
    from edgetorch.devtools.report._heatmap import share_colour, sqnr_colour

    *_, df = recorded
    html = open(write_report(tmp_path / "r.html", None, quant_generation_df=df), encoding="utf-8").read()
    assert "id='qgen'" in html and f"layer most responsible: <b>{PLANTED}</b>" in html
    maps = re.findall(r"<table class='heatmap' data-value='(\w+)'>(.*?)</table>", html)
    assert [v for v, _ in maps] == ["local_sqnr_db", "sqnr_db", "logit_share"]
    for value, body in maps:
        heads = re.findall(r"<th class='rot'( style='outline[^']*')?><div>([^<]+)</div>", body)
        assert [h for _, h in heads] == list(dict.fromkeys(df["layer"]))
        assert [h for o, h in heads if o] == [PLANTED]  # the responsible layer's column is outlined
        cells = re.findall(r"background:(#[0-9a-f]{6})' title='([^,]+), call (\d+): ([-\d.inf]+)( dB|%)'", body)
        assert len(cells) == len(df)
        want = df.set_index(["execution", "layer"])[value]
        for colour, layer, k, text, unit in cells:
            v = float(want[(int(k), layer)])
            if value == "logit_share":
                assert unit == "%" and text == f"{100 * v:.1f}" and colour == share_colour(v)
            else:
                assert unit == " dB" and text == f"{v:.1f}" and colour == sqnr_colour(v)
    assert sqnr_colour(0.0) == "#ff5060" and sqnr_colour(40.0) == "#50ff60" and sqnr_colour(float("nan")) == "#dddddd"


def test_the_etrecord_float_program_gives_the_same_table(recording, recorded):
    """No float model passed: the float programs the torchao-recipe export recorded (prefill and decode, one copy
    of the weights, the KV cache as the runtime started from although the eager model ran before the ETRecord
    was saved) give exactly the table the float model gives."""
    from edgetorch.devtools.etrecord import parse_etrecord

    *_, d = recording
    *_, want = recorded
    got = _inspector(d).quantized_generation_table(impact=True)
    assert list(got.columns) == list(want.columns) and len(got) == len(want)
    for c in ("sqnr_db", "local_sqnr_db", "own_sqnr_db", "logit_share"):
        assert got[c].tolist() == pytest.approx(want[c].tolist(), abs=1e-5, nan_ok=False), c
    assert got.attrs["tokens"].equals(want.attrs["tokens"])
    for k in ("first_divergence", "responsible_layer"):
        assert got.attrs[k] == want.attrs[k]
    rec = parse_etrecord(str(d / "etrecord.bin"))
    assert {"float/prefill", "float/decode"} <= set(rec.graph_map_names())
    pre, dec = rec.graph_map["float/prefill"], rec.graph_map["float/decode"]
    w = "layers.0.attention.wq.weight"
    assert pre.state_dict[w].data_ptr() == dec.state_dict[w].data_ptr()  # stored once, read once
    model = recording[0]
    assert torch.equal(pre.state_dict[w], model.get_submodule("layers.0.attention.wq").weight)


def test_no_float_program_no_float_model_says_what_to_pass(recording, tmp_path):
    """An ETRecord without float programs (exported before they were recorded): the error names both remedies."""
    from edgetorch.devtools.etrecord import parse_etrecord
    from edgetorch.errors import InspectorError

    *_, d = recording
    rec = parse_etrecord(str(d / "etrecord.bin"))
    rec.graph_map = {k: v for k, v in rec.graph_map.items() if not k.startswith("float/")}
    rec.save(str(tmp_path / "etrecord.bin"))
    insp = Inspector(etdump_path=d / "etdump.etdp", etrecord=tmp_path / "etrecord.bin",
                     debug_buffer_path=d / "debug_buffer.bin")
    with pytest.raises(InspectorError, match=r"no float program .*float_model="):
        insp.quantized_generation_table()
