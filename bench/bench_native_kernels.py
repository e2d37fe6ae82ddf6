"""The portable backend's int4 kernels, one linear at a time: the native kernels (``edgetorch.runtime.native``)
against the torch-only ones they replace, alternating in one process, medians, hot cache.

    python bench/bench_native_kernels.py [--threads 1,2] [--runs 30]

Rows: dequantization to bfloat16 (the prefill's GEMM operand; native vs torch ops, same bits), the 8da4w
matrix-vector product (native VNNI from the packed bytes vs ``_weight_int4pack_mm_for_cpu`` on its cached CPU
layout with bf16 activations) and the weight-only float one, for llama_100m's weight shapes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from edgetorch.runtime import lowbit, native  # noqa: E402

SHAPES = [(2048, 768), (768, 2048), (768, 768), (32000, 768)]  # llama_100m: w1/w3, w2, wq/wo, LM head


def alternate(calls: dict, runs: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in calls}
    for f in calls.values():
        f()
    for _ in range(runs):
        for k, f in calls.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: 1000 * statistics.median(v) for k, v in times.items()}


def one_shape(kernels: native.NativeKernels, n: int, k: int, group: int, rows: int, runs: int) -> None:
    g = torch.Generator().manual_seed(0)
    packed = lowbit.pack_int4(torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8))
    scales = (torch.rand(n, k // group, generator=g) * 0.02 + 1e-3).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=g)
    threads = torch.get_num_threads()
    out = torch.empty(n, k, dtype=torch.bfloat16)
    cpu, sz, kg = lowbit._cpu_int4(packed, scales, group)
    xb = x.to(torch.bfloat16)
    xu, ts, zp, y = torch.empty(rows, k, dtype=torch.uint8), torch.empty(rows), torch.empty(rows), torch.empty(rows, n)

    def vnni() -> None:
        kernels.quantize_rows(x.data_ptr(), rows, k, xu.data_ptr(), ts.data_ptr(), zp.data_ptr())
        kernels.q8q4_gemv(xu.data_ptr(), rows, ts.data_ptr(), zp.data_ptr(), packed.data_ptr(), scales.data_ptr(),
                          n, k, group, y.data_ptr(), threads)

    calls = {
        "dequant native": lambda: kernels.dequant_bf16(packed.data_ptr(), scales.data_ptr(), n, k, group,
                                                       out.data_ptr(), threads),
        "dequant torch": lambda: _torch_dequant(packed, scales, group, out),
        "gemv float native": lambda: kernels.gemv_f32(x.data_ptr(), rows, packed.data_ptr(), scales.data_ptr(), n, k,
                                                      group, y.data_ptr(), threads),
        "gemv int4pack torch": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, cpu, kg, sz),
    }
    if kernels.has_vnni:
        calls["gemv 8da4w VNNI native"] = vnni
    res = alternate(calls, runs)
    print(f"  {n}x{k} g{group} rows={rows}: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in res.items()),
          flush=True)


def _torch_dequant(packed: torch.Tensor, scales: torch.Tensor, group: int, out: torch.Tensor) -> torch.Tensor:
    real = native.kernels
    native.kernels = lambda: None  # the torch-only dequantization
    try:
        return lowbit._dequant_bf16(packed, scales, group, out)
    finally:
        native.kernels = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rows", default="1,4")
    args = ap.parse_args()
    kernels = native.kernels()
    print(f"{native.status()}; load {os.getloadavg()}", flush=True)
    if kernels is None:
        return
    for t in (int(v) for v in args.threads.split(",")):
        torch.set_num_threads(t)
        print(f"threads={t}")
        for n, k in SHAPES:
            for rows in (int(r) for r in args.rows.split(",")):
                one_shape(kernels, n, k, 32, rows, args.runs)


if __name__ == "__main__":
    main()
