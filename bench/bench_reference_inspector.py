"""edgetorch's Inspector against the reference's on the same reference (ExecuTorch) artifacts (issue 26).

Usage: python bench/bench_reference_inspector.py --dir /tmp/vitb16 [--prefix v] [--runs 3] [--threads 1,0]
       [--reference-python /tmp/refvenv/bin/python] [--no-local] [--edgetorch-src OTHER/src]

``DIR`` holds ``PREFIX.etdp``, ``PREFIX_etrecord.bin`` and ``PREFIX_debug.bin`` made by executorch (the XNNPACK
ViT-B/16 of ``/tmp/refvenv/bin/python tests/data/reference/make_reference_artifacts.py /tmp/vitb16 vitb16``, with a
1 GiB debug buffer; or any program made the same way: ``to_edge_transform_and_lower(...,
generate_etrecord=True)``, ``update_representative_inputs``, a run with ``enable_etdump=True`` and a debug buffer).
Every measurement runs in a fresh child process (edgetorch with this interpreter, the reference with
``--reference-python``, an environment with executorch 1.5.1), alternating edgetorch / reference, and times
Inspector construction + ``calculate_numeric_gap("MSE")`` after the imports (the lazily imported torch serde
module counted as an import on both sides; wall and CPU seconds: torch's two-thread kernels wait for each other
on a busy machine); the child reports its peak RSS (ru_maxrss). Medians are printed, for one torch thread and
for torch's default (``--threads``); a warm-up child per side first (byte code is cached under ``--pycache``
as an installed package has it, whatever ``PYTHONDONTWRITEBYTECODE`` says).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, resource, sys, time
which, d, p, local, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
import torch
if threads:
    torch.set_num_threads(threads)
if which == "edgetorch":
    from edgetorch.devtools import Inspector
else:
    from executorch.devtools import Inspector
import torch._export.serde.serialize  # noqa: F401  (imported lazily by both readers: counted as an import)
t, c = time.perf_counter(), time.process_time()
ins = Inspector(etdump_path=f"{d}/{p}.etdp", etrecord=f"{d}/{p}_etrecord.bin",
                debug_buffer_path=f"{d}/{p}_debug.bin")
kw = {} if which != "edgetorch" or local else {"local": False}
df = ins.calculate_numeric_gap("MSE", **kw)
dt, dc = time.perf_counter() - t, time.process_time() - c
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"s": dt, "cpu_s": dc, "rows": len(df), "rss_mb": rss, "threads": torch.get_num_threads()}))
"""


def _child(python: str, which: str, args: argparse.Namespace, src: str | None, threads: int) -> dict[str, float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    # byte code cached as an installed package has it (an environment with PYTHONDONTWRITEBYTECODE would
    # otherwise charge the compilation of every lazily imported module to the side that imports it)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = args.pycache
    out = subprocess.run([python, "-c", _CHILD, which, args.dir, args.prefix, "0" if args.no_local else "1",
                          str(threads)],
                         capture_output=True, text=True, env=env, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{which} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/vitb16")
    ap.add_argument("--prefix", default="v")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reference-python", default="/tmp/refvenv/bin/python")
    ap.add_argument("--no-local", action="store_true", help="edgetorch without local gaps")
    ap.add_argument("--edgetorch-src", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), "src"), help="the edgetorch sources to time")
    ap.add_argument("--baseline-src", help="another edgetorch src/ (e.g. `git archive` of an earlier commit) timed "
                    "in the same alternation, as 'baseline'")
    ap.add_argument("--threads", default="1,0", help="torch threads per measurement, comma-separated (0: torch's "
                    "default); each count is timed as its own alternation")
    ap.add_argument("--pycache", default=os.path.join(tempfile.gettempdir(), "bench_reference_inspector_pycache"))
    args = ap.parse_args()
    sides: dict[str, tuple[str, str, str | None]] = {"edgetorch": (sys.executable, "edgetorch", args.edgetorch_src)}
    if args.baseline_src:
        sides["baseline"] = (sys.executable, "edgetorch", args.baseline_src)
    if os.path.exists(args.reference_python):
        sides["reference"] = (args.reference_python, "reference", None)
    for threads in (int(t) for t in args.threads.split(",")):
        for python, kind, src in sides.values():  # warm-up (byte code, page cache), not counted
            _child(python, kind, args, src, threads)
        _alternate(args, sides, threads)


def _alternate(args: argparse.Namespace, sides: dict[str, tuple[str, str, str | None]], threads: int) -> None:
    res: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    label = f"{threads} thread" if threads else "default threads"
    for i in range(args.runs):  # alternating, one fresh process per measurement
        for which, (python, kind, src) in sides.items():
            r = _child(python, kind, args, src, threads)
            res[which].append(r)
            print(f"[{label}] run {i}: {which:9s} {r['s']:.2f} s (CPU {r['cpu_s']:.2f} s), {r['rows']} rows, "
                  f"peak RSS {r['rss_mb']:.0f} MB, {r['threads']} threads", flush=True)
    print(f"\n[{label}] {'':10s} {'median s':>9s} {'min s':>7s} {'CPU s':>6s} {'peak RSS MB':>12s} {'rows':>5s}")
    med = {}
    for which, rs in res.items():
        med[which] = statistics.median(r["s"] for r in rs)
        print(f"[{label}] {which:10s} {med[which]:9.2f} {min(r['s'] for r in rs):7.2f} "
              f"{statistics.median(r['cpu_s'] for r in rs):6.2f} "
              f"{statistics.median(r['rss_mb'] for r in rs):12.0f} {rs[0]['rows']:5d}")
    for k in med:
        if k != "reference" and "reference" in med:
            print(f"[{label}] ratio {k} / reference: {med[k] / med['reference']:.2f}x")
    print(flush=True)

if __name__ == "__main__":
    main()
