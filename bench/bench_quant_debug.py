"""Quantization debugging against the float model (issue 15): cost, planted-culprit detection, selective fallback.

Three measurements on INT8 (PT2E, static, per-channel weights) ResNet-18, MobileNetV2, the zoo's transformer
encoder and a small-config Hugging Face BERT (random weights), portable and ONNX Runtime:

1. cost: the per-float-op table (``calculate_numeric_gap(reference_graph="float")`` over N samples) in multiples
   of one float eager forward per sample (medians of interleaved runs, one thread): ``per_sample_x``, a table
   that runs the float and the local pass (the float values kept by an earlier table forgotten first);
   ``warm_x``, a later table of the same Inspector (the float values of the recorded samples kept: only the
   local pass runs); ``cold_total_x``, the very first table of an Inspector built on the saved files (ETRecord,
   ETDump, debug buffer), which also loads the float program and maps it (in float forwards of all N samples;
   median over fresh Inspectors); ``inspector_x``, building that Inspector (parsing the ETDump and the
   ETRecord), not counted in the table. Target: <= 3x. ``*_cpu_x``: the same ratios in
   the thread's CPU time (``time.thread_time``), which other jobs on a busy machine disturb much less than
   wall time (every timed function runs on this thread: one torch thread).
2. planted bad layer: one layer's int8 weight re-quantized with an 8x larger scale (``coarsen_weight``: 3 bits of
   precision lost), then is it the top culprit (lowest local SQNR)? Target: >= 95 % of plants.
3. selective fallback on the model where INT8 loses most: the INT8 program of every model (portable, the
   recipe's defaults: bias correction on) is run on held-out samples (another seed than the calibration ones)
   and its cosine to the float model printed; the lowest one is chosen (or ``--fallback-model``). Keeping 1..3
   layers in float (blocks chosen on ``--select-samples`` samples of a third seed), the share of the lost cosine
   recovered and the latency paid. Target: >= 50 %.

    python bench/bench_quant_debug.py                           # everything (tens of minutes on 2 cores)
    python bench/bench_quant_debug.py --models bert,transformer_encoder --plants 2 --backends portable
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import alternate  # noqa: E402

from edgetorch.devtools.inspector.float_reference import (
    float_numeric_gap,
    rank_quantization_culprits,
)
from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, export
from edgetorch.export.quantizer import SymmetricInt8Quantizer, SymmetricQuantizationConfig
from edgetorch.workflows.quant_fallback import (
    coarsen_weight,
    cosine_to_float,
    inspect_quantized,
    quantize_pt2e_program,
    record_debug_runs,
    selective_fallback,
)

RECIPES = {"portable": PortableRecipeType.INT8_STATIC_PER_CHANNEL, "onnxruntime": OrtRecipeType.INT8_STATIC_PER_CHANNEL}
WEIGHTED = {"aten.conv1d.default", "aten.conv2d.default", "aten.linear.default"}


def build(name: str, n: int, seed: int) -> tuple[torch.nn.Module, list[tuple]]:
    g = torch.Generator().manual_seed(seed)
    if name == "bert":
        import transformers

        torch.manual_seed(0)
        model = transformers.BertModel(transformers.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
        return model.eval(), [(torch.randint(0, 100, (1, 12), generator=g), torch.ones(1, 12, dtype=torch.long))
                              for _ in range(n)]
    from edgetorch.models import get_spec

    spec = get_spec(name)
    model, x = spec.build().eval(), spec.example_inputs()["forward"]
    if x[0].dtype == torch.int64:
        return model, [(torch.randint(0, 1000, x[0].shape, generator=g),) for _ in range(n)]
    return model, [(torch.randn(x[0].shape, generator=g),) for _ in range(n)]


def partitioner(backend: str) -> list:
    if backend == "portable":
        return []
    from edgetorch.backends.onnxruntime import OrtPartitioner

    return [OrtPartitioner()]


def cost(name: str, backend: str, model: torch.nn.Module, samples: list[tuple], repeats: int) -> dict:
    from edgetorch.devtools import Inspector

    session = export(model, samples, ExportRecipe.get_recipe(RECIPES[backend]), generate_etrecord=True)
    et = session.get_executorch_program_manager()

    def forward() -> None:
        with torch.no_grad():
            for s in samples:
                model(*s)

    with tempfile.TemporaryDirectory() as d:
        paths, outputs = record_debug_runs(et, samples, d)

        def cold() -> tuple[dict[str, float], Inspector]:
            """The very first table of an Inspector on the saved files (parses the ETRecord, maps the float
            program): wall and thread-CPU seconds, and those of building the Inspector itself."""
            t0, c0 = time.perf_counter(), time.thread_time()
            inspector = Inspector(etdump_path=paths[1], etrecord=paths[0], debug_buffer_path=paths[2])
            t1, c1 = time.perf_counter(), time.thread_time()
            float_numeric_gap(inspector, "MSE")
            return {"table": time.perf_counter() - t1, "table_cpu": time.thread_time() - c1,
                    "inspector": t1 - t0, "inspector_cpu": c1 - c0}, inspector

        inspector = cold()[1]
        table = float_numeric_gap(inspector, "MSE")

        def first() -> None:
            inspector.float_reference.drop_float_values()
            float_numeric_gap(inspector, "MSE")

        fns = {"float": forward, "table": first, "warm": lambda: float_numeric_gap(inspector, "MSE")}
        t, c = alternate(fns, repeats), alternate(fns, repeats, clock=time.thread_time)
        colds = [cold()[0] for _ in range(repeats)]
    med = {k: statistics.median(x[k] for x in colds) for k in ("table", "table_cpu", "inspector", "inspector_cpu")}
    n = len(samples)
    return {"model": name, "backend": backend, "rows": len(table), "samples": n,
            "float_forward_ms": t["float"] / n * 1e3, "table_ms_per_sample": t["table"] / n * 1e3,
            "per_sample_x": t["table"] / t["float"], "warm_x": t["warm"] / t["float"],
            "cold_total_x": med["table"] / t["float"], "per_sample_cpu_x": c["table"] / c["float"],
            "warm_cpu_x": c["warm"] / c["float"], "cold_total_cpu_x": med["table_cpu"] / c["float"],
            "inspector_x": med["inspector"] / t["float"], "inspector_cpu_x": med["inspector_cpu"] / c["float"],
            "cosine": cosine_to_float(model, samples, outputs),
            "top3": [ops[0] for ops in rank_quantization_culprits(table, 3)["aot_ops"]]}


def plant_targets(model: torch.nn.Module, samples: list[tuple], k: int) -> list[str]:
    """``k`` weighted layers spread over the model (first and last excluded when there are enough)."""
    ep = torch.export.export(model, samples[0])
    names = [n.name for n in ep.graph.nodes if n.op == "call_function" and str(n.target) in WEIGHTED]
    inner = names[1:-1] if len(names) > k + 2 else names
    step = len(inner) / k
    return [inner[int(i * step + step / 2)] for i in range(k)]


def plants(name: str, backend: str, model: torch.nn.Module, samples: list[tuple], k: int) -> list[dict]:
    out = []
    for layer in plant_targets(model, samples, k):
        quantizer = SymmetricInt8Quantizer(SymmetricQuantizationConfig(per_channel=True))
        et = quantize_pt2e_program(model, samples, quantizer, partitioner(backend),
                                   edit=lambda gm, layer=layer: coarsen_weight(gm, layer, 8.0))
        table = inspect_quantized(et, samples).table
        top = rank_quantization_culprits(table, 3)
        found = [ops[0] for ops in top["aot_ops"]]
        out.append({"model": name, "backend": backend, "planted": layer, "top": found[0] if found else None,
                    "hit": bool(found) and found[0] == layer, "top3": found})
        print(json.dumps(out[-1]), flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="resnet18,mobilenet_v2,transformer_encoder,bert")
    ap.add_argument("--backends", default="portable,onnxruntime")
    ap.add_argument("--samples", type=int, default=4, help="calibration samples, also the debugged runs")
    ap.add_argument("--plants", type=int, default=3, help="planted bad layers per model and backend")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing repeats")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on a shared machine)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: cost, plants, fallback")
    ap.add_argument("--fallback-model", default=None, help="default: the model whose INT8 loses most")
    ap.add_argument("--select-samples", type=int, default=16,
                    help="samples (a third seed) the fallback chooses its blocks on; 0: the calibration samples")
    ap.add_argument("--max-layers", type=int, default=3, help="fallback steps (layers kept float)")
    ap.add_argument("--shortlist", type=int, default=12, help="best single blocks the greedy fallback considers")
    ap.add_argument("--activation-observer", default="minmax", choices=("minmax", "histogram"),
                    help="activation observer of the INT8 cosines and the fallback")
    ap.add_argument("--no-bias-correction", action="store_true",
                    help="INT8 cosines and fallback without the recipe's bias correction")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # ORT's observer-effect warnings: the debug run unfuses, expected here
    skip = set(filter(None, args.skip.split(",")))
    models = args.models.split(",")
    backends = args.backends.split(",")
    result: dict = {"costs": [], "plants": []}
    for name in models:
        model, samples = build(name, args.samples, 0)
        for backend in backends:
            if "cost" not in skip:
                result["costs"].append(cost(name, backend, model, samples, args.repeats))
                print(json.dumps(result["costs"][-1]), flush=True)
            if "plants" not in skip and args.plants:
                result["plants"] += plants(name, backend, model, samples, args.plants)
    if result["plants"]:
        hits = sum(p["hit"] for p in result["plants"])
        result["plant_hit_rate"] = hits / len(result["plants"])
        print(f"planted bad layer is the top culprit: {hits}/{len(result['plants'])}", flush=True)
    if "fallback" not in skip:
        result["fallback"] = fallback(args, models)
    return result


def int8_cosine(name: str, args: argparse.Namespace, options: dict) -> float:
    """The portable INT8 program's cosine to the float model on held-out samples (seed 1), calibrated on
    ``args.samples`` samples (seed 0)."""
    from edgetorch.runtime import Runtime

    model, samples = build(name, args.samples, 0)
    _, held_out = build(name, args.samples, 1)
    pte = export(model, samples, ExportRecipe.get_recipe(RECIPES["portable"], **options)).get_pte_buffer()
    method = Runtime.get().load_program(pte).load_method("forward")
    return cosine_to_float(model, held_out, [method.execute(*s) for s in held_out])


def fallback(args: argparse.Namespace, models: list[str]) -> dict:
    options = {"activation_observer": args.activation_observer, "bias_correction": not args.no_bias_correction}
    cosines = {}
    for m in ([args.fallback_model] if args.fallback_model else models):
        cosines[m] = int8_cosine(m, args, options)
        print(json.dumps({"model": m, "int8_cosine_held_out": cosines[m], **options}), flush=True)
    name = min(cosines, key=cosines.__getitem__)
    print(f"the model where INT8 loses most: {name} (cosine {cosines[name]:.6f})" if not args.fallback_model
          else f"fallback model (--fallback-model): {name}", flush=True)
    model, samples = build(name, args.samples, 0)
    _, held_out = build(name, args.samples, 1)
    select = build(name, args.select_samples, 2)[1] if args.select_samples else None
    report = selective_fallback(model, samples, RECIPES["portable"], max_layers=args.max_layers,
                                eval_samples=held_out, latency_repeats=5, select_samples=select,
                                shortlist=args.shortlist, **options)
    steps = report.steps
    print(f"selective fallback on {name} (portable; blocks chosen on {len(select or samples)} "
          f"{'selection' if select else 'calibration'} samples, cosine on {len(held_out)} held-out samples):")
    print(report.culprits[["layer", "kept_float", "float_activations", "simulated_cosine"]].to_string(index=False))
    print(steps[["step", "kept_float", "cosine", "accuracy_recovered", "latency_ms", "latency_vs_int8",
                 "latency_vs_float"]].to_string(index=False), flush=True)
    return {"model": name, "int8_cosines": cosines, "options": options,
            "steps": json.loads(steps.to_json(orient="records")), "float_latency_ms": report.float_latency_ms}


if __name__ == "__main__":
    main()
