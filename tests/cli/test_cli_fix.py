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


def test_fix_on_your_own_model_answers_in_module_paths(tmp_path):
    (tmp_path / "my_model.py").write_text(
        "import torch\n\n\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.encoder = torch.nn.Linear(16, 32)\n"
        "        self.head = torch.nn.Linear(32, 4)\n\n"
        "    def forward(self, x):\n"
        "        return self.head(torch.relu(self.encoder(x)))\n\n\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return Net(), (torch.randn(2, 16),)\n")
    r = cli("fix", "--model", "my_model:build", "--outlier", "head.weight", "--tolerance", "0.05", "--samples", "3",
            cwd=str(tmp_path))
    assert r.returncode in (0, 1), r.stderr[-3000:]
    if "already within tolerance" in r.stdout:
        return
    m = re.search(r"in the model's modules: keep (.*) in float", r.stdout)
    assert r.returncode == 0 and m, r.stdout
    assert "head (" in m.group(1)  # the module path, the graph node in brackets
    bad = cli("fix", "--model", "my_model:nope", "--tolerance", "0.05", cwd=str(tmp_path))
    assert bad.returncode == 2 and "cannot load the entry point" in bad.stderr
