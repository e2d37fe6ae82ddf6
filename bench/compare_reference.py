"""edgetorch against the reference (ExecuTorch + XNNPACK) and eager PyTorch, one process per model and precision.

Usage: python bench/compare_reference.py [--models resnet18 mobilenet_v2 vit_b_16] [--precisions fp32 int8]
       [--threads 1 2] [--runs 15] [--skip-portable]

Each (model, precision) runs in a fresh child process, which builds, from the same weights and inputs:
* eager PyTorch (float: the denominator of every ratio);
* edgetorch portable (``PortableRecipeType.FP32`` / ``INT8_STATIC_PER_CHANNEL``);
* edgetorch + ONNX Runtime (``OrtRecipeType.FP32`` / ``INT8_STATIC_PER_CHANNEL``);
* the reference with XNNPACK (``XNNPackRecipeType.FP32`` / ``PT2E_INT8_STATIC_PER_CHANNEL``), when ``executorch``
  is importable: ``pip install -e '.[reference]' && pip install --no-deps executorch==1.5.1`` (its own pins
  would replace torch 2.13.0).
INT8 programs are calibrated on the same 8 samples. Per thread count (1 thread: the process is pinned to one
core), medians of alternating runs: ORT against XNNPACK in one alternation (the figure that matters), portable
against eager in another (eager's OpenMP workers spin after its kernels and would slow an ORT run that followed).
INT8 accuracy: cosine similarity of each program's output to the float model's, over 8 held-out inputs.
Without ``executorch`` the reference columns are left out.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import alternate  # noqa: E402

CALIBRATION = 8
HELD_OUT = 8


def _samples(example: tuple, n: int, seed: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(x.shape, generator=g, dtype=x.dtype) if x.is_floating_point() else x
                  for x in example) for _ in range(n)]


def _edgetorch(model, calib: list[tuple], recipe_type) -> tuple[bytes, float]:
    from edgetorch.export import ExportRecipe, export

    t0 = time.perf_counter()
    buf = export(model, calib, ExportRecipe.get_recipe(recipe_type)).get_pte_buffer()
    return buf, time.perf_counter() - t0


def _load(buf: bytes):
    """A callable over the program's forward; ORT sizes its thread pool from torch's thread count at load."""
    from edgetorch.runtime import Runtime

    method = Runtime.get().load_program(buf).load_method("forward")
    return lambda *xs: method.execute(*xs)[0]


def _reference(model, calib: list[tuple], precision: str) -> tuple[bytes, float] | None:
    try:
        from executorch.backends.xnnpack.recipes.xnnpack_recipe_types import XNNPackRecipeType
        from executorch.export import ExportRecipe, export
        from executorch.extension.pybindings import portable_lib  # noqa: F401 - the runtime must be there too
    except ImportError:
        return None
    kind = XNNPackRecipeType.FP32 if precision == "fp32" else XNNPackRecipeType.PT2E_INT8_STATIC_PER_CHANNEL
    t0 = time.perf_counter()
    buf = export(model, calib, ExportRecipe.get_recipe(kind)).get_pte_buffer()
    return buf, time.perf_counter() - t0


def _load_reference(buf: bytes):
    """A callable over the reference program (loaded after its thread pool is reset: resetting the pool under a
    loaded XNNPACK program aborted in glibc's ``__pthread_tpp_change_priority``)."""
    from executorch.extension.pybindings import portable_lib

    module = portable_lib._load_for_executorch_from_buffer(buf)  # does not copy: keep `buf` alive with it
    return lambda *xs, _keep=buf: module.forward(xs)[0]


def _openvino(ort_buf: bytes, threads: int):
    """OpenVINO (``--openvino``) on the ONNX model of the ORT program's one delegate (the exported model, weights
    inlined; f32 inference), or None when openvino is missing or the program is not one delegate call."""
    try:
        import onnx
        import onnx.inliner
        import openvino as ov
    except ImportError:
        return None
    from edgetorch.runtime import Runtime

    method = Runtime.get().load_program(ort_buf).load_method("forward")
    handles = list(method._delegate_handles.values())
    if len(handles) != 1 or len(method._plan.instructions) != 1:
        return None
    h = handles[0]
    proto = onnx.ModelProto()
    proto.ParseFromString(h._model_bytes)
    for t in proto.graph.initializer:
        if t.name in h._arrays:
            t.raw_data = h._arrays[t.name].tobytes()
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
    proto = onnx.shape_inference.infer_shapes(onnx.inliner.inline_local_functions(proto))
    core = ov.Core()
    compiled = core.compile_model(core.read_model(proto.SerializeToString(), b""), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32"})
    req = compiled.create_infer_request()

    def run(*xs):
        req.infer([x.numpy() for x in xs], share_inputs=True)
        return torch.from_numpy(req.get_output_tensor(0).data.copy())
    return run


ALL_CPUS = sorted(os.sched_getaffinity(0))


def _set_threads(n: int) -> None:
    torch.set_num_threads(n)
    os.sched_setaffinity(0, set(ALL_CPUS[:n]))
    try:
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(n)
    except ImportError:
        pass


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def child(model_name: str, precision: str, threads: list[int], runs: int, portable: bool = True,
          openvino: bool = False, ort_options: dict[str, str] | None = None) -> dict:
    from edgetorch.backends.onnxruntime.runtime import set_runtime_options
    from edgetorch.export import OrtRecipeType, PortableRecipeType

    set_runtime_options(**(ort_options or {}))
    from edgetorch.models import get_spec

    spec = get_spec(model_name)
    model = spec.build().eval()
    example = spec.example_inputs()["forward"]
    calib = [example] + _samples(example, CALIBRATION - 1, seed=1)
    held = _samples(example, HELD_OUT, seed=2)
    int8 = precision == "int8"
    result: dict = {"model": model_name, "precision": precision, "export_s": {}, "ms": {}, "cosine": {}}
    bufs = {}
    kinds = {"portable": PortableRecipeType.INT8_STATIC_PER_CHANNEL if int8 else PortableRecipeType.FP32,
             "ort": OrtRecipeType.INT8_STATIC_PER_CHANNEL if int8 else OrtRecipeType.FP32}
    if not portable:
        del kinds["portable"]
    for name, kind in kinds.items():
        bufs[name], result["export_s"][name] = _edgetorch(model, calib, kind)
    fns = {name: _load(buf) for name, buf in bufs.items()}
    ref = _reference(model, calib, precision)
    if ref is not None:
        bufs["xnnpack"], result["export_s"]["xnnpack"] = ref
        fns["xnnpack"] = _load_reference(bufs["xnnpack"])
    if openvino and _openvino(bufs["ort"], threads[0]) is not None:
        fns["openvino"] = _openvino(bufs["ort"], threads[0])
    with torch.no_grad():
        fns["eager"] = lambda *xs: model(*xs)
        want = [model(*x) for x in held]
        for name, f in fns.items():
            result["cosine"][name] = min(_cosine(f(*x), w) for x, w in zip(held, want))
        for n in threads:
            _set_threads(n)
            fns["ort"] = _load(bufs["ort"])  # its thread pool is sized at load
            if "xnnpack" in bufs:
                fns["xnnpack"] = _load_reference(bufs["xnnpack"])
            if "openvino" in fns:
                fns["openvino"] = _openvino(bufs["ort"], n)
            fast = {k: (lambda f=fns[k]: f(*example)) for k in ("ort", "xnnpack", "openvino") if k in fns}
            slow = {k: (lambda f=fns[k]: f(*example)) for k in ("portable", "eager") if k in fns}
            med = {**alternate(fast, runs), **alternate(slow, runs)}
            result["ms"][str(n)] = {k: 1000 * v for k, v in med.items()}
    return result


def _table(results: list[dict]) -> str:
    lines = ["| model | precision | threads | eager ms | portable | ORT | XNNPACK | ORT / XNNPACK | cosine ORT | "
             "cosine XNNPACK |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for n, ms in r["ms"].items():
            e = ms["eager"]
            x = ms.get("xnnpack")
            ratio = f"{ms['ort'] / x:.3f}" if x else "-"
            lines.append(
                f"| {r['model']} | {r['precision']} | {n} | {e:.1f} | {ms.get('portable', float('nan')) / e:.3f} | "
                f"{ms['ort'] / e:.3f} | "
                f"{(x / e) if x else float('nan'):.3f} | {ratio} | {r['cosine'].get('ort', float('nan')):.5f} | "
                f"{r['cosine'].get('xnnpack', float('nan')):.5f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "vit_b_16"])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "int8"], choices=["fp32", "int8"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--skip-portable", action="store_true", help="leave edgetorch portable out (its INT8 is slow)")
    ap.add_argument("--openvino", action="store_true",
                    help="also time OpenVINO on the ORT delegate's ONNX model (needs `pip install openvino`)")
    ap.add_argument("--ort-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an ORT delegate runtime option for the edgetorch ORT program, e.g. allow_spinning=1 "
                         "(see edgetorch.backends.onnxruntime.set_runtime_options); repeatable")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "PRECISION"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    ort_options = dict(o.split("=", 1) for o in args.ort_option)
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args.threads, args.runs, not args.skip_portable,
                                                   args.openvino, ort_options)), flush=True)
        return
    results = []
    for model in args.models:
        for precision in args.precisions:
            print(f"[{model} {precision}] running in a fresh process ...", flush=True)
            cmd = [sys.executable, __file__, "--child", model, precision, "--runs", str(args.runs), "--threads",
                   *map(str, args.threads), *(["--skip-portable"] if args.skip_portable else []),
                   *(["--openvino"] if args.openvino else []),
                   *(f"--ort-option={o}" for o in args.ort_option)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"  failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            results.append(json.loads(line[len("RESULT "):]))
            print(f"  export s: {results[-1]['export_s']}", flush=True)
            if "openvino" in results[-1]["cosine"]:
                for n, ms in results[-1]["ms"].items():
                    print(f"  {n} thread(s): OpenVINO {ms['openvino']:.2f} ms, ORT {ms['ort']:.2f} ms, XNNPACK "
                          f"{ms.get('xnnpack', float('nan')):.2f} ms; cosine OpenVINO "
                          f"{results[-1]['cosine']['openvino']:.5f}", flush=True)
    print(_table(results))


if __name__ == "__main__":
    main()
