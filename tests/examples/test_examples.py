"""The examples and the demo command run end to end (small models in CI; ViT-B/16 in the slow test)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args: list[str], cwd: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_numerical_debugging_example_portable(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import numerical_debugging
    finally:
        sys.path.pop(0)
    df = numerical_debugging.main(["--model", "vit_tiny", "--backend", "portable", "--out", str(tmp_path)])
    assert len(df) > 10 and all(g[0] <= 1e-10 for g in df["gap"])
    for f in ("model.pte", "etrecord.bin", "etdump.etdp", "debug_buffer.bin"):
        assert (tmp_path / f).exists()


@pytest.mark.slow
def test_numerical_debugging_example_vit_b_16(tmp_path):
    r = _run([os.path.join(ROOT, "examples", "numerical_debugging.py"), "--backend", "portable",
              "--out", str(tmp_path)], str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Final output MSE" in r.stdout and "Top 5 operators" in r.stdout


def test_demo_command(tmp_path):
    r = _run(["-m", "edgetorch", "demo", "--model", "mlp", "--backend", "portable", "--out", str(tmp_path)],
             str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "final output MSE" in r.stdout and "numeric gap" in r.stdout
    html = (tmp_path / "report.html").read_text()
    assert "<svg" in html and "fc1" in html
