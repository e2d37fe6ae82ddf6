"""One copy of the weights in a multi-method ORT program (issue 25): program size, resident memory while decoding
and decode ms/token of an ORT LLM program (prefill + decode delegates) for each way the runtime hands the weights
to ONNX Runtime.

Programs: ``--before`` (each method's blob embeds its weights, made before named data), ``--after`` (weights
in the program's named data, stored once) and ``--one-graph`` (also: decode exported from the prefill's dynamic
graph, ``llama_method_inputs(one_graph=True)``, so both methods run one ORT session per delegate). Runtime modes
(``set_runtime_options``): ``copy`` (the sessions get the weights with ``add_external_initializers``: ORT copies
them per session), ``share`` (``add_initializer`` over the program's mapped bytes: no copy), each with ORT's
prepacking on (``:1``) or off (``:0``), optionally ``:<in_place_ops>`` (``copy:1:`` copies the embedding too;
default ``Gather``: bound to the program's bytes). ``--breakdown``: the resident memory each stage adds (load,
each method's sessions, prefill, decodes), split by mapping (anonymous, heap, the program file, libraries).

Resident memory: what a fresh process adds while it prefills 8 tokens and decodes 16 (after a llama_tiny program of
the same recipe paged in the libraries), one child per program and mode. Decode: medians of ``--runs`` alternating
decode steps (every program/mode loaded in one process), 1 thread; the load average is printed beside.

    python bench/bench_named_data.py --before /tmp/lb/ort_8da4w.pte --after /tmp/nd/lb/ort_8da4w.pte \\
        --tiny /tmp/nd/lb/ort_8da4w_tiny.pte --reference /tmp/lb/ref_8da4w_g32.pte
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import alternate  # noqa: E402

from edgetorch.backends.onnxruntime.runtime import set_runtime_options  # noqa: E402
from edgetorch.models.llama import LLAMA_CONFIGS, example_prompt  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402

_CHILD = """
import json, os, sys, psutil, torch
from edgetorch.backends.onnxruntime.runtime import set_runtime_options
from edgetorch.runtime import Runtime
from edgetorch.models.llama import LLAMA_CONFIGS, example_prompt
torch.set_num_threads(1)
proc = psutil.Process(os.getpid())
mode = sys.argv[3].split(":")
set_runtime_options(weights=mode[0], prepack=mode[1], intra_op_num_threads=1,
                    in_place_ops=mode[2] if len(mode) > 2 else None)

def smaps():
    out, kind = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                parts = line.split()
                path = parts[5] if len(parts) > 5 else "anon"
                kind = "program" if path == PATH else "libs" if ".so" in path else path.strip("[]")
            elif line.startswith("Rss:"):
                out[kind] = out.get(kind, 0) + int(line.split()[1]) / 1024
    return out

def generate(path, cfg, stages):
    prog = Runtime.get().load_program(path)
    stages.append(("load", smaps()))
    prefill = prog.load_method("prefill")
    stages.append(("prefill sessions", smaps()))
    decode = prog.load_method("decode")
    stages.append(("decode sessions", smaps()))
    logits = prefill.execute(example_prompt(cfg, 8), torch.arange(8))[0]
    stages.append(("prefill 8", smaps()))
    for i in range(16):
        token = logits.reshape(-1, logits.shape[-1])[-1].argmax().reshape(1, 1)
        logits = decode.execute(token, torch.tensor([8 + i]))[0]
    stages.append(("decode 16", smaps()))
    return prog, logits

PATH = os.path.realpath(sys.argv[1])
warm = generate(sys.argv[2], LLAMA_CONFIGS["llama_tiny"], [])
before, stages = proc.memory_info().rss, [("start", smaps())]
prog, logits = generate(sys.argv[1], LLAMA_CONFIGS["llama_100m"], stages)
peak = proc.memory_info().rss
steps = [(name, {k: v - prev.get(k, 0) for k, v in now.items() if abs(v - prev.get(k, 0)) >= 0.5})
         for (_, prev), (name, now) in zip(stages, stages[1:])]
print(json.dumps({"rss_mib": (peak - before) / 2**20, "argmax": int(logits.reshape(-1).argmax()), "steps": steps}))
"""


def resident(path: str, tiny: str, mode: str) -> dict:
    res = subprocess.run([sys.executable, "-c", _CHILD, path, tiny, mode], capture_output=True, text=True,
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def decode_times(programs: dict[str, tuple[str, str]], runs: int) -> dict[str, float]:
    cfg = LLAMA_CONFIGS["llama_100m"]
    prompt = example_prompt(cfg, 32)
    torch.set_num_threads(1)
    steps = {}
    for label, (path, mode) in programs.items():
        m = mode.split(":")
        set_runtime_options(weights=m[0], prepack=m[1], intra_op_num_threads=1,
                            in_place_ops=m[2] if len(m) > 2 else None)
        prog = Runtime.get().load_program(path)
        pre, dec = prog.load_method("prefill"), prog.load_method("decode")
        pre.execute(prompt, torch.arange(32))
        steps[label] = lambda d=dec: d.execute(prompt[:, -1:], torch.tensor([32]))
    set_runtime_options(weights=None, prepack=None, intra_op_num_threads=None, in_place_ops=None)
    return {k: 1000 * v for k, v in alternate(steps, runs).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=None)
    ap.add_argument("--after", required=True)
    ap.add_argument("--one-graph", default=None, help="the same recipe, decode exported from the prefill's graph")
    ap.add_argument("--breakdown", action="store_true", help="print what each stage adds, by mapping")
    ap.add_argument("--tiny", required=True, help="a llama_tiny program of the same recipe (pages libraries in)")
    ap.add_argument("--reference", default=None, help="the reference's 8da4w .pte (its size is compared)")
    ap.add_argument("--modes", default="copy:1,copy:1:,share:1")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    ref = os.path.getsize(args.reference) / 2**20 if args.reference else None
    programs = {"before copy:1": (args.before, "copy:1")} if args.before else {}
    programs.update({f"after {m}": (args.after, m) for m in args.modes.split(",")})
    if args.one_graph:
        programs.update({f"one-graph {m}": (args.one_graph, m) for m in args.modes.split(",")})
    print(f"load {os.getloadavg()}; {os.cpu_count()} cpus; torch {torch.__version__}", flush=True)
    for label, (path, mode) in programs.items():
        size = os.path.getsize(path) / 2**20
        r = resident(path, args.tiny, mode)
        vs = f", {size / ref:.2f}x the reference's {ref:.1f} MiB" if ref else ""
        print(f"{label:16s} program {size:6.1f} MiB{vs}; resident while decoding {r['rss_mib']:6.1f} MiB "
              f"({r['rss_mib'] / size:.2f}x the program); last argmax {r['argmax']}; load {os.getloadavg()[0]:.1f}",
              flush=True)
        for step, parts in r["steps"] if args.breakdown else ():
            print(f"    {step:17s} +{sum(parts.values()):6.1f} MiB: " +
                  ", ".join(f"{k} {v:+.1f}" for k, v in sorted(parts.items(), key=lambda kv: -abs(kv[1]))), flush=True)
    for label, ms in decode_times(programs, args.runs).items():
        print(f"{label:16s} decode {ms:6.2f} ms/token (1 thread); load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
