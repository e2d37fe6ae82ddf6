"""Pytest plugin: keeps the suite's memory bounded.

Two mechanisms, both on by default (``tests/conftest.py`` loads this plugin):

* **Growth guard.** Each test module's resident memory is measured when its first test starts and again after its
  last test and its module fixtures are torn down (after ``gc.collect()`` and ``malloc_trim``, so freed memory is
  returned to the system first). A module that leaves more than ``EDGETORCH_TEST_GROWTH_MB`` (default 256) MiB
  alive fails the teardown of its last test, naming the growth (large-model tests run elsewhere, below, and
  leave nothing here). The per-module figures go to ``EDGETORCH_TEST_MEMORY_LOG`` (a TSV) when that variable is set.
* **Isolation.** A test marked ``large_model`` runs in a fresh ``python -m pytest`` process of its own (the parent
  never builds its fixtures), so whatever it allocates is returned when that process exits. The child is watched:
  above ``max_rss_gb`` (the marker's keyword, default 6) GiB resident it is killed and the test fails, naming the
  figure. The child's phases are reported in the parent as if they had run there (passed, failed, skipped).

The growth guard is on when a run covers two test modules or more (``EDGETORCH_TEST_GUARD=1`` forces it on, ``0``
off): before the first test it warms the process up once (the imports and a tiny export -> emission -> run, portable
and ONNX Runtime), so that what the first module to use torch.export or ONNX Runtime pays once for the whole process
is not counted as that module's growth (``EDGETORCH_TEST_WARMUP=0`` skips it). A run of one module is a developer's
run: it is not guarded, as a module alone would be charged with all of that. ``EDGETORCH_TEST_NO_ISOLATION=1`` runs
large-model tests in the main process (for debugging one of them).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from _pytest.reports import TestReport

_CHILD_ENV = "EDGETORCH_TEST_ISOLATED_CHILD"
_CHILD_REPORT_ENV = "EDGETORCH_TEST_ISOLATED_REPORT"
_GIB = 1 << 30
_MIB = 1 << 20


def _growth_limit_bytes() -> int:
    return int(float(os.environ.get("EDGETORCH_TEST_GROWTH_MB", "256")) * _MIB)


def _trim() -> None:
    """Frees what Python and glibc hold but no longer use, so that RSS shows what is alive."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS is then a looser bound
        pass


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _is_large(item: pytest.Item) -> bool:
    return item.get_closest_marker("large_model") is not None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "large_model(max_rss_gb=6): a test that needs more memory than the suite's bound; it runs in a process of "
        "its own, killed above max_rss_gb GiB resident",
    )
    config.stash[_STATE] = _GuardState()


class _GuardState:
    def __init__(self) -> None:
        self.module: str | None = None
        self.start_rss = 0
        self.start_time = 0.0
        self.large_in_module = False
        self.active = False
        self.trimmed_rss: int | None = None  # RSS the last module end check measured (the next module's start)
        # an isolated child neither guards nor logs (it would truncate the parent's log)
        self.log = None if os.environ.get(_CHILD_ENV) else os.environ.get("EDGETORCH_TEST_MEMORY_LOG")
        if self.log:
            Path(self.log).write_text("module\tstart_mib\tend_mib\tgrowth_mib\tseconds\n")


_STATE = pytest.StashKey[_GuardState]()


# --------------------------------------------------------------------------- growth guard (main process)


def pytest_collection_finish(session: pytest.Session) -> None:
    state = session.config.stash[_STATE]
    setting = os.environ.get("EDGETORCH_TEST_GUARD", "auto")
    modules = {item.nodeid.split("::")[0] for item in session.items}
    state.active = not os.environ.get(_CHILD_ENV) and (setting == "1" or (setting == "auto" and len(modules) > 1))
    if state.active and os.environ.get("EDGETORCH_TEST_WARMUP", "1") != "0":
        _warm_up()


def _warm_up() -> None:
    """What every process pays once, whichever module comes first: imports, torch.export's and the emitter's first
    use, ONNX Runtime's first session (about 200 MiB)."""
    import torch

    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.runtime import Runtime

    model, inputs = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(1, 4),)
    for partitioners in ([], [OrtPartitioner()]):
        program = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=partitioners)
        Runtime.get().load_program(program.to_executorch().buffer).load_method("forward").execute(*inputs)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    state = item.config.stash[_STATE]
    if not state.active:
        return
    module = item.nodeid.split("::")[0]
    if module != state.module:
        # the previous module's end check has just collected and trimmed: its figure is this module's start
        if state.trimmed_rss is None:
            _trim()
        start = state.trimmed_rss if state.trimmed_rss is not None else _rss()
        state.module, state.start_rss, state.start_time = module, start, time.perf_counter()
        state.large_in_module, state.trimmed_rss = False, None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    failure = _module_end_check(item, nextitem)
    if failure:
        pytest.fail(failure, pytrace=False)
    return result


