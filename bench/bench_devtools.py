"""Developer-tools figures (issue: ETDump, ETRecord, Inspector) on ViT-B/16 by default.

1. Full debug run (profiling + every intermediate streamed to a file) vs a plain run, alternating, medians.
2. Inspector construction + calculate_numeric_gap("MSE") vs one eager forward of the model.
3. Peak memory of the Inspector step (in a fresh subprocess) vs weights + 2x the intermediates of one run.

Usage: python bench/bench_devtools.py [--model vit_b_16] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import thread_settings  # noqa: E402

from edgetorch.exir import to_edge  # noqa: E402
from edgetorch.models import get_model  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402


def build(model_name: str, out: str) -> dict:
    model, inputs = get_model(model_name)
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    pte = os.path.join(out, "model.pte")
    et.save(pte)
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    rec.save(os.path.join(out, "etrecord.bin"))
    torch.save(inputs, os.path.join(out, "inputs.pt"))
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"model": model, "inputs": inputs, "pte": pte, "weights": weights,
            "debug_bytes": et.memory_plan_report()["forward"]["debug_buffer_bytes"]}


def debug_vs_plain(b: dict, out: str, runs: int) -> list[str]:
    lines = []
    inputs = b["inputs"]
    plain = Runtime.get().load_program(b["pte"]).load_method("forward")
    for threads in thread_settings():
        torch.set_num_threads(threads)
        t_plain, t_debug = [], []
        for r in range(runs + 1):
            sink = os.path.join(out, f"stream_{r}.bin")
            prog = Runtime.get().load_program(b["pte"], enable_etdump=True, debug_buffer_path=sink)
            dbg = prog.load_method("forward")
            t0 = time.perf_counter()
            plain.execute(*inputs)
            t1 = time.perf_counter()
            dbg.execute(*inputs)
            t2 = time.perf_counter()
            if r == runs:  # keep the last one for the Inspector step
                prog.write_etdump_result_to_file(os.path.join(out, "etdump.etdp"), os.path.join(out, "debug.bin"))
            else:
                del prog, dbg
                os.remove(sink)
            if r:  # first pair is warm-up
                t_plain.append(t1 - t0)
                t_debug.append(t2 - t1)
        p, d = statistics.median(t_plain), statistics.median(t_debug)
        lines.append(f"  threads={threads}: plain {1000 * p:.1f} ms, full debug run (profile + every intermediate "
                     f"streamed to file) {1000 * d:.1f} ms, ratio {d / p:.2f}")
    torch.set_num_threads(max(thread_settings()))
    return lines


# peak RSS from /proc/self/status VmHWM (kB): unlike ru_maxrss, it belongs to this process image only (ru_maxrss
# of a child started by fork+exec also counts the parent's RSS at the fork)
_INSPECT = r"""
import json, sys, time, torch
from edgetorch.devtools import Inspector
def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
out = sys.argv[1]
rss0 = hwm()
t0 = time.perf_counter()
insp = Inspector(etdump_path=out + "/etdump.etdp", etrecord=out + "/etrecord.bin", debug_buffer_path=out + "/debug.bin")
t1 = time.perf_counter()
df = insp.calculate_numeric_gap("MSE")
t2 = time.perf_counter()
rss1 = hwm()
print(json.dumps({"construct": t1 - t0, "gap": t2 - t1, "rows": len(df), "peak_rss_kb": rss1,
                  "base_rss_kb": rss0, "coverage": insp.last_gap_coverage.summary()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        b = build(args.model, out)
        print(f"{args.model}: weights {b['weights'] / 2**20:.0f} MB, intermediates of one run "
              f"{b['debug_bytes'] / 2**20:.0f} MB")
        for line in debug_vs_plain(b, out, args.runs):
            print(line, flush=True)
        model, inputs = b["model"], b["inputs"]
        with torch.no_grad():
            model(*inputs)
            eager = []
            for _ in range(3):
                t0 = time.perf_counter()
                model(*inputs)
                eager.append(time.perf_counter() - t0)
        e = statistics.median(eager)
        env = dict(os.environ)
        r = subprocess.run([sys.executable, "-c", _INSPECT, out], capture_output=True, text=True, env=env)
        if r.returncode:
            print(r.stderr[-3000:])
            raise SystemExit(1)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        total = res["construct"] + res["gap"]
        print(f"  Inspector construction {res['construct']:.2f} s + calculate_numeric_gap {res['gap']:.2f} s = "
              f"{total:.2f} s for {res['rows']} per-op rows; one eager forward {1000 * e:.0f} ms; "
              f"ratio {total / e:.2f}x ({res['coverage']})")
        budget = b["weights"] + 2 * b["debug_bytes"]
        peak = res["peak_rss_kb"] * 1024
        print(f"  Inspector process peak RSS {peak / 2**20:.0f} MB (includes torch itself, "
              f"{res['base_rss_kb'] / 1024:.0f} MB at start); budget weights + 2x intermediates = "
              f"{budget / 2**20:.0f} MB")


if __name__ == "__main__":
    main()
