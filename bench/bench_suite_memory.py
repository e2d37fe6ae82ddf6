"""The test suite's memory and time: runs pytest (the whole suite by default) and reports what issue 22 asks for.

    python bench/bench_suite_memory.py [pytest args ...]          # e.g. tests/export tests/runtime

Prints the wall time, the CPU time (user + system of every process the run started), the maximum resident set of
any single process (``getrusage(RUSAGE_CHILDREN).ru_maxrss``, the figure ``/usr/bin/time -v`` gives), the peak of
all processes together (the pytest process and its children, sampled every 0.2 s) and the per-module growth table
the suite's memory guard writes (``EDGETORCH_TEST_MEMORY_LOG``: resident memory each module leaves after its
fixtures are torn down), largest first.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run(pytest_args: list[str]) -> dict:
    """Runs ``python -m pytest -q pytest_args`` from the repository root; returns the figures."""
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "modules.tsv")
        env = dict(os.environ, EDGETORCH_TEST_MEMORY_LOG=log)
        started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", *pytest_args], cwd=ROOT, env=env)
        peak = [0]

        def sample() -> None:
            ps = psutil.Process(proc.pid)
            while proc.poll() is None:
                try:
                    peak[0] = max(peak[0], _tree_rss(ps))
                except psutil.Error:
                    return
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [line.split("\t") for line in Path(log).read_text().splitlines()[1:]] if os.path.exists(log) else []
    return {
        "exit": code,
        "wall_s": time.perf_counter() - started,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "max_rss_any_gib": after.ru_maxrss / 2**20,  # kB on Linux
        "peak_all_processes_gib": peak[0] / 2**30,
        "modules": sorted(((r[0], float(r[3])) for r in rows), key=lambda r: -r[1]),
    }


def main() -> None:
    figures = run(sys.argv[1:])
    print(f"exit {figures['exit']}; wall {figures['wall_s']:.0f} s; CPU (user+sys) {figures['cpu_s']:.0f} s")
    print(f"max RSS of any process {figures['max_rss_any_gib']:.2f} GiB; "
          f"peak of all processes together {figures['peak_all_processes_gib']:.2f} GiB")
    print("module growth after teardown (MiB), largest first:")
    for name, growth in figures["modules"][:15]:
        print(f"  {growth:+8.0f}  {name}")


if __name__ == "__main__":
    main()
