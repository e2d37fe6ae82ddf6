"""What the load-time checks of issue 23 cost: ``load_method`` with and without them, on the zoo's models.

For each model the ``.pte`` is built once (``--out`` keeps it for later runs) and loaded in fresh subprocesses:
``checks off`` (the kernel and plan checks replaced by no-ops), ``checks on`` (a cold process: the first meta
kernel calls of torch included) and ``checks on, again`` (same process, second load: signatures already
checked). ``python bench/bench_load_checks.py vit_tiny llama_tiny [vit_b_16 llama_100m] --out /tmp/pte``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, sys, time, torch
import edgetorch.runtime.method as M
import edgetorch.runtime._load_checks as L
from edgetorch.runtime import Runtime, Verification
path, mode = sys.argv[1], sys.argv[2]
if mode == "off":
    M.check_kernel = lambda *a, **k: None
    if hasattr(M, "check_plan"):
        M.check_plan = lambda *a, **k: None
prog = Runtime.get().load_program(path, verification=Verification.InternalConsistency)
names = prog.method_names if hasattr(prog, "method_names") else ["forward"]
times = []
for rep in range(2):
    t0 = time.perf_counter()
    prog.load_method("forward")
    times.append((time.perf_counter() - t0) * 1e3)
    prog = Runtime.get().load_program(path, verification=Verification.InternalConsistency)
kern = time.perf_counter()
print(json.dumps({"first_ms": times[0], "second_ms": times[1], "checked_signatures": len(L._CHECKED)}))
"""


def build(name: str, out: str) -> str:
    path = os.path.join(out, f"{name}.pte")
    if not os.path.exists(path):
        import torch

        from edgetorch.exir import to_edge
        from edgetorch.models import get_model

        model, inputs = get_model(name)
        to_edge(torch.export.export(model, inputs)).to_executorch().save(path)
        del model
    return path


def run(path: str, mode: str) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD, path, mode], capture_output=True, text=True, cwd=ROOT,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", default="/tmp/edgetorch_load_checks")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.models:
        t0 = time.perf_counter()
        path = build(name, a.out)
        built = time.perf_counter() - t0
        off = [run(path, "off") for _ in range(a.repeat)]
        on = [run(path, "on") for _ in range(a.repeat)]
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        f_off, f_on = med([r["first_ms"] for r in off]), med([r["first_ms"] for r in on])
        s_off, s_on = med([r["second_ms"] for r in off]), med([r["second_ms"] for r in on])
        print(f"{name}: load_method checks off {f_off:.1f} ms, on {f_on:.1f} ms (+{f_on - f_off:.1f} ms, cold "
              f"process); second load off {s_off:.1f} ms, on {s_on:.1f} ms (+{s_on - s_off:.1f} ms); "
              f"{on[0]['checked_signatures']} distinct kernel signatures; built in {built:.0f} s", flush=True)


if __name__ == "__main__":
    main()
