"""The reference's XNNPACK 8da4w program of the zoo LLM, for ``bench/bench_lowbit.py`` to time side by side.

Run with the reference's own environment (``executorch==1.5.1`` beside torch 2.13.0 and torchao 0.18.0, see
docs/performance.md) and edgetorch's sources on the path (only ``edgetorch.models.llama`` is imported):

    PYTHONPATH=src /tmp/refvenv/bin/python bench/reference_lowbit.py export --out /tmp/lowbit/ref_8da4w.pte
    PYTHONPATH=src /tmp/refvenv/bin/python bench/reference_lowbit.py time --pte /tmp/lowbit/ref_8da4w.pte

``export``: the same seeded module and torchao config as edgetorch's ``TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR``
(int4 weights in groups of ``--group-size``, int8 dynamic activations, embedding float), prefill (dynamic length)
+ decode sharing the KV cache (``MemoryPlanningPass(share_mutable_buffers=True)``,
``emit_mutable_buffer_names=True``). ``time``: decode ms/token and prefill ms (medians, one thread count per
process), printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def export_reference(out: str, model_name: str, group_size: int) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.utils import unwrap_tensor_subclass

    from edgetorch.models.llama import LLAMA_CONFIGS, build_llama, export_llama

    model = build_llama(LLAMA_CONFIGS[model_name])
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                           weight_granularity=PerGroup(group_size)))
    unwrap_tensor_subclass(model)
    with torch.no_grad():
        eps = export_llama(model)
    edge = to_edge_transform_and_lower(eps, partitioner=[XnnpackPartitioner()],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    et = edge.to_executorch(ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True), emit_mutable_buffer_names=True))
    with open(out, "wb") as f:
        f.write(et.buffer)
    print(json.dumps({"program_mib": os.path.getsize(out) / 2**20}))


def time_reference(pte: str, model_name: str, threads: int, prompt_len: int, runs: int, logits: str | None = None
                   ) -> None:
    from executorch.extension.pybindings import portable_lib

    from edgetorch.models.llama import LLAMA_CONFIGS, example_prompt

    torch.set_num_threads(threads)
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))
    portable_lib._unsafe_reset_threadpool(threads)
    with open(pte, "rb") as f:
        buf = f.read()
    module = portable_lib._load_for_executorch_from_buffer(buf)
    prompt = example_prompt(LLAMA_CONFIGS[model_name], prompt_len)
    pos = torch.arange(prompt_len)
    token, tpos = prompt[:, -1:], torch.tensor([prompt_len])
    module.run_method("prefill", (prompt, pos))

    def median_ms(fn, n: int) -> float:
        fn()
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return 1000 * statistics.median(samples)

    decode = median_ms(lambda: module.run_method("decode", (token, tpos)), runs)
    prefill = median_ms(lambda: module.run_method("prefill", (prompt, pos)), max(3, runs // 3))
    if logits:  # the decode step's logits after the prompt, for the caller's SQNR against float
        module.run_method("prefill", (prompt, pos))
        torch.save(module.run_method("decode", (token, tpos))[0], logits)
    print(json.dumps({"threads": threads, "decode_ms": decode, "prefill_ms": prefill}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["export", "time"])
    ap.add_argument("--model", default="llama_100m")
    ap.add_argument("--out", default="/tmp/edgetorch-lowbit/ref_8da4w.pte")
    ap.add_argument("--pte", default="/tmp/edgetorch-lowbit/ref_8da4w.pte")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--logits", default=None, help="time: save the decode logits after the prompt here")
    args = ap.parse_args()
    if args.action == "export":
        export_reference(args.out, args.model, args.group_size)
    else:
        time_reference(args.pte, args.model, args.threads, args.prompt, args.runs, args.logits)


if __name__ == "__main__":
    main()
