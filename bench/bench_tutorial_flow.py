"""The tutorial flow on a zoo model (ViT-B/16 by default), step by step, each step in a fresh process.

Usage: python bench/bench_tutorial_flow.py [--model vit_b_16] [--backends portable onnxruntime]
       [--buffer-mb 1024] [--threads 1] [--runs 5] [--observer-effect first|every|off]

Steps, per backend (portable: ``to_edge``; onnxruntime: ``OrtPartitioner``), as in the README's tutorial:

1. ``export``: ``torch.export`` + lower + emit + save the ``.pte`` and the ETRecord;
2. ``plain``: load + first execute (+ a second) of the plain program in a fresh process, the baseline of the
   debug step's first execute;
3. ``debug``: load with ETDump and a fixed debug buffer (the tutorial's 1 GiB) + one execute + write the ETDump
   and the debug buffer (load, execute and write are also timed apart);
4. ``inspect``: ``Inspector`` construction + ``calculate_numeric_gap("MSE")``, divided by one eager forward (the
   median of 3, in the same process);
5. ``ratio``: warm debug execute / plain execute, alternating in one process (a plain program and a debug program
   loaded side by side; each debug run on a fresh ETDump so that the buffer never fills): medians.

Every step reports its process's peak RSS (``VmHWM`` of ``/proc/self/status``: the child's own, unlike
``ru_maxrss`` of a child started by fork+exec, which also counts the parent at the fork); the flow's peak is the
largest. With 1 thread the child is pinned to one core. ``--observer-effect`` sets the onnxruntime delegates'
``observer_effect`` (default ``first``: the first debug run also runs the plain session to compare).
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

sys.path.insert(0, os.path.dirname(__file__))


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _partitioners(backend: str) -> list:
    if backend == "portable":
        return []
    from edgetorch.backends.onnxruntime import OrtPartitioner

    return [OrtPartitioner()]


def step_export(a: argparse.Namespace) -> dict:
    import torch

    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.models import get_model

    model, inputs = get_model(a.model)
    t0 = time.perf_counter()
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=_partitioners(a.backend),
                                       generate_etrecord=True)
    et = edge.to_executorch()
    et.save(os.path.join(a.dir, "model.pte"))
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    rec.save(os.path.join(a.dir, "etrecord.bin"))
    total = time.perf_counter() - t0
    torch.save(inputs, os.path.join(a.dir, "inputs.pt"))
    return {"seconds": total}


def step_debug(a: argparse.Namespace) -> dict:
    import torch

    from edgetorch.runtime import Runtime

    inputs = torch.load(os.path.join(a.dir, "inputs.pt"))
    t0 = time.perf_counter()
    prog = Runtime.get().load_program(os.path.join(a.dir, "model.pte"), enable_etdump=True,
                                      debug_buffer_size=a.buffer_mb << 20)
    method = prog.load_method("forward")
    t1 = time.perf_counter()
    rss_loaded = _rss_mb()
    method.execute(*inputs)
    t2 = time.perf_counter()
    prog.write_etdump_result_to_file(os.path.join(a.dir, "run.etdp"), os.path.join(a.dir, "run_debug.bin"))
    t3 = time.perf_counter()
    return {"seconds": t3 - t0, "load": t1 - t0, "execute": t2 - t1, "write": t3 - t2, "rss_loaded_mb": rss_loaded,
            "debug_bin_mb": os.path.getsize(os.path.join(a.dir, "run_debug.bin")) / 2**20}


def step_plain(a: argparse.Namespace) -> dict:
    """The plain run of the same program in a fresh process, as the debug step does it: load + first execute
    (the first run of a process pays the page faults of its weights and arena), then a second execute."""
    import torch

    from edgetorch.runtime import Runtime

    inputs = torch.load(os.path.join(a.dir, "inputs.pt"))
    t0 = time.perf_counter()
    method = Runtime.get().load_program(os.path.join(a.dir, "model.pte")).load_method("forward")
    t1 = time.perf_counter()
    method.execute(*inputs)
    t2 = time.perf_counter()
    method.execute(*inputs)
    t3 = time.perf_counter()
    return {"seconds": t2 - t0, "load": t1 - t0, "execute": t2 - t1, "second_execute": t3 - t2}


def step_inspect(a: argparse.Namespace) -> dict:
    import torch

    from edgetorch.devtools import Inspector
    from edgetorch.models import get_model

    t0 = time.perf_counter()
    insp = Inspector(etdump_path=os.path.join(a.dir, "run.etdp"), etrecord=os.path.join(a.dir, "etrecord.bin"),
                     debug_buffer_path=os.path.join(a.dir, "run_debug.bin"))
    df = insp.calculate_numeric_gap("MSE")
    total = time.perf_counter() - t0
    hwm = _hwm_mb()  # the eager model below is not part of the step
    model, inputs = get_model(a.model)
    eager = []
    with torch.no_grad():
        model(*inputs)
        for _ in range(3):
            e0 = time.perf_counter()
            model(*inputs)
            eager.append(time.perf_counter() - e0)
    e = statistics.median(eager)
    return {"seconds": total, "rows": len(df), "eager_s": e, "over_eager": total / e, "hwm_mb": hwm}


def step_ratio(a: argparse.Namespace) -> dict:
    import torch

    from edgetorch.runtime import Runtime

    inputs = torch.load(os.path.join(a.dir, "inputs.pt"))
    pte = os.path.join(a.dir, "model.pte")
    plain = Runtime.get().load_program(pte).load_method("forward")
    prog = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=a.buffer_mb << 20)
    debug = prog.load_method("forward")
    t_plain, t_debug = [], []
    first = None
    for r in range(a.runs + 1):
        t0 = time.perf_counter()
        plain.execute(*inputs)
        t1 = time.perf_counter()
        debug.execute(*inputs)
        t2 = time.perf_counter()
        if r == 0:
            first = t2 - t1
        else:
            t_plain.append(t1 - t0)
            t_debug.append(t2 - t1)
        prog.tracer.clear()  # a fresh ETDump (and debug buffer) for the next run
    p, d = statistics.median(t_plain), statistics.median(t_debug)
    return {"plain_s": p, "debug_s": d, "ratio": d / p, "first_debug_s": first,
            "range": [min(t_debug) / max(t_plain), max(t_debug) / min(t_plain)]}


_STEPS = {"export": step_export, "plain": step_plain, "debug": step_debug, "inspect": step_inspect,
          "ratio": step_ratio}


def _child(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(a.threads)
    if a.observer_effect:
        from edgetorch.backends.onnxruntime.runtime import set_runtime_options

        set_runtime_options(observer_effect=a.observer_effect)
    if a.threads == 1:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    out = _STEPS[a.step](a)
    out.setdefault("hwm_mb", _hwm_mb())
    print("RESULT " + json.dumps(out), flush=True)


def _run_step(a: argparse.Namespace, backend: str, step: str, d: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--step", step, "--backends", backend, "--dir", d,
           "--model", a.model, "--buffer-mb", str(a.buffer_mb), "--threads", str(a.threads), "--runs", str(a.runs),
           *(["--observer-effect", a.observer_effect] if a.observer_effect else [])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("RESULT ")), None)
    if r.returncode or line is None:
        raise SystemExit(f"step {step} ({backend}) failed:\n{r.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--backends", nargs="+", default=["portable", "onnxruntime"])
    ap.add_argument("--buffer-mb", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", nargs="+", default=list(_STEPS))
    ap.add_argument("--observer-effect", choices=["first", "every", "off"])
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.step:
        a.backend = a.backends[0]
        return _child(a)
    print(f"{a.model}, {a.threads} thread(s), debug buffer {a.buffer_mb} MiB")
    for backend in a.backends:
        with tempfile.TemporaryDirectory() as d:
            res = {s: _run_step(a, backend, s, d) for s in a.steps}
        _report(backend, res)


def _report(backend: str, res: dict) -> None:
    print(f"== {backend}")
    if "export" in res:
        e = res["export"]
        print(f"  export + lower + emit: {e['seconds']:.2f} s, peak RSS {e['hwm_mb']:.0f} MiB")
    if "debug" in res:
        r = res["debug"]
        print(f"  debug run: {r['seconds']:.2f} s (load {r['load']:.2f}, execute {r['execute']:.2f}, write "
              f"{r['write']:.2f}), RSS after load {r['rss_loaded_mb']:.0f} MiB, peak RSS {r['hwm_mb']:.0f} MiB, "
              f"debug buffer written {r['debug_bin_mb']:.0f} MiB")
    if "plain" in res:
        p = res["plain"]
        line = (f"  plain run (fresh process): load {p['load']:.2f} s, first execute {p['execute']:.2f} s, second "
                f"{p['second_execute']:.2f} s")
        if "debug" in res:
            line += f"; first debug execute / first plain execute: {res['debug']['execute'] / p['execute']:.2f}"
        print(line)
    if "inspect" in res:
        i = res["inspect"]
        print(f"  Inspector + gap: {i['seconds']:.2f} s ({i['rows']} rows) = {i['over_eager']:.2f}x one eager forward "
              f"({1000 * i['eager_s']:.0f} ms), peak RSS {i['hwm_mb']:.0f} MiB")
    if "ratio" in res:
        q = res["ratio"]
        print(f"  warm debug execute / plain execute: {q['ratio']:.2f} (range {q['range'][0]:.2f}-{q['range'][1]:.2f};"
              f" plain {1000 * q['plain_s']:.0f} ms, debug {1000 * q['debug_s']:.0f} ms, first debug execute "
              f"{1000 * q['first_debug_s']:.0f} ms), peak RSS {q['hwm_mb']:.0f} MiB")
    steps = [k for k in ("export", "plain", "debug", "inspect") if k in res]
    if steps:
        print(f"  peak RSS of the flow: {max(res[k]['hwm_mb'] for k in steps) / 1024:.2f} GiB")


if __name__ == "__main__":
    main()
