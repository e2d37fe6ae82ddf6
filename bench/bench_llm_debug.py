"""Numeric debugging across generation: cost of a debug generation and of the per-step gaps, and peak memory.

For a zoo decoder (``--model``), exported once as prefill + decode (portable), this measures in one process:

* eager: greedy generation of ``--steps`` tokens (prefill of ``--prompt`` tokens + decode steps), median of 3;
* debug: the same generation on the runtime with ETDump and every intermediate logged (debug buffer streamed to a
  file), the ETDump written, then ``Inspector.generation_gaps()`` (the gap table of every step, the reference
  replayed on the recorded inputs with the KV cache carried over) and ``first_divergence_across_executions``;
* the ratio (debug run + gaps) / eager generation, and the peak RSS of the whole process (VmHWM, export included)
  against the weights' bytes.

    python bench/bench_llm_debug.py --model llama_100m --prompt 16 --steps 32
    python bench/bench_llm_debug.py --model llama_1b --prompt 16 --steps 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from edgetorch.devtools import Inspector  # noqa: E402
from edgetorch.exir import to_edge_transform_and_lower  # noqa: E402
from edgetorch.models import get_spec  # noqa: E402
from edgetorch.models.generation import greedy_generate  # noqa: E402
from edgetorch.models.llama import example_prompt, export_llama, param_count  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402


def peak_rss_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama_100m")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32, help="decode steps (tokens generated = steps + 1)")
    a = ap.parse_args()
    model = get_spec(a.model).build().eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    print(f"{a.model}: {param_count(model) / 1e6:.0f}M parameters, {weights:.2f} GiB of weights", flush=True)
    prompt = example_prompt(model.config, a.prompt)
    n = a.steps + 1
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        et = to_edge_transform_and_lower(export_llama(model), generate_etrecord=True).to_executorch()
        et.save(os.path.join(d, "m.pte"))
        rec = et.get_etrecord()
        rec.save(os.path.join(d, "rec.bin"))
        del et, rec
        print(f"export + lower + emit + ETRecord: {time.perf_counter() - t0:.1f} s; peak RSS {peak_rss_gib():.2f} GiB",
              flush=True)
        eager = []
        for _ in range(3):
            model.reset_cache()
            t0 = time.perf_counter()
            with torch.no_grad():
                want = greedy_generate(model.prefill, model.decode, prompt, n)
            eager.append(time.perf_counter() - t0)
        t_eager = statistics.median(eager)
        t0 = time.perf_counter()
        prog = Runtime.get().load_program(os.path.join(d, "m.pte"), enable_etdump=True,
                                          debug_buffer_path=os.path.join(d, "debug.bin"))
        got = greedy_generate(prog.load_method("prefill").execute, prog.load_method("decode").execute, prompt, n)
        prog.write_etdump_result_to_file(os.path.join(d, "e.etdp"), os.path.join(d, "debug.bin"))
        t_run = time.perf_counter() - t0
        del prog
        t0 = time.perf_counter()
        insp = Inspector(etdump_path=os.path.join(d, "e.etdp"), etrecord=os.path.join(d, "rec.bin"),
                         debug_buffer_path=os.path.join(d, "debug.bin"))
        gaps = insp.generation_gaps("MSE")
        first = insp.first_divergence_across_executions(1e-6)
        t_gaps = time.perf_counter() - t0
        size = os.path.getsize(os.path.join(d, "debug.bin")) / 2**30
    print(f"tokens match eager: {got == want}; {len(gaps)} executions, worst output gap "
          f"{gaps['output_gap'].max():.3e}; first divergence above 1e-6: "
          f"{'none' if first is None else (first.execution, first.op)}")
    print(f"eager generation {t_eager:.2f} s; debug run {t_run:.2f} s (debug buffer {size:.2f} GiB) + gaps of every "
          f"step {t_gaps:.2f} s = {(t_run + t_gaps) / t_eager:.2f}x eager")
    print(f"peak RSS of the whole flow {peak_rss_gib():.2f} GiB = {peak_rss_gib() / weights:.2f}x the weights")


if __name__ == "__main__":
    main()
