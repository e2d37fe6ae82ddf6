"""The suite's memory guard (tests/_memory_guard.py) on a throwaway test folder run by pytest in a subprocess."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = Path(__file__).with_name("_memory_guard.py")

_TESTS = '''
import os
import pytest
import torch

_CACHE = []


def test_leaks():
    _CACHE.append(torch.ones(MIB * 2**20 // 4))  # alive after the module: the guard fails this module


@pytest.mark.large_model
def test_isolated_pass():
    assert os.environ.get("EDGETORCH_TEST_ISOLATED_CHILD") == "1"  # it ran in a child process


@pytest.mark.large_model
def test_isolated_fail():
    assert 1 + 1 == 3


@pytest.mark.large_model
def test_isolated_skip():
    pytest.skip("no reason to run")


@pytest.mark.large_model
def test_isolated_crash():
    os._exit(3)  # the child dies mid-test: no report of its call comes back


@pytest.mark.large_model(max_rss_gb=0.6)
def test_isolated_over_bound():
    x = torch.ones(2**30 // 4)
    x += 1
    import time
    time.sleep(2)
'''


def _run(folder: Path, body: str, *args: str, guard: str = "1") -> subprocess.CompletedProcess:
    (folder / "conftest.py").write_text('pytest_plugins = ["_memory_guard"]\n')
    shutil.copy(PLUGIN, folder / "_memory_guard.py")
    (folder / "test_guarded.py").write_text(body)
    env = dict(os.environ, PYTHONPATH=str(folder), EDGETORCH_TEST_MEMORY_LOG=str(folder / "log.tsv"),
               EDGETORCH_TEST_GUARD=guard, EDGETORCH_TEST_WARMUP="0")
    for name in ("EDGETORCH_TEST_NO_ISOLATION", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"):  # the caller's options
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_guard_isolates_large_tests_and_fails_a_leaking_module(tmp_path):
    proc = _run(tmp_path, _TESTS.replace("MIB", "400"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "PASSED test_guarded.py::test_isolated_pass" in out
    assert "FAILED test_guarded.py::test_isolated_fail" in out and "assert (1 + 1) == 3" in out
    assert re.search(r"SKIPPED \[1\] test_guarded.py:\d+: no reason to run", out)
    assert "FAILED test_guarded.py::test_isolated_over_bound" in out and "went above its memory bound" in out
    assert "FAILED test_guarded.py::test_isolated_crash" in out and "the isolated pytest exited with 3" in out
    # the leak: 400 MiB alive after the module, reported on its last test's teardown
    assert "ERROR test_guarded.py::test_isolated_over_bound" in out
    assert "left 4" in out and "MiB resident after its tests" in out
    log = (tmp_path / "log.tsv").read_text().splitlines()
    assert log[0].split("\t")[:4] == ["module", "start_mib", "end_mib", "growth_mib"]
    growth = float(log[1].split("\t")[3])
    assert 380 <= growth <= 460, log


def test_guard_passes_a_module_that_frees_what_it_allocates(tmp_path):
    body = textwrap.dedent('''
        import pytest
        import torch

        @pytest.fixture(scope="module")
        def big():
            return torch.ones(400 * 2**20 // 4)  # freed with the module's fixtures

        def test_uses(big):
            assert big.sum() == big.numel()
    ''')
    proc = _run(tmp_path, body)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    growth = float((tmp_path / "log.tsv").read_text().splitlines()[1].split("\t")[3])
    assert growth < 100


def test_a_run_of_one_module_is_not_guarded_by_default(tmp_path):
    body = "import torch\n_KEEP = []\n\ndef test_leaks():\n    _KEEP.append(torch.ones(400 * 2**20 // 4))\n"
    proc = _run(tmp_path, body, guard="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "log.tsv").read_text().splitlines()[1:] == []  # nothing measured
