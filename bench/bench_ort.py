"""The onnxruntime delegate: latency vs ONNX Runtime used directly and vs eager, lowering time, debug-run cost.

Usage: python bench/bench_ort.py [--models vit_b_16 resnet18] [--runs N]

For each model, fully delegated with ``OrtPartitioner()``:
* lowering time (export -> to_edge_transform_and_lower -> to_executorch), first in the process (the torchlib
  registry is built once per process, ~1-3 s) and again;
* at 1 thread and the default thread count, medians: ``Method.execute`` of the lowered program ("edgetorch")
  alternated with the same model exported whole by ``torch.onnx.export(model, dynamo=True)`` and run with
  ``InferenceSession.run`` ("ort_direct", same session options: ORT_ENABLE_ALL, intra-op threads = torch's)
  and with the delegate called through ``session.run`` instead of IOBinding ("edgetorch_run"); then, in a
  separate alternation, edgetorch against eager PyTorch (eager's OpenMP workers spin after its kernels and
  would slow whichever ORT run followed);
* a debug run (ETDump + every delegate intermediate in a fixed in-memory debug buffer, which ORT writes in
  place) vs the plain delegated run, at the default thread count, with the observer-effect check on every
  run (default) and on the first debug run only (``observer_effect="first"``);
* ResNet-18 with relu left to the portable backend (many partitions) with ORT threads spin-waiting or not.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import alternate, thread_settings  # noqa: E402

from edgetorch.backends.onnxruntime import OrtPartitioner  # noqa: E402
from edgetorch.backends.onnxruntime.runtime import set_runtime_options  # noqa: E402
from edgetorch.exir import to_edge_transform_and_lower  # noqa: E402
from edgetorch.models import get_spec  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402


def lower(model: torch.nn.Module, inputs: tuple) -> tuple[object, float]:
    t0 = time.perf_counter()
    ep = torch.export.export(model, inputs)
    et = to_edge_transform_and_lower(ep, partitioner=[OrtPartitioner()]).to_executorch()
    return et, time.perf_counter() - t0


def export_direct(model: torch.nn.Module, inputs: tuple) -> bytes:
    """The whole model exported by ``torch.onnx.export(model, dynamo=True)`` (default optimizations)."""
    return torch.onnx.export(model, inputs, dynamo=True, verbose=False).model_proto.SerializeToString()


def ort_direct(model_bytes: bytes, inputs: tuple, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    # no spin-waiting, as the delegate: spinning threads would slow whichever function runs next here
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run():
        return sess.run(None, {n: x.numpy() for n, x in zip(names, inputs)})
    return run


def bench_model(name: str, runs: int) -> list[str]:
    spec = get_spec(name)
    model = spec.build()
    inputs = spec.example_inputs()["forward"]
    et, t_first = lower(model, inputs)
    et, t_again = lower(model, inputs)
    lines = [f"{name}: lowering to ORT {t_first:.2f}s (first in process), {t_again:.2f}s (again); "
             f".pte {et.size / 2**20:.1f} MB"]
    buf = et.buffer
    direct_model = export_direct(model, inputs)
    default = torch.get_num_threads()
    for threads in thread_settings():
        torch.set_num_threads(threads)
        method = Runtime.get().load_program(buf).load_method("forward")
        handle = next(iter(method._delegate_handles.values()))
        delegate_in = [method.value(v) for v in method.plan.inputs]
        direct = ort_direct(direct_model, inputs, threads)
        out = method.execute(*inputs)
        ref = model(*inputs).detach()
        err = ((out[0] if isinstance(out, (list, tuple)) else out) - ref).abs().max().item() / ref.abs().max().item()
        outs = [torch.empty_like(ref)]

        # ORT against ORT, then edgetorch against eager: eager's OpenMP threads spin-wait after each of its
        # kernels and would slow whichever ORT run followed it (not a cost a deployed program pays)
        with torch.no_grad():
            med = alternate({
                "edgetorch": lambda: method.execute(*inputs),
                "ort_direct": direct,
                "edgetorch_run": lambda: handle.run_without_binding(delegate_in, outs),
            }, runs)
            med_e = alternate({"edgetorch": lambda: method.execute(*inputs), "eager": lambda: model(*inputs)},
                              runs)
        ms = {k: 1000 * v for k, v in med.items()}
        lines.append(f"  threads={threads}: edgetorch {ms['edgetorch']:.2f} ms, ort_direct {ms['ort_direct']:.2f} ms "
                     f"(ratio {med['edgetorch'] / med['ort_direct']:.3f}); delegate via session.run "
                     f"{ms['edgetorch_run']:.2f} ms; vs eager: edgetorch {1000 * med_e['edgetorch']:.2f} ms, eager "
                     f"{1000 * med_e['eager']:.2f} ms (ratio {med_e['edgetorch'] / med_e['eager']:.3f}); "
                     f"max rel err vs eager {err:.1e}")
    torch.set_num_threads(default)
    plain = Runtime.get().load_program(buf).load_method("forward")
    probe = Runtime.get().load_program(buf, enable_etdump=True, debug_buffer_size="auto")
    probe.load_method("forward").execute(*inputs)
    run_bytes = probe.tracer.sink.used_bytes
    del probe
    debug: dict[str, tuple] = {}
    for mode in ("every", "first"):
        set_runtime_options(observer_effect=mode)
        # a fixed in-memory buffer for 2 runs, rewound after each run (steady state: no page faults)
        prog = Runtime.get().load_program(buf, enable_etdump=True, debug_buffer_size=2 * run_bytes + (1 << 20))
        m = prog.load_method("forward")
        m.execute(*inputs)  # first traced run: builds the profiling and the exposing sessions
        prog.tracer.clear()
        debug[mode] = (prog, m)
    set_runtime_options(observer_effect=None)

    def debug_run(mode: str) -> None:
        prog, m = debug[mode]
        m.execute(*inputs)
        prog.tracer.clear()

    with torch.no_grad():
        med = alternate({"plain": lambda: plain.execute(*inputs), "every": lambda: debug_run("every"),
                         "first": lambda: debug_run("first")}, max(runs // 2, 3))
    h = next(iter(debug["every"][1]._delegate_handles.values()))
    lines.append(f"  debug run, all {len(h.intermediates)} delegate intermediates ({run_bytes / 2**20:.0f} MB/run), "
                 f"threads={default}: plain {1000 * med['plain']:.2f} ms; observer check every run "
                 f"{1000 * med['every']:.2f} ms (ratio {med['every'] / med['plain']:.2f}, observer effect "
                 f"{h.last_observer_effect:.1e}); observer check on the first run only {1000 * med['first']:.2f} ms "
                 f"(ratio {med['first'] / med['plain']:.2f})")
    stats = h.header["stats"]
    lines.append(f"  debug tables: {stats}")
    return lines


def bench_spinning(runs: int) -> list[str]:
    """ResNet-18 with relu left to the portable backend (17 ORT partitions, torch kernels between them), ORT
    threads spin-waiting or not, at the default thread count, each against eager. The spinning variant is
    measured last: its threads keep spinning after its runs and would slow anything alternated with it."""
    spec = get_spec("resnet18")
    model = spec.build()
    inputs = spec.example_inputs()["forward"]
    out = []
    for spin in (False, True):
        part = OrtPartitioner(exclude_ops=["aten.relu.default"], allow_spinning=spin)
        et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[part]).to_executorch()
        m = Runtime.get().load_program(et.buffer).load_method("forward")
        with torch.no_grad():
            med = alternate({"edgetorch": lambda m=m: m.execute(*inputs), "eager": lambda: model(*inputs)}, runs)
        out.append(f"spin={spin} {1000 * med['edgetorch']:.1f} ms vs eager {1000 * med['eager']:.1f} ms (ratio "
                   f"{med['edgetorch'] / med['eager']:.2f})")
    return [f"resnet18, relu on the portable backend (17 ORT partitions), threads={torch.get_num_threads()}: "
            + "; ".join(out)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=["vit_b_16", "resnet18"])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    for name in args.models:
        for line in bench_model(name, args.runs):
            print(line, flush=True)
    if torch.get_num_threads() > 1:
        for line in bench_spinning(args.runs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
