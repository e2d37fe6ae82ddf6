"""The structure-aware mutation campaign of issue 23 (harness: ``tests/fuzz/structured.py``, edits:
``tests/fuzz/structured_mutators.py``).

    .venv/bin/python bench/fuzz_structured.py --mutants 10000                     # every kind, seed 0
    .venv/bin/python bench/fuzz_structured.py --kinds llama,etdump --mutants 2000 --seed 3 --nice 10

Each kind (mlp, cnn, cnn_ort, llama ``.pte``; etrecord; etdump; debug_buffer) runs on its own, its mutants in
batches of ``--batch`` per worker process (one process at a time: a crash or hang is attributed to its mutant and
the next worker starts after it). Prints per kind the counts per class under InternalConsistency (for programs,
the sampled verdicts under Full and Minimal too), the silent-change classes with what they mean, the CPU seconds,
and every failure (generic exception, crash, hang, uninitialised read, write outside a slot, written constant,
unexplained change) with its index: ``structured.make_mutant(ctx, seed, index)`` rebuilds it. Exit status 1 when
any failure was found; ``--json`` writes every result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.fuzz import structured  # noqa: E402


def _print_kind(rep: structured.Report, cpu: float) -> None:
    counts = rep.counts()
    print(f"{rep.kind:13s} {len(rep.results):6d} mutants, {rep.seconds:6.0f} s wall, {cpu:6.0f} s CPU: "
          f"{dict(counts.most_common())}", flush=True)
    for level in ("full", "minimal"):
        c = rep.counts(level)
        if c:
            print(f"{'':13s} sampled under {level}: {dict(c.most_common())}", flush=True)
    for cls, n in counts.most_common():
        if cls.startswith("valid:"):
            print(f"{'':13s} {cls} ({n}): {structured.VALID[cls[6:]]}", flush=True)
    for f in rep.failures:
        print(f"    FAIL {json.dumps(f)[:600]}", flush=True)


def _write(path: str, results: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(structured.KINDS), help="comma-separated kinds")
    p.add_argument("--mutants", type=int, default=10_000, help="mutants per kind (default 10000)")
    p.add_argument("--start", type=int, default=0, help="first mutant index (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=2500, help="mutants per worker process (default 2500)")
    p.add_argument("--nice", type=int, default=0, help="run the workers under nice -n NICE")
    p.add_argument("--artifacts", default=None, help="folder for the originals (default: a temp dir)")
    p.add_argument("--json", default=None, help="write every result to this file")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in structured.KINDS]
    if unknown:
        p.error(f"unknown kind(s) {unknown}; kinds: {', '.join(structured.KINDS)}")
    folder = args.artifacts or tempfile.mkdtemp(prefix="edgetorch-sfuzz-artifacts-")
    os.makedirs(folder, exist_ok=True)
    structured.build_artifacts(folder)
    print(f"artifacts in {folder}; seed {args.seed}, mutants [{args.start}, {args.start + args.mutants}) per kind",
          flush=True)
    failures, everything = 0, {}
    for kind in kinds:
        rep = structured.Report(kind)
        cpu0 = os.times()
        for a in range(args.start, args.start + args.mutants, args.batch):
            b = min(a + args.batch, args.start + args.mutants)
            r = structured.run_batch(folder, kind, args.seed, a, b, nice=args.nice)
            rep.results += r.results
            rep.seconds += r.seconds
            if args.json:  # after every batch: a campaign stopped early keeps what it ran
                _write(args.json, {**everything, kind: rep.results})
        cpu1 = os.times()
        _print_kind(rep, (cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system))
        failures += len(rep.failures)
        everything[kind] = rep.results
        if args.json:
            _write(args.json, everything)
    print(f"{failures} failure(s); {time.strftime('%H:%M:%S')}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
