"""The load-check cost of issue 23 measured inside one process (min of 20 timings each, so that the shared
machine's noise drops out): ``formats.plan_check.check_plan`` (InternalConsistency), ``check_operators`` and
``check_kernel`` (``load_method``) and building the first-run wrappers, on ``.pte`` files that
``bench/bench_load_checks.py`` built (``python bench/bench_load_checks_inproc.py /tmp/pte/vit_b_16.pte ...``)."""

from __future__ import annotations

import sys
import time

import edgetorch.runtime._load_checks as checks
import edgetorch.runtime.method as method_module
from edgetorch.formats import plan_check
from edgetorch.runtime import Runtime


def _tmin(f, n: int = 20) -> float:  # noqa: ANN001
    best = 1e9
    for _ in range(n):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    for path in sys.argv[1:]:
        recorded: list[tuple] = []
        real = method_module.check_kernel
        method_module.check_kernel = lambda *a: recorded.append(a)
        m = Runtime.get().load_program(path).load_method("forward")
        method_module.check_kernel = real
        plan = m.plan
        ck = _tmin(lambda: [real(*a) for a in recorded])
        co = _tmin(lambda: checks.check_operators(plan))
        pc = _tmin(lambda: plan_check.check_plan(plan))
        fr = _tmin(lambda: checks.first_run_calls("forward", plan, m._slots, m._fast))
        print(f"{path}: {len(plan.instructions)} instructions, {len(plan.values)} values: plan_check {pc:.2f} ms, "
              f"check_operators {co:.2f} ms, check_kernel {ck:.2f} ms, first-run wrappers {fr:.2f} ms; total "
              f"{pc + co + ck + fr:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
