"""Multi-sample numeric gaps: N inputs streamed through the runtime + tracer + Inspector against N x the cost of
one sample, and the peak memory of each (each measured in a fresh process).

The single-sample cost is the ordinary debugging flow for one input: load the program with an ETDump tracer and
a debug buffer, run it, write the ETDump and buffer, build the Inspector and compute the gap table.
The N-sample cost is ``numeric_gap_over_samples`` over N inputs (one program load, one sample's intermediates
in memory at a time). Export and ETRecord building are done once, before either clock starts; the single sample
is timed before and after the N samples and averaged (the machine's load may change meanwhile).

    python bench/bench_multisample.py                        # ViT-B/16, 32 inputs, portable
    python bench/bench_multisample.py --model vit_tiny --samples 8 --backend ort
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def _prepare(model_name: str, backend: str, folder: str) -> None:
    import torch

    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.models import get_model

    model, inputs = get_model(model_name)
    part = None
    if backend == "ort":
        from edgetorch.backends.onnxruntime import OrtPartitioner

        part = [OrtPartitioner()]
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=part,
                                     generate_etrecord=True).to_executorch()
    et.save(os.path.join(folder, "model.pte"))
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    rec.save(os.path.join(folder, "etrecord.bin"))
    torch.save(inputs, os.path.join(folder, "inputs.pt"))


def _samples(folder: str, n: int) -> list[tuple]:
    import torch

    (x,) = torch.load(os.path.join(folder, "inputs.pt"))
    g = torch.Generator().manual_seed(0)
    return [(x,)] + [(torch.randn(x.shape, generator=g),) for _ in range(n - 1)]


def _single(folder: str) -> dict:
    from edgetorch.devtools import Inspector
    from edgetorch.devtools.etrecord import parse_etrecord
    from edgetorch.runtime import Runtime

    rec = parse_etrecord(os.path.join(folder, "etrecord.bin"))
    (sample,) = _samples(folder, 1)
    t0 = time.perf_counter()
    program = Runtime.get().load_program(os.path.join(folder, "model.pte"), enable_etdump=True,
                                         debug_buffer_size="auto")
    program.load_method("forward").execute(*sample)
    dump, dbg = os.path.join(folder, "one.etdp"), os.path.join(folder, "one_debug.bin")
    program.write_etdump_result_to_file(dump, dbg)
    df = Inspector(etdump_path=dump, etrecord=rec, debug_buffer_path=dbg).calculate_numeric_gap("MSE",
                                                                                                 inputs=sample)
    return {"seconds": time.perf_counter() - t0, "rows": len(df)}


def _many(folder: str, n: int) -> dict:
    from edgetorch.devtools.etrecord import parse_etrecord
    from edgetorch.devtools.inspector.inspector import numeric_gap_over_samples

    rec = parse_etrecord(os.path.join(folder, "etrecord.bin"))
    samples = _samples(folder, n)
    t0 = time.perf_counter()
    last = [t0]

    def progress(msg: str) -> None:
        now = time.perf_counter()
        print(f"  [{now - t0:7.1f}s] {msg} ({now - last[0]:.1f}s)", file=sys.stderr, flush=True)
        last[0] = now

    df = numeric_gap_over_samples(rec, os.path.join(folder, "model.pte"), iter(samples), progress=progress)
    return {"seconds": time.perf_counter() - t0, "rows": len(df), "samples": df.attrs["samples"],
            "rank_stability": df.attrs["rank_stability"]}


def _child(stage: str, folder: str, n: int) -> dict:
    out = _single(folder) if stage == "single" else _many(folder, n)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _spawn(stage: str, folder: str, n: int) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", stage, "--folder", folder, "--samples", str(n)],
                       stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--backend", default="portable", choices=["portable", "ort"])
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.folder, args.samples)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-multisample-") as folder:
        t0 = time.perf_counter()
        print(f"[1/3] exporting {args.model} ({args.backend}) with its ETRecord", flush=True)
        _prepare(args.model, args.backend, folder)
        print(f"[2/4] one sample, the ordinary flow ({time.perf_counter() - t0:.1f}s)", flush=True)
        before = _spawn("single", folder, 1)
        print(f"      {before['seconds']:.2f} s, peak RSS {before['peak_rss_mb']:.0f} MiB, {before['rows']} rows",
              flush=True)
        print(f"[3/4] {args.samples} samples streamed ({time.perf_counter() - t0:.1f}s)", flush=True)
        many = _spawn("many", folder, args.samples)
        print(f"      {many['seconds']:.2f} s, peak RSS {many['peak_rss_mb']:.0f} MiB, {many['rows']} rows, "
              f"rank stability {many['rank_stability']:.2f}", flush=True)
        print(f"[4/4] one sample again (the machine's load may have changed) ({time.perf_counter() - t0:.1f}s)",
              flush=True)
        after = _spawn("single", folder, 1)
        print(f"      {after['seconds']:.2f} s", flush=True)
    one = {"seconds": (before["seconds"] + after["seconds"]) / 2,
           "peak_rss_mb": max(before["peak_rss_mb"], after["peak_rss_mb"])}
    ratio = many["seconds"] / one["seconds"]
    print(f"{args.model} {args.backend}: {args.samples} samples {many['seconds']:.1f} s = {ratio:.1f} x one sample "
          f"({one['seconds']:.2f} s; target <= {args.samples} x); peak RSS {many['peak_rss_mb']:.0f} MiB vs "
          f"{one['peak_rss_mb']:.0f} MiB for one sample")
    return 0


if __name__ == "__main__":
    sys.exit(main())
