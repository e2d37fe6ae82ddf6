"""One copy of the weights in a multi-method ORT program (issue 25): program size, resident memory while decoding
and decode ms/token of an ORT LLM program (prefill + decode delegates) for each way the runtime hands the weights
to ONNX Runtime.

Programs: ``--before`` (each method's blob embeds its weights, made before named data) and ``--after`` (weights
in the program's named data, stored once). Runtime modes (``set_runtime_options``): ``copy`` (the sessions get the
weights with ``add_external_initializers``: ORT copies them per session), ``share`` (``add_initializer`` over the
program's mapped bytes: no copy), each with ORT's prepacking on (``:1``) or off (``:0``).

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
weights, prepack = sys.argv[3].split(":")
set_runtime_options(weights=weights, prepack=prepack, intra_op_num_threads=1)

def generate(path, cfg):
    prog = Runtime.get().load_program(path)
    prefill, decode = prog.load_method("prefill"), prog.load_method("decode")
    logits = prefill.execute(example_prompt(cfg, 8), torch.arange(8))[0]
    for i in range(16):
        token = logits.reshape(-1, logits.shape[-1])[-1].argmax().reshape(1, 1)
        logits = decode.execute(token, torch.tensor([8 + i]))[0]
    return prog, logits

warm = generate(sys.argv[2], LLAMA_CONFIGS["llama_tiny"])
before = proc.memory_info().rss
prog, logits = generate(sys.argv[1], LLAMA_CONFIGS["llama_100m"])
peak = proc.memory_info().rss
print(json.dumps({"rss_mib": (peak - before) / 2**20, "argmax": int(logits.reshape(-1).argmax())}))
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
        weights, prepack = mode.split(":")
        set_runtime_options(weights=weights, prepack=prepack, intra_op_num_threads=1)
        prog = Runtime.get().load_program(path)
        pre, dec = prog.load_method("prefill"), prog.load_method("decode")
        pre.execute(prompt, torch.arange(32))
        steps[label] = lambda d=dec: d.execute(prompt[:, -1:], torch.tensor([32]))
    set_runtime_options(weights=None, prepack=None, intra_op_num_threads=None)
    return {k: 1000 * v for k, v in alternate(steps, runs).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--tiny", required=True, help="a llama_tiny program of the same recipe (pages libraries in)")
    ap.add_argument("--reference", default=None, help="the reference's 8da4w .pte (its size is compared)")
    ap.add_argument("--modes", default="copy:1,share:1,share:0")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    ref = os.path.getsize(args.reference) / 2**20 if args.reference else None
    programs = {"before copy:1": (args.before, "copy:1")}
    programs.update({f"after {m}": (args.after, m) for m in args.modes.split(",")})
    print(f"load {os.getloadavg()}; {os.cpu_count()} cpus; torch {torch.__version__}", flush=True)
    for label, (path, mode) in programs.items():
        size = os.path.getsize(path) / 2**20
        r = resident(path, args.tiny, mode)
        vs = f", {size / ref:.2f}x the reference's {ref:.1f} MiB" if ref else ""
        print(f"{label:16s} program {size:6.1f} MiB{vs}; resident while decoding {r['rss_mib']:6.1f} MiB "
              f"({r['rss_mib'] / size:.2f}x the program); last argmax {r['argmax']}; load {os.getloadavg()[0]:.1f}",
              flush=True)
    for label, ms in decode_times(programs, args.runs).items():
        print(f"{label:16s} decode {ms:6.2f} ms/token (1 thread); load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
