"""``edgetorch fix --recipe <torchao recipe>``: the generation fix's sub-mode (one line per step, the table, the
verdict in module paths) and its argument errors; the INT8 path keeps requiring ``--tolerance``."""

from __future__ import annotations

import re

import pytest

from tests.cli.conftest import cli

pytest.importorskip("torchao")


def test_generation_fix_argument_errors():
    r = cli("fix", "--model", "mlp", "--recipe", "portable_torchao_8da4w")
    assert r.returncode == 2 and "--model 'mlp': a torchao recipe fixes an LLM" in r.stderr
    r = cli("fix", "--model", "llama_tiny", "--recipe", "portable_torchao_8da4w", "--outlier", "nope")
    assert r.returncode == 2 and "--outlier 'nope' is not a Linear" in r.stderr
    r = cli("fix", "--model", "mlp")
    assert r.returncode == 2 and "--tolerance is required" in r.stderr


@pytest.mark.slow
def test_generation_fix_runs_and_answers_in_module_paths():
    r = cli("fix", "--model", "llama_tiny", "--recipe", "portable_torchao_8da4w", "--tokens", "3",
            "--max-reexports", "1", "--outlier", "layers.0.attention.wv")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    out = r.stdout
    assert re.search(r"\[\s*\d+\.\d+s\] baseline: \d+/3 tokens agree with the float model", out), out
    assert "portable_torchao_8da4w: baseline agrees with the float model on" in out
    if "nothing to fix" not in out:
        assert re.search(r"\] re-export 1: int8 [\w.]+", out), out
        assert "agreement" in out and "size_bytes" in out and "decode_ms" in out
    if r.returncode == 0 and "(proven)" in out:
        assert re.search(r"in the model's modules: keep (layers\.\d\.\w+\.\w+|output) at int8", out), out
