"""Long mutation-fuzzing runs over every artifact edgetorch reads (the harness is ``tests/fuzz/fuzzlib.py``).

    .venv/bin/python bench/fuzz_artifacts.py --mutants 10000                 # every kind, seed 0
    .venv/bin/python bench/fuzz_artifacts.py --kinds pte,etrecord --mutants 2000 --seed 3 --jobs 2

Prints, per artifact kind, the outcome counts (and for programs the verdicts under InternalConsistency), then
every failure (generic exception, crash, hang, silent output change under Verification.Full, shape
disagreement under InternalConsistency, silent gap change from an ETRecord or debug buffer, ``edgetorch run``
exit 3) with the mutant's index, so that ``fuzzlib.mutate(kind, original, seed, index)`` reproduces it.
Exit status 1 when any failure was found. ``--json`` writes every result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.fuzz import fuzzlib  # noqa: E402


def _run_kind(folder: str, kind: str, seed: int, n: int, jobs: int, batch: int) -> fuzzlib.Report:
    """Mutants [0, n) of ``kind`` in batches of ``batch``, ``jobs`` worker processes at a time."""
    ranges = [(a, min(a + batch, n)) for a in range(0, n, batch)]
    report = fuzzlib.Report(kind)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for r in pool.map(lambda ab: fuzzlib.run_batch(folder, kind, seed, *ab), ranges):
            report.results += r.results
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(fuzzlib.KINDS), help="comma-separated artifact kinds")
    p.add_argument("--mutants", type=int, default=10_000, help="mutants per kind (default 10000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="worker processes at a time (default 2)")
    p.add_argument("--batch", type=int, default=1000, help="mutants per worker process (default 1000)")
    p.add_argument("--artifacts", default=None, help="folder for the original artifacts (default: a temp dir)")
    p.add_argument("--json", default=None, help="write every result to this file")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in fuzzlib.KINDS]
    if unknown:
        p.error(f"unknown kind(s) {unknown}; kinds: {', '.join(fuzzlib.KINDS)}")
    folder = args.artifacts or tempfile.mkdtemp(prefix="edgetorch-fuzz-artifacts-")
    os.makedirs(folder, exist_ok=True)
    t0 = time.monotonic()
    fuzzlib.build_artifacts(folder)
    print(f"artifacts in {folder} ({time.monotonic() - t0:.0f} s); seed {args.seed}, {args.mutants} mutants per kind",
          flush=True)
    failures, everything = 0, {}
    for kind in kinds:
        t = time.monotonic()
        rep = _run_kind(folder, kind, args.seed, args.mutants, args.jobs, args.batch)
        ic = f"; under InternalConsistency {dict(rep.ic_counts)}" if rep.ic_counts else ""
        print(f"{kind:13s} {len(rep.results):6d} mutants in {time.monotonic() - t:6.0f} s: {dict(rep.counts)}{ic}",
              flush=True)
        for f in rep.failures:
            print(f"    FAIL {json.dumps(f)[:700]}", flush=True)
        failures += len(rep.failures)
        everything[kind] = rep.results
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
