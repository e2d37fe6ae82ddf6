"""``edgetorch inspect --gap --reference-graph float [--float-model llama_tiny] --report`` on a ``generate --recipe
{portable,onnxruntime}_torchao_8da4w --etdump`` recording: per call the greedy tokens and logits SQNR against the
float model (equal to what ``generate`` measured against the float model on its own), the first call whose greedy
choice differs, the layer most responsible and the heat-map report; inside ONNX Runtime delegates too."""

from __future__ import annotations

import re

import pytest

from edgetorch.devtools import Inspector
from edgetorch.models.llama import build_llama_tiny
from tests.cli.conftest import cli

pytest.importorskip("torchao")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["portable_torchao_8da4w", "onnxruntime_torchao_8da4w"])
def test_inspect_low_bit_generation_against_the_float_model(tmp_path, recipe):
    g = cli("generate", "--recipe", recipe, "--etdump", "--tokens", "4", "--prompt-len", "4",
            "--out", str(tmp_path))
    assert g.returncode in (0, 1), g.stderr[-3000:]
    steps = [float(v) for v in re.search(r"logits SQNR against float per step \(same inputs\): (.*) dB",
                                         g.stdout).group(1).split(", ")]
    r = cli("inspect", "--etdump", str(tmp_path / "etdump.etdp"), "--etrecord", str(tmp_path / "etrecord.bin"),
            "--debug-buffer", str(tmp_path / "debug_buffer.bin"), "--gap", "--reference-graph", "float",
            "--float-model", "llama_tiny", "--impact", "--report", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = " ".join(r.stdout.split())
    calls = re.findall(r"call +(\d+) (prefill|decode) +token (\d+) \(float (\d+)\), logits SQNR ([\d.]+) dB", out)
    assert [int(c[0]) for c in calls] == [0, 1, 2, 3]
    # a decode call's logits are one row, as generate's step logits: same SQNR while the two read the same tokens
    for (k, _, _, _, db), want in zip(calls[1:], steps[1:]):
        assert float(db) == pytest.approx(want, abs=0.051), (k, db, want)
    differs = [int(c[0]) for c in calls if c[2] != c[3]]
    if differs:
        assert f"first token whose greedy choice differs from the float model's: call {differs[0]}" in out
    else:
        assert "greedy tokens agree with the float model" in out
    assert re.search(r"layer most responsible: (layers\.\d\.\S+|output)", out)
    assert re.search(r"layers whose own quantization error is abnormal: (none|layers\.\d\.\S+|output)", out)
    assert re.search(r"layers by mean own SQNR .*: (layers\.\d\.\S+|output) -?[\d.]+ dB", out)
    assert re.search(r"layers by mean share of the logit error .*: (layers\.\d\.\S+|output) [\d.]+%", out)
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    # without --float-model: the float program the recipe recorded in the ETRecord, the same figures
    plain = cli("inspect", "--etdump", str(tmp_path / "etdump.etdp"), "--etrecord", str(tmp_path / "etrecord.bin"),
                "--debug-buffer", str(tmp_path / "debug_buffer.bin"), "--gap", "--reference-graph", "float")
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "against the float model (the ETRecord's float program)" in plain.stdout
    plain_calls = re.findall(r"call +(\d+) (prefill|decode) +token (\d+) \(float (\d+)\), logits SQNR ([\d.]+) dB",
                             " ".join(plain.stdout.split()))
    assert plain_calls == calls
    assert "id='qgen'" in html and html.count("<table class='heatmap'") == 3  # local, accumulated, share
    # inside ONNX Runtime delegates too: every layer of every call has its runtime value (the delegate's log)
    insp = Inspector(etdump_path=tmp_path / "etdump.etdp", etrecord=tmp_path / "etrecord.bin",
                     debug_buffer_path=tmp_path / "debug_buffer.bin")
    df = insp.quantized_generation_table(build_llama_tiny())
    assert len(df) == 4 * 15 and df[["sqnr_db", "local_sqnr_db"]].notna().all().all()
