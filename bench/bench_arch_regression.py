"""Issue 27's "no behaviour change" timing: a plain ``Method.execute`` and Inspector + ``calculate_numeric_gap``
on ViT-B/16 (zoo ``vit_b_16``) with this tree's ``src`` against another commit's, each in its own processes.

Each version first builds its own artifacts (``.pte``, ETRecord with the representative input, one traced run's
ETDump and debug buffer) in a child process; then timing processes alternate between the versions (old, new,
new, old, ...), one thread pinned to one core: each loads the program, runs one warm-up and ``--runs`` timed
``execute`` calls (its median), then times ``Inspector(...)`` + ``calculate_numeric_gap("MSE")`` twice: the
first call pays the lazy imports, ``inspector_gap_warm_s`` is the second. Byte code is cached per version, as
an installed package has it. The figures are medians over ``--procs`` processes per version, and the ratios
new / old. ``uptime`` is printed before and after: a loaded machine widens the spread.

Usage::

    git worktree add /tmp/wt_e84 e84c704
    python bench/bench_arch_regression.py --old /tmp/wt_e84/src [--new src] [--model vit_b_16] [--procs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r'''
import json, os, statistics, sys, time, warnings
import torch
mode, out, model_name, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(1)
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
from edgetorch.runtime import Runtime
pte, rec, etdp, dbg, inp = (os.path.join(out, n) for n in
                            ("model.pte", "etrecord.bin", "run.etdp", "run.bin", "inputs.pt"))
if mode == "build":
    from edgetorch.exir import to_edge
    from edgetorch.models import get_model
    model, inputs = get_model(model_name)
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.save(pte)
    record = et.get_etrecord()
    record.update_representative_inputs(inputs)
    record.save(rec)
    torch.save(inputs, inp)
    prog = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(*inputs)
    prog.write_etdump_result_to_file(etdp, dbg)
    print(json.dumps({}))
else:
    from edgetorch.devtools import Inspector
    inputs = torch.load(inp)
    method = Runtime.get().load_program(pte).load_method("forward")
    method.execute(*inputs)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        method.execute(*inputs)
        times.append(time.perf_counter() - t0)
    gap_s = []
    for _ in range(2):  # the first call pays the lazy imports, the second is the steady state
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = Inspector(etdump_path=etdp, etrecord=rec, debug_buffer_path=dbg).calculate_numeric_gap("MSE")
        gap_s.append(time.perf_counter() - t0)
    print(json.dumps({"execute_s": statistics.median(times), "inspector_gap_s": gap_s[0],
                      "inspector_gap_warm_s": gap_s[1], "rows": len(df)}))
'''


def _child(src: str, mode: str, out: str, model: str, runs: int) -> dict:
    # byte code cached per version, as an installed package has it (the build child fills the cache), whatever
    # PYTHONDONTWRITEBYTECODE says: compiling the sources is not what is measured
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src), OMP_NUM_THREADS="1",
               PYTHONPYCACHEPREFIX=os.path.join(out, "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = subprocess.run([sys.executable, "-c", _CHILD, mode, out, model, str(runs)], capture_output=True,
                       text=True, env=env, timeout=1800)
    if r.returncode:
        raise SystemExit(f"{mode} with {src} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


_KEYS = ("execute_s", "inspector_gap_s", "inspector_gap_warm_s")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="src folder of the baseline (a git worktree's src)")
    ap.add_argument("--new", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--procs", type=int, default=5, help="timing processes per version")
    ap.add_argument("--runs", type=int, default=3, help="timed execute calls per process")
    args = ap.parse_args()
    versions = {"old": args.old, "new": args.new}
    print("uptime before:", _uptime())
    with tempfile.TemporaryDirectory() as tmp:
        outs = {}
        for name, src in versions.items():
            outs[name] = os.path.join(tmp, name)
            os.makedirs(outs[name])
            _child(src, "build", outs[name], args.model, 0)
        samples: dict[str, list[dict]] = {k: [] for k in versions}
        for i in range(args.procs):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            for name in order:
                samples[name].append(_child(versions[name], "time", outs[name], args.model, args.runs))
    print("uptime after: ", _uptime())
    med = {name: {k: statistics.median(s[k] for s in runs) for k in _KEYS}
           for name, runs in samples.items()}
    print(f"{args.model}, 1 thread, medians of {args.procs} processes per version ({args.runs} execute calls each)")
    for k in _KEYS:
        spread = {n: (min(s[k] for s in samples[n]), max(s[k] for s in samples[n])) for n in samples}
        print(f"  {k:16s} old {med['old'][k]:.4f} s [{spread['old'][0]:.4f}, {spread['old'][1]:.4f}]  "
              f"new {med['new'][k]:.4f} s [{spread['new'][0]:.4f}, {spread['new'][1]:.4f}]  "
              f"new/old {med['new'][k] / med['old'][k]:.3f}")
    print("  gap rows: old", samples["old"][0]["rows"], "new", samples["new"][0]["rows"])


if __name__ == "__main__":
    main()
