"""Numeric debugging across generation: cost of a debug generation and of the per-step gaps, and peak memory.

For a zoo decoder (``--model``) the flow runs as a user runs it, one process per stage (the device run and the
host-side inspection are separate programs), each reporting its wall time and peak RSS (VmHWM):

1. ``export``: build the model, export prefill + decode, lower (portable), emit the ``.pte`` and the ETRecord;
2. ``eager``: greedy generation of ``--steps`` + 1 tokens with eager PyTorch (median of 3), tokens saved;
3. ``debug``: the same generation on the runtime with ETDump and every intermediate streamed to a debug-buffer
   file, the ETDump written;
4. ``gaps``: ``Inspector.generation_gaps()`` (the gap table of every step, the reference replayed on the recorded
   inputs with the KV cache carried over) and ``first_divergence_across_executions``.

Printed: (debug run + gaps) / eager generation time (stage times exclude Python imports, include loading the
program, ETDump, ETRecord and debug buffer), and the largest per-stage peak RSS / the weights' bytes.

    python bench/bench_llm_debug.py --model llama_100m --prompt 16 --steps 32
    python bench/bench_llm_debug.py --model llama_1b --prompt 16 --steps 8
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


def peak_rss_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def _stage(name: str, a: argparse.Namespace, folder: str) -> dict:
    import torch

    from edgetorch.devtools import Inspector  # noqa: F401  (imports are not what is measured)
    from edgetorch.exir import to_edge_transform_and_lower  # noqa: F401
    from edgetorch.models import get_spec
    from edgetorch.models.generation import greedy_generate
    from edgetorch.models.llama import LLAMA_CONFIGS, example_prompt
    from edgetorch.runtime import Runtime  # noqa: F401

    cfg = LLAMA_CONFIGS[a.model] if a.model in LLAMA_CONFIGS else get_spec(a.model).build().config
    prompt = example_prompt(cfg, a.prompt)
    n = a.steps + 1
    p = {k: os.path.join(folder, v) for k, v in dict(pte="m.pte", rec="rec.bin", etdp="e.etdp", dbg="debug.bin",
                                                     tokens="tokens.json").items()}
    t0 = time.perf_counter()
    out: dict = {}
    if name == "export":
        from edgetorch.exir import to_edge_transform_and_lower
        from edgetorch.models.llama import export_llama

        model = get_spec(a.model).build().eval()
        out["weights_gib"] = sum(t.numel() * t.element_size() for t in model.parameters()) / 2**30
        et = to_edge_transform_and_lower(export_llama(model), generate_etrecord=True).to_executorch()
        et.save(p["pte"])
        et.get_etrecord().save(p["rec"])
    elif name == "eager":
        model = get_spec(a.model).build().eval()
        times = []
        for _ in range(3):
            model.reset_cache()
            t1 = time.perf_counter()
            with torch.no_grad():
                tokens = greedy_generate(model.prefill, model.decode, prompt, n)
            times.append(time.perf_counter() - t1)
        out["generation_s"] = statistics.median(times)
        with open(p["tokens"], "w") as f:
            json.dump(tokens, f)
    elif name == "debug":
        from edgetorch.runtime import Runtime

        prog = Runtime.get().load_program(p["pte"], enable_etdump=True, debug_buffer_path=p["dbg"])
        tokens = greedy_generate(prog.load_method("prefill").execute, prog.load_method("decode").execute, prompt, n)
        prog.write_etdump_result_to_file(p["etdp"], p["dbg"])
        with open(p["tokens"]) as f:
            out["tokens_match"] = tokens == json.load(f)
        out["debug_gib"] = os.path.getsize(p["dbg"]) / 2**30
    elif name == "gaps":
        from edgetorch.devtools import Inspector

        insp = Inspector(etdump_path=p["etdp"], etrecord=p["rec"], debug_buffer_path=p["dbg"])
        gaps = insp.generation_gaps("MSE")
        first = insp.first_divergence_across_executions(1e-6)
        out.update(executions=len(gaps), worst_output_gap=float(gaps["output_gap"].max()),
                   first_divergence=None if first is None else [first.execution, str(first.op)])
    out.update(stage=name, seconds=time.perf_counter() - t0, peak_rss_gib=peak_rss_gib())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama_100m")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32, help="decode steps (tokens generated = steps + 1)")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.stage:
        print("RESULT " + json.dumps(_stage(a.stage, a, a.folder)), flush=True)
        return
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for stage in ("export", "eager", "debug", "gaps"):
            cmd = [sys.executable, __file__, "--model", a.model, "--prompt", str(a.prompt), "--steps", str(a.steps),
                   "--stage", stage, "--folder", d]
            r = subprocess.run(cmd, capture_output=True, text=True)
            line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(r.stderr[-3000:])
                raise SystemExit(f"stage {stage} failed")
            res[stage] = json.loads(line[7:])
            print(f"{stage:7s} {res[stage]['seconds']:7.2f} s, peak RSS {res[stage]['peak_rss_gib']:.2f} GiB "
                  f"{ {k: v for k, v in res[stage].items() if k not in ('stage', 'seconds', 'peak_rss_gib')} }",
                  flush=True)
    w = res["export"]["weights_gib"]
    eager = res["eager"]["generation_s"]
    dbg = res["debug"]["seconds"] + res["gaps"]["seconds"]
    peak = max(r["peak_rss_gib"] for r in res.values())
    print(f"{a.model}: debug run + gaps of all {a.steps + 1} steps {dbg:.1f} s = {dbg / eager:.2f}x the eager "
          f"generation ({eager:.2f} s); largest stage peak RSS {peak:.2f} GiB = {peak / w:.2f}x the weights "
          f"({w:.2f} GiB)")


if __name__ == "__main__":
    main()
