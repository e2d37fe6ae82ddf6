"""``edgetorch generate``: a zoo LLM exported as prefill + decode generates the eager tokens on the runtime,
records one ETDump run per step, and refuses bad arguments with exit status 2."""

from __future__ import annotations

import re

import pytest

from edgetorch.devtools import Inspector
from edgetorch.devtools.etdump import read_etdump
from tests.cli.conftest import cli


@pytest.mark.parametrize("backend", ["portable", "onnxruntime"])
def test_generated_tokens_match_eager_and_every_step_is_recorded(tmp_path, backend):
    r = cli("generate", "--tokens", "5", "--prompt-len", "6", "--backend", backend, "--out", str(tmp_path),
            "--etdump")
    assert r.returncode == 0, r.stderr[-3000:]
    runtime = re.search(r"runtime tokens: (\[.*\])", r.stdout).group(1)
    eager = re.search(r"eager tokens: +(\[.*\])", r.stdout).group(1)
    assert runtime == eager and len(eval(runtime)) == 5 and "tokens match eager" in r.stdout
    runs = [b for b in read_etdump(tmp_path / "etdump.etdp").run_data if b.name == "Execute"]
    assert [b.method for b in runs] == ["prefill"] + ["decode"] * 4  # the last token needs no decode call
    assert (tmp_path / "model.pte").stat().st_size > 0 and (tmp_path / "etrecord.bin").stat().st_size > 0
    # the record kept the empty caches although the eager model generated before it was saved: a clean run
    insp = Inspector(etdump_path=tmp_path / "etdump.etdp", etrecord=tmp_path / "etrecord.bin",
                     debug_buffer_path=tmp_path / "debug_buffer.bin")
    for k in range(len(insp.executions)):
        culprits = insp.find_culprits(insp.calculate_numeric_gap("MSE", execution=k))
        assert culprits.empty, (k, [list(o) for o in culprits["aot_ops"]])
    assert insp.first_divergence_across_executions(1e-6) is None


def test_bad_arguments_exit_2_without_a_traceback(tmp_path):
    for args, msg in ((["--model", "mlp"], "not a zoo decoder"), (["--tokens", "0"], "at least 1"),
                      (["--prompt-len", "60", "--tokens", "10"], "at most 64")):
        r = cli("generate", "--out", str(tmp_path / "o"), *args)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_torchao_recipe_generates_the_quantized_eager_tokens(tmp_path):
    r = cli("generate", "--tokens", "4", "--prompt-len", "6", "--recipe", "portable_torchao_8da4w", "--out",
            str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recipe portable_torchao_8da4w" in r.stdout and "tokens match eager" in r.stdout
    assert "float tokens:" in r.stdout and "logits SQNR against float per step" in r.stdout
    # the program holds int4 weights: far smaller than the float one of the same model
    assert (tmp_path / "model.pte").stat().st_size < 400_000  # the fp32 program is 592 KiB
    r = cli("generate", "--out", str(tmp_path / "o"), "--recipe", "portable_int3")
    assert r.returncode == 2 and "is not a recipe" in r.stderr and "portable_torchao_8da4w" in r.stderr
