"""Quantized LLM on device: torchao 8da4w (int8 dynamic activations, int4 weights) through the export recipes,
on the portable backend (``edgetorch::linear_q4``) and the ONNX Runtime delegate (``MatMulNBits``), against eager
fp32 and edgetorch fp32.

For the zoo's ``llama_100m`` (prefill + decode methods sharing a static KV cache): decode ms/token at position
``--prompt``, prefill of ``--prompt`` tokens, program MiB, and the resident memory a fresh process adds while it
decodes (loaded from the saved .pte, measured in a subprocess per program); 1 and 2 threads. Timings are medians of
``--runs`` alternating runs (eager, edgetorch fp32, 8da4w portable, 8da4w ORT, eager, ...) in one process.

    python bench/bench_lowbit.py --model llama_100m --prompt 128 --runs 15 --out /tmp/lowbit
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import alternate, threads  # noqa: E402

from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, export  # noqa: E402
from edgetorch.models import get_spec  # noqa: E402
from edgetorch.models.generation import as_logits  # noqa: E402
from edgetorch.models.llama import example_prompt, llama_dynamic_shapes, llama_method_inputs  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402

RECIPES = {
    "et_fp32": (PortableRecipeType.FP32, {}),
    "et_8da4w": (PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR, {}),
    "ort_8da4w": (OrtRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR, {}),
}

_RSS_CHILD = """
import json, os, sys, psutil, torch
from edgetorch.runtime import Runtime
from edgetorch.models.llama import LLAMA_CONFIGS, example_prompt
torch.set_num_threads(1)
proc = psutil.Process(os.getpid())

def generate(path, cfg):
    prog = Runtime.get().load_program(path)
    prefill, decode = prog.load_method("prefill"), prog.load_method("decode")
    prompt = example_prompt(cfg, 8)
    logits = prefill.execute(prompt, torch.arange(8))[0]
    for i in range(16):
        token = logits.reshape(-1, logits.shape[-1])[-1].argmax().reshape(1, 1)
        logits = decode.execute(token, torch.tensor([8 + i]))[0]
    return prog

warm = generate(sys.argv[3], LLAMA_CONFIGS["llama_tiny"])  # libraries and kernels paged in: not the program's
before = proc.memory_info().rss
prog = generate(sys.argv[1], LLAMA_CONFIGS[sys.argv[2]])
print(json.dumps({"rss_mib": (proc.memory_info().rss - before) / 2**20}))
"""


def build(model: torch.nn.Module, out: str, tag: str = "", reuse: bool = False) -> dict[str, str]:
    paths = {}
    for name, (rtype, kwargs) in RECIPES.items():
        if reuse and os.path.exists(os.path.join(out, f"{name}{tag}.pte")):
            paths[name] = os.path.join(out, f"{name}{tag}.pte")
            continue
        t0 = time.perf_counter()
        one = isinstance(rtype, OrtRecipeType)  # decode from the prefill's graph: one ORT session serves both
        inputs = llama_method_inputs(model.config, one_graph=one)
        session = export({"prefill": model, "decode": model}, {k: [v] for k, v in inputs.items()},
                         ExportRecipe.get_recipe(rtype, **kwargs),
                         dynamic_shapes=llama_dynamic_shapes(model.config, one_graph=one))
        paths[name] = os.path.join(out, f"{name}{tag}.pte")
        session.save_to_pte(paths[name])
        del session
        gc.collect()
        print(f"  {name}: export {time.perf_counter() - t0:.0f} s, {os.path.getsize(paths[name]) / 2**20:.1f} MiB",
              flush=True)
    return paths


def resident(paths: dict[str, str], warm: dict[str, str], model_name: str) -> dict[str, float]:
    """Resident memory a process adds loading and running each program, after a llama_tiny program of the same
    recipe has paged in the libraries and kernels."""
    out = {}
    for name, path in paths.items():
        res = subprocess.run([sys.executable, "-c", _RSS_CHILD, path, model_name, warm[name]], capture_output=True,
                             text=True, check=True)
        out[name] = json.loads(res.stdout.strip().splitlines()[-1])["rss_mib"]
    return out


def measure(model, paths: dict[str, str], prompt_len: int, runs: int, n_threads: int) -> dict[str, dict]:
    prompt = example_prompt(model.config, prompt_len)
    pos = torch.arange(prompt_len)
    token, tpos = prompt[:, -1:], torch.tensor([prompt_len])
    with threads(n_threads):
        methods = {}
        for name, path in paths.items():
            prog = Runtime.get().load_program(path)
            methods[name] = (prog.load_method("prefill"), prog.load_method("decode"))
        with torch.no_grad():
            model.reset_cache()
            model.prefill(prompt, pos)
            for pre, _ in methods.values():
                pre.execute(prompt, pos)
            dec = {"eager_fp32": lambda: model.decode(token, tpos)}
            pre = {"eager_fp32": lambda: model.prefill(prompt, pos)}
            for name, (p, d) in methods.items():
                dec[name] = lambda d=d: d.execute(token, tpos)
                pre[name] = lambda p=p: p.execute(prompt, pos)
            decode_s = alternate(dec, runs)
            prefill_s = alternate(pre, max(3, runs // 3), warmup=1)
            logits = {}  # the decode step after the prompt (every cache holds the same state again)
            for k in dec:
                pre[k]()
                logits[k] = as_logits(dec[k]())
    res = {k: {"decode_ms": 1000 * decode_s[k], "prefill_ms": 1000 * prefill_s[k]} for k in decode_s}
    for k in res:
        res[k]["sqnr_db"] = sqnr_db(logits[k], logits["eager_fp32"])
    return res


def sqnr_db(got: torch.Tensor, want: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``got`` against the float ``want``, in dB (inf: identical)."""
    noise = float((got.float() - want.float()).pow(2).sum())
    return float("inf") if noise == 0 else 10 * math.log10(float(want.float().pow(2).sum()) / noise)


