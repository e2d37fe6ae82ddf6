"""What the load-time checks of issue 23 cost: ``load_method`` with and without them, on the zoo's models.

For each model the ``.pte`` is built once (``--out`` keeps it and its inputs for later runs) and loaded in fresh
subprocesses, with every check replaced by a no-op (``off``) and as shipped (``on``): ``load_program`` (parse +
InternalConsistency, where ``formats.plan_check`` runs), ``load_method`` (operator allow-list, argument checks),
the first ``execute`` (each kernel's outputs checked after it ran) and a second one (no checks left).
``python bench/bench_load_checks.py vit_tiny llama_tiny [vit_b_16 llama_100m] --out /tmp/pte``.
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
from edgetorch.formats import plan_check
from edgetorch.runtime import Runtime, Verification
from edgetorch.runtime.ops import resolve_operator
path, mode, inputs_path = sys.argv[1], sys.argv[2], sys.argv[3]
inputs = torch.load(inputs_path)
if mode == "off":  # every check of issue 23 replaced by a no-op
    M.check_kernel = lambda *a, **k: None
    M.check_operators = lambda plan: {i: resolve_operator(o.name, o.overload) for i, o in enumerate(plan.operators)}
    M.first_run_calls = lambda name, plan, slots, fast: fast
    plan_check.check_plan = lambda plan: None
    plan_check.check_io = lambda plan: None
t0 = time.perf_counter()
prog = Runtime.get().load_program(path, verification=Verification.InternalConsistency)
t1 = time.perf_counter()
method = prog.load_method("forward")
t2 = time.perf_counter()
method.execute(*inputs)
t3 = time.perf_counter()
method.execute(*inputs)
t4 = time.perf_counter()
plan = prog._loaded.program.plans[0]
t5 = time.perf_counter()
plan_check.check_plan(plan)
t6 = time.perf_counter()
print(json.dumps({"load_program_ms": (t1 - t0) * 1e3, "load_method_ms": (t2 - t1) * 1e3,
                  "first_run_ms": (t3 - t2) * 1e3, "second_run_ms": (t4 - t3) * 1e3,
                  "plan_check_ms": (t6 - t5) * 1e3, "instructions": len(plan.instructions),
                  "values": len(plan.values)}))
"""


def build(name: str, out: str) -> str:
    path = os.path.join(out, f"{name}.pte")
    if not os.path.exists(path):
        import torch

        from edgetorch.exir import to_edge
        from edgetorch.models import get_model

        model, inputs = get_model(name)
        to_edge(torch.export.export(model, inputs)).to_executorch().save(path)
        torch.save(inputs, path + ".inputs")
        del model
    return path


def run(path: str, mode: str) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD, path, mode, path + ".inputs"], capture_output=True,
                       text=True, cwd=ROOT, check=True)
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

        def med(rs: list[dict], key: str) -> float:
            return sorted(r[key] for r in rs)[len(rs) // 2]
        parts = []
        for key in ("load_program_ms", "load_method_ms", "first_run_ms", "second_run_ms"):
            parts.append(f"{key[:-3]} {med(off, key):.1f} -> {med(on, key):.1f} ms")
        print(f"{name} ({on[0]['instructions']} instructions, {on[0]['values']} values; built in {built:.0f} s): "
              + "; ".join(parts) + f"; plan_check alone {med(on, 'plan_check_ms'):.2f} ms "
              f"(median of {a.repeat} fresh processes, checks off -> on)", flush=True)


if __name__ == "__main__":
    main()
