"""The examples and the demo command run end to end (small models in CI; ViT-B/16 in the slow test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import edgetorch.models.vit as vit_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args: list[str], cwd: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_numerical_debugging_example_portable(tmp_path, capsys):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import numerical_debugging
    finally:
        sys.path.pop(0)
    df = numerical_debugging.main(["--model", "vit_tiny", "--backend", "portable", "--out", str(tmp_path)])
    assert len(df) > 10 and all(g[0] <= 1e-10 for g in df["gap"])
    for f in ("model.pte", "etrecord.bin", "etdump.etdp", "debug_buffer.bin", "report.html"):
        assert (tmp_path / f).exists()
    out = capsys.readouterr().out
    # gaps in scientific notation, never pandas' "[0.0]"; the threshold step says why nothing passes it
    assert "[0.0]" not in out and "0.000000" not in out
    assert "Operators with MSE > 1e-04:\nnone (the largest accumulated MSE is " in out
    assert "Ops adding error beyond their rounding noise:\nnone" in out
    line = next(i for i, t in enumerate(Path(vit_module.__file__).read_text().splitlines(), 1)
                if "x = torch.cat([cls, x], dim=1)" in t)
    assert f"vit.py:{line} in forward: x = torch.cat([cls, x], dim=1)" in out  # the file name, not the path
    assert '<svg class="graph"' in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_numerical_debugging_example_vit_b_16(tmp_path):
    r = _run([os.path.join(ROOT, "examples", "numerical_debugging.py"), "--backend", "portable",
              "--out", str(tmp_path)], str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Final output MSE" in r.stdout and "Top 5 operators" in r.stdout
    # the report of a ViT-B/16 stays a reasonable file, its graph split into pages (about 0.4 MB, 3 pages)
    html = (tmp_path / "report.html").read_text()
    assert len(html.encode()) < 2_000_000 and html.count("class=\"gpage\"") >= 3


def test_demo_command(tmp_path):
    r = _run(["-m", "edgetorch", "demo", "--model", "mlp", "--backend", "portable", "--out", str(tmp_path)],
             str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "final output MSE" in r.stdout and "numeric gap" in r.stdout
    assert "[1/7] building the model mlp" in r.stdout and "[7/7] writing the HTML report" in r.stdout
    assert "no op adds error of its own beyond its rounding noise" in r.stdout  # the portable kernels are exact
    assert "adds most error" not in r.stdout
    html = (tmp_path / "report.html").read_text()
    assert "<svg" in html and "fc1" in html and '<svg class="graph"' in html
