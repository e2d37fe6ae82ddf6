"""LLM latency on the edgetorch runtime against eager PyTorch with the same static KV cache.

For the zoo's Llama-style decoder (``--model llama_100m`` by default: ~125M parameters, fp32), exported as
``prefill`` (dynamic prompt length) + ``decode`` (one token) methods sharing the cache:

* decode latency per token at position ``--prompt`` (after a prefill of that many tokens), and
* prefill latency of a ``--prompt``-token prompt,

for the portable backend and the ONNX Runtime delegate, at 1 thread and the default thread count. Each figure is a
median of ``--runs`` alternating runs (runtime, eager, runtime, eager, ...) in one process; ratio = runtime / eager.
The program is loaded after the thread count is set (ORT sessions take torch's thread count when they are made).

    python bench/bench_llm.py --model llama_100m --prompt 128 --runs 15
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import alternate, thread_settings  # noqa: E402

from edgetorch.backends.onnxruntime import OrtPartitioner  # noqa: E402
from edgetorch.exir import to_edge_transform_and_lower  # noqa: E402
from edgetorch.models import get_spec  # noqa: E402
from edgetorch.models.llama import example_prompt, export_llama, param_count  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402


def build_programs(model: torch.nn.Module) -> dict[str, bytes]:
    eps = export_llama(model)
    out = {}
    for name, parts in (("portable", None), ("ort", [OrtPartitioner()])):
        t0 = time.perf_counter()
        out[name] = to_edge_transform_and_lower(eps, partitioner=parts).to_executorch().buffer
        print(f"  {name}: export + lower + emit {time.perf_counter() - t0:.1f} s, {len(out[name]) / 2**20:.0f} MiB",
              flush=True)
    return out


def measure(model, programs: dict[str, bytes], prompt_len: int, runs: int) -> list[str]:
    cfg = model.config
    prompt = example_prompt(cfg, prompt_len)
    pos = torch.arange(prompt_len)
    token, tpos = prompt[:, -1:], torch.tensor([prompt_len])
    lines = []
    for threads in thread_settings():
        torch.set_num_threads(threads)
        for name, buf in programs.items():
            prog = Runtime.get().load_program(buf)
            prefill, decode = prog.load_method("prefill"), prog.load_method("decode")
            with torch.no_grad():
                model.reset_cache()
                prefill.execute(prompt, pos)
                model.prefill(prompt, pos)
                dec = alternate({"runtime": lambda: decode.execute(token, tpos),
                                 "eager": lambda: model.decode(token, tpos)}, runs)
                pre = alternate({"runtime": lambda: prefill.execute(prompt, pos),
                                 "eager": lambda: model.prefill(prompt, pos)}, max(3, runs // 3), warmup=1)
            lines.append(f"threads={threads} {name:8s} decode {1000 * dec['runtime']:7.2f} ms/token vs eager "
                         f"{1000 * dec['eager']:7.2f} (ratio {dec['runtime'] / dec['eager']:.3f}); prefill "
                         f"{prompt_len} tokens {1000 * pre['runtime']:8.1f} ms vs eager {1000 * pre['eager']:8.1f} "
                         f"(ratio {pre['runtime'] / pre['eager']:.3f})")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama_100m")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    model = get_spec(args.model).build().eval()
    print(f"{args.model}: {param_count(model) / 1e6:.1f}M parameters, max_seq_len {model.config.max_seq_len}",
          flush=True)
    programs = build_programs(model)
    measure(model, programs, args.prompt, args.runs)


if __name__ == "__main__":
    main()