def _module_end_check(item: pytest.Item, nextitem: pytest.Item | None) -> str | None:
    """After the last test of a module (its fixtures torn down): the growth it left, checked against the limit."""
    state = item.config.stash[_STATE]
    if not state.active:
        return None
    # a large-model test that ran here (isolation off) may leave its module above the limit
    state.large_in_module |= _is_large(item) and bool(os.environ.get("EDGETORCH_TEST_NO_ISOLATION"))
    if nextitem is not None and nextitem.nodeid.split("::")[0] == state.module:
        return None
    # pytest tore the module's fixtures down with its last test (the next item lies in another module): what is
    # resident now beyond the start is what the module left alive. This item still holds its fixture values; drop
    # them now as runtestprotocol does right after this hook.
    if hasattr(item, "_request"):
        item._request, item.funcargs = False, None
    _trim()
    state.trimmed_rss = _rss()
    growth = state.trimmed_rss - state.start_rss
    if state.log:
        with open(state.log, "a") as f:
            f.write(f"{state.module}\t{state.start_rss / _MIB:.0f}\t{(state.start_rss + growth) / _MIB:.0f}\t"
                    f"{growth / _MIB:+.0f}\t{time.perf_counter() - state.start_time:.1f}\n")
    if growth <= _growth_limit_bytes() or state.large_in_module:
        return None
    return (f"{state.module} left {growth / _MIB:.0f} MiB resident after its tests and fixtures were torn down "
            f"(limit {_growth_limit_bytes() / _MIB:.0f} MiB, EDGETORCH_TEST_GROWTH_MB): free what it caches, or "
            "mark the test @pytest.mark.large_model so that it runs in a process of its own")


# --------------------------------------------------------------------------- isolation of large-model tests


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if not _is_large(item) or os.environ.get(_CHILD_ENV) or os.environ.get("EDGETORCH_TEST_NO_ISOLATION"):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    pytest_runtest_setup(item)  # the growth guard's module bookkeeping
    for phase in _run_isolated(item):
        report = TestReport(
            nodeid=item.nodeid, location=item.location, keywords={k: 1 for k in item.keywords},
            outcome=phase["outcome"], longrepr=_longrepr(phase), when=phase["when"],
            duration=phase["duration"], sections=phase.get("sections", []), user_properties=[],
        )
        item.ihook.pytest_runtest_logreport(report=report)
    # the parent set none of its fixtures up; tear down what earlier tests of its module left for it
    item.session._setupstate.teardown_exact(nextitem)
    failure = _module_end_check(item, nextitem)
    if failure:
        item.ihook.pytest_runtest_logreport(report=TestReport(
            nodeid=item.nodeid, location=item.location, keywords={}, outcome="failed", longrepr=failure,
            when="teardown", duration=0.0))
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _longrepr(phase: dict) -> object:
    if phase["outcome"] == "skipped" and phase.get("skip"):
        path, line, reason = phase["skip"]
        return (path, line, reason)
    return phase.get("longrepr")


def _run_isolated(item: pytest.Item) -> list[dict]:
    marker = item.get_closest_marker("large_model")
    bound = float(marker.kwargs.get("max_rss_gb", 6)) * _GIB
    with tempfile.TemporaryDirectory(prefix="edgetorch-isolated-") as folder:
        report_path = os.path.join(folder, "phases.json")
        env = dict(os.environ, **{_CHILD_ENV: "1", _CHILD_REPORT_ENV: report_path})
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", item.nodeid]
        started = time.perf_counter()
        log_path = os.path.join(folder, "output.txt")
        with open(log_path, "wb") as log:  # a file, not a pipe: a chatty child never blocks on a full pipe
            proc = subprocess.Popen(cmd, cwd=item.config.rootpath, env=env, stdout=log, stderr=subprocess.STDOUT)
            peak, killed = _watch(proc, bound)
            proc.wait()
        output = Path(log_path).read_text(errors="replace")
        elapsed = time.perf_counter() - started
        phases = json.loads(Path(report_path).read_text()) if os.path.exists(report_path) else []
    note = f"[isolated process: peak {peak / _GIB:.2f} GiB resident, bound {bound / _GIB:.1f} GiB, {elapsed:.1f} s]"
    if killed:
        return [_failed(f"{note}\nkilled: the test went above its memory bound\n{output[-4000:]}")]
    if not phases or proc.returncode not in (0, 1):
        return [_failed(f"{note}\nthe isolated pytest exited with {proc.returncode} and reported "
                        f"{len(phases)} phases\n{output[-4000:]}")]
    for phase in phases:
        phase.setdefault("sections", []).append(("isolated process", note))
    return phases


def _failed(message: str) -> dict:
    return {"when": "call", "outcome": "failed", "longrepr": message, "duration": 0.0}


def _watch(proc: subprocess.Popen, bound: float) -> tuple[int, bool]:
    """Samples the child's resident memory (with its own children) until it exits; kills it above ``bound``."""
    peak = 0
    try:
        ps = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        return 0, False
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
        except psutil.Error:
            rss = 0
        peak = max(peak, rss)
        if rss > bound:
            proc.kill()
            return peak, True
        time.sleep(0.05)
    return peak, False


# --------------------------------------------------------------------------- the child's side


def pytest_runtest_logreport(report: TestReport) -> None:
    path = os.environ.get(_CHILD_REPORT_ENV)
    if not path or not os.environ.get(_CHILD_ENV):
        return
    phases = json.loads(Path(path).read_text()) if os.path.exists(path) else []
    phase: dict = {"when": report.when, "outcome": report.outcome, "duration": report.duration,
                   "sections": [list(s) for s in report.sections]}
    if report.skipped and isinstance(report.longrepr, tuple):
        phase["skip"] = [str(report.longrepr[0]), report.longrepr[1], report.longrepr[2]]
    elif report.longrepr is not None:
        phase["longrepr"] = str(report.longrepr)
    phases.append(phase)
    Path(path).write_text(json.dumps(phases))