def reference_times(args: argparse.Namespace, n_threads: int) -> dict[str, float]:
    """The reference program's decode / prefill medians from a child in the reference's environment."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_lowbit.py")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    path = os.path.join(args.out, "reference_logits.pt")
    res = subprocess.run([args.reference_python, script, "time", "--model", args.model, "--pte", args.reference_pte,
                          "--threads", str(n_threads), "--prompt", str(args.prompt), "--runs", str(args.runs),
                          "--logits", path],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": src})
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["logits"] = torch.load(path)
    return out


def eager_logits(model: torch.nn.Module, prompt_len: int) -> torch.Tensor:
    prompt = example_prompt(model.config, prompt_len)
    with torch.no_grad():
        model.reset_cache()
        model.prefill(prompt, torch.arange(prompt_len))
        return model.decode(prompt[:, -1:], torch.tensor([prompt_len]))


def _print(n: int, name: str, v: dict, base: dict, prompt: int) -> None:
    dec, pre = v["decode_ms"], v["prefill_ms"]
    print(f"threads={n} {name:10s} decode {dec:7.2f} ms/token ({dec / base['decode_ms']:.2f}x eager) prefill "
          f"{prompt} {pre:7.1f} ms ({pre / base['prefill_ms']:.2f}x eager)  logits SQNR {v['sqnr_db']:.1f} dB  "
          f"load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama_100m")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", default="/tmp/edgetorch-lowbit")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reference-python", default=None,
                    help="python of an environment with executorch 1.5.1: time --reference-pte (made by "
                         "bench/reference_lowbit.py export) in a child before and after each thread count")
    ap.add_argument("--reference-pte", default=None)
    ap.add_argument("--reuse", action="store_true", help="keep the programs already in --out (the kernels run "
                                                          "at load: a runtime change needs no re-export)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = get_spec(args.model).build().eval()
    print(f"{args.model}; torch {torch.__version__}; {os.cpu_count()} cpus; load {os.getloadavg()}", flush=True)
    warm = build(get_spec("llama_tiny").build().eval(), args.out, "_tiny", args.reuse)
    paths = build(model, args.out, reuse=args.reuse)
    sizes = {k: os.path.getsize(p) / 2**20 for k, p in paths.items()}
    rss = resident(paths, warm, args.model)
    for k in paths:
        print(f"  {k}: program {sizes[k]:.1f} MiB, resident while decoding {rss[k]:.1f} MiB "
              f"({rss[k] / sizes[k]:.2f}x the program)", flush=True)
    if args.reference_pte:
        print(f"  reference XNNPACK 8da4w: program {os.path.getsize(args.reference_pte) / 2**20:.1f} MiB", flush=True)
    for n in (int(t) for t in args.threads.split(",")):
        refs = [reference_times(args, n)] if args.reference_python else []
        res = measure(model, paths, args.prompt, args.runs, n)
        if args.reference_python:
            refs.append(reference_times(args, n))
            res["reference"] = {k: statistics.median(r[k] for r in refs) for k in ("decode_ms", "prefill_ms")}
            res["reference"]["sqnr_db"] = sqnr_db(refs[-1]["logits"], eager_logits(model, args.prompt))
        for k, v in res.items():
            _print(n, k, v, res["eager_fp32"], args.prompt)


if __name__ == "__main__":
    main()
