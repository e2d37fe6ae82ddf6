"""``edgetorch fix``: the badly quantized layer found, kept in float and proven (one line per step), and clear
errors for bad arguments."""

from __future__ import annotations

import re

from tests.cli.conftest import cli


def test_fix_keeps_the_outlier_layer_in_float_and_proves_it():
    r = cli("fix", "--model", "mlp", "--outlier", "fc2.weight", "--tolerance", "0.05", "--samples", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    lines = [ln for ln in out.splitlines() if re.match(r"\[\s*\d+\.\d+s\]", ln)]
    assert any("baseline: final error" in ln for ln in lines)
    assert any(ln.split("] ", 1)[1].startswith("re-export 1:") for ln in lines)
    m = re.search(r"keep \d+ op\(s\) in float: (.*) -> final error ([0-9.e+-]+) \(proven\)", out)
    assert m, out
    assert "linear_1" in m.group(1) and float(m.group(2)) <= 0.05
    base = float(re.search(r"baseline: final error ([0-9.e+-]+)", out).group(1))
    assert base > 0.05


def test_fix_needs_nothing_when_already_within_tolerance():
    r = cli("fix", "--model", "mlp", "--tolerance", "10", "--samples", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already within tolerance, nothing to fix" in r.stdout


def test_fix_argument_errors():
    r = cli("fix", "--model", "nope", "--tolerance", "0.1")
    assert r.returncode == 2 and "--model 'nope' is not a zoo model" in r.stderr
    r = cli("fix", "--model", "mlp", "--recipe", "bogus", "--tolerance", "0.1")
    assert r.returncode == 2 and "--recipe 'bogus' is not a recipe" in r.stderr
    r = cli("fix", "--model", "mlp", "--tolerance", "-1")
    assert r.returncode == 2 and "--tolerance must be positive" in r.stderr
    r = cli("fix", "--model", "mlp", "--outlier", "nope.weight", "--tolerance", "0.1")
    assert r.returncode == 2 and "--outlier 'nope.weight' is not a parameter" in r.stderr
