"""Planted faults: does ``find_culprits`` name the planted op, and does it name nothing on a clean program?

Each program (a zoo or Hugging Face model from a small config with fixed-seed random weights, portable or ONNX
Runtime) is exported once; then, per plant, the .pte is changed or its runtime patched, run with a debug buffer
and inspected. Plant kinds:

- ``weight``: a weight/constant of one op perturbed in the program file (``W += s * std(W) * N(0, 1)``); in an
  ORT program the weight is an initializer inside the delegate (``initializer``).
- ``kernel``: one kernel made wrong (the runtime's call of one instruction adds ``s * std(out) * N(0, 1)`` to
  its output); in an ORT program, a delegate call's output (the delegate's last op as seen outside it).
- ``input_dep``: an input-dependent kernel fault (only the output elements above its 90th percentile move, by
  ``s * std(out)``).
- ``two``: two weights of different ops perturbed at once (hit: the top culprit is one of them; ``both3``:
  both in the top 3).
- ``quant_outlier``: one layer quantized badly (a weight outlier, 60 x its largest magnitude, ruins its per-tensor
  INT8 scale), the INT8 program compared against the float model (``reference_graph="float"``); ranked by
  ``rank_quantization_culprits`` (lowest local SQNR), the reference's way by largest accumulated gap.

``--fix``: the fix figure instead: quantized ResNet-18 and transformer encoder, each with one badly quantized
layer (and ResNet-18 with two), tolerance 2x (1.25x for two) the final error of the model quantized without them;
``find_fix`` must find and prove the smallest fallback set in at most 5 re-exports (rows: the set, whether it
holds the planted layers, re-exports, final errors, latency and size per step).

``s`` runs over ``--sizes`` (default 1e-2 .. 1e-5 of the tensor's std). A plant is a top-1 hit when the first
culprit is the planted op's row (the most specific row: a ``DELEGATE_CALL`` row counts only for a plant on the
delegate's output), top-3 when it is among the first three; the reference's way sorts every row by accumulated
gap (MSE). ``clean`` counts the culprits named on each unplanted program (target 0).

    python bench/bench_culprits.py                     # every family, portable and ORT
    python bench/bench_culprits.py --families mlp,bert --backends ort --sizes 1e-3
    python bench/bench_culprits.py --fix
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

SIZES = (1e-2, 1e-3, 1e-4, 1e-5)
ZOO = ("mlp", "small_cnn", "resnet18", "mobilenet_v2", "transformer_encoder", "vit_tiny")
HF = ("bert", "gpt2", "llama")


def _hf(name: str) -> tuple[torch.nn.Module, tuple]:
    import transformers as T

    class TupleOut(torch.nn.Module):
        def __init__(self, m: torch.nn.Module) -> None:
            super().__init__()
            self.model = m

        def forward(self, ids: torch.Tensor) -> Any:
            return self.model(ids, use_cache=False, return_dict=False)

    torch.manual_seed(0)
    ids = (torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1)),)
    if name == "bert":
        m = T.BertModel(T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64))
    elif name == "gpt2":
        m = TupleOut(T.GPT2Model(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                              bos_token_id=0, eos_token_id=0)))
    else:
        m = TupleOut(T.LlamaModel(T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                                max_position_embeddings=64)))
    return m.eval(), ids


def build(family: str) -> tuple[torch.nn.Module, tuple]:
    if family in HF:
        return _hf(family)
    from edgetorch.models import get_model

    return get_model(family)


@dataclass
class Program:
    """One exported program: its bytes, ETRecord, ATen program and example inputs."""

    family: str
    backend: str
    pte: bytes
    record: Any
    ep: Any
    inputs: tuple
    consumers: dict[str, set[str]] = field(default_factory=dict)  # parameter name -> ATen nodes reading it


def export(family: str, backend: str) -> Program:
    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.exir import to_edge_transform_and_lower

    model, inputs = build(family)
    ep = torch.export.export(model, inputs)
    part = [OrtPartitioner()] if backend == "ort" else None
    et = to_edge_transform_and_lower(ep, partitioner=part, generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    prog = Program(family, backend, bytes(et.buffer), rec, ep, inputs)
    sig = ep.graph_signature
    names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name in names:
            prog.consumers[names[n.name]] = _readers(n)
    return prog


def _readers(n: torch.fx.Node) -> set[str]:
    """The ops that compute with a parameter: its users, through the views that only select or reshape it
    (a positional embedding sliced then added: the add is the op)."""
    from edgetorch.devtools.inspector.noise import op_noise

    out: set[str] = set()
    for u in n.users:
        out.add(u.name)
        if u.op == "call_function" and op_noise(u, 1.0) == 0.0:
            out |= _readers(u)
    return out


def debug_run(prog: Program, pte: bytes, patch: Callable[[Any], None] | None = None) -> tuple[Any, Any]:
    """Runs ``pte`` with a debug buffer (``patch`` may change the loaded method) and returns (Inspector, gaps)."""
    from edgetorch.devtools import Inspector
    from edgetorch.runtime import Runtime

    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
    method = program.load_method("forward")
    if patch is not None:
        patch(method)
    method.execute(*prog.inputs)
    with tempfile.TemporaryDirectory() as d:
        program.write_etdump_result_to_file(os.path.join(d, "e.etdp"), os.path.join(d, "d.bin"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            insp = Inspector(etdump_path=os.path.join(d, "e.etdp"), etrecord=prog.record,
                             debug_buffer_path=os.path.join(d, "d.bin"))
            df = insp.calculate_numeric_gap("MSE")
    return insp, df


# -- plants --------------------------------------------------------------------------------------------------
def weight_sites(prog: Program, k: int = 3) -> list[str]:
    """``k`` weights (>= 2 dims) spread over the program whose bytes occur exactly once in the file."""
    params = dict(prog.ep.named_parameters())
    cands = [n for n, p in params.items() if p.dim() >= 2 and p.dtype == torch.float32 and n in prog.consumers
             and _find_once(prog.pte, p) is not None]
    return _spread(cands, k)


def _spread(xs: list, k: int) -> list:
    if len(xs) <= k:
        return list(xs)
    return [xs[round(i * (len(xs) - 1) / (k - 1))] for i in range(k)] if k > 1 else [xs[len(xs) // 2]]


def _find_once(data: bytes, t: torch.Tensor) -> int | None:
    raw = t.detach().contiguous().numpy().tobytes()
    at = data.find(raw)
    return at if at >= 0 and data.find(raw, at + 1) == -1 else None


def perturb_weights(prog: Program, names: list[str], s: float, seed: int = 0) -> bytes:
    data = bytearray(prog.pte)
    params = dict(prog.ep.named_parameters())
    for j, name in enumerate(names):
        p = params[name].detach().contiguous()
        at = _find_once(prog.pte, p)
        g = torch.Generator().manual_seed(seed + j)
        new = p + s * p.std() * torch.randn(p.shape, generator=g)
        data[at:at + p.numel() * 4] = new.numpy().astype(np.float32).tobytes()
    _reseal_ort_blobs(data)
    return bytes(data)


def _reseal_ort_blobs(data: bytearray) -> None:
    """Recomputes the payload checksum of every ORT delegate blob in the file (an initializer was changed)."""
    import zlib

    from edgetorch.backends.onnxruntime import _blob

    at = data.find(_blob.MAGIC)
    while at >= 0:
        magic, version, head_len, total, head_crc, _ = _blob._FIXED.unpack_from(data, at)
        start = at + _blob.align(_blob._FIXED.size + head_len)
        crc = zlib.crc32(memoryview(data)[start:at + total])
        data[at:at + _blob._FIXED.size] = _blob._FIXED.pack(magic, version, head_len, total, head_crc, crc)
        at = data.find(_blob.MAGIC, at + total)


def kernel_sites(prog: Program, k: int = 3) -> list[int]:
    """Instructions with a float output: OUT kernels (portable) or delegate calls (ORT), spread, last included."""
    from edgetorch.runtime import Runtime

    method = Runtime.get().load_program(prog.pte).load_method("forward")
    want = "DELEGATE" if prog.backend == "ort" else "OUT"
    ks = []
    for ins in method.instructions:
        if ins.kind != want or not ins.outputs:
            continue
        v = method.value(ins.outputs[0])
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point and v.numel() > 1:
            ks.append(ins.index)
    return _spread(ks, k)


def kernel_patch(k: int, s: float, input_dependent: bool = False, seed: int = 0) -> Callable[[Any], None]:
    def patch(method: Any) -> None:
        call = method._calls[k]
        outs = method.instructions[k].outputs
        g = torch.Generator().manual_seed(seed)

        def wrong() -> Any:
            r = call()
            for vid in outs:
                t = method.value(vid)
                if not (isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel() > 1):
                    continue
                std = t.float().std()
                if input_dependent:
                    q = torch.quantile(t.detach().float().reshape(-1)[:1 << 20], 0.9)
                    t.add_(((t > q) * s * std).to(t.dtype))
                else:
                    t.add_((s * std * torch.randn(t.shape, generator=g)).to(t.dtype))
            return r

        method._calls[k] = wrong
        method._fast = [(i, wrong if i == k else c) for i, c in method._fast]
    return patch


# -- scoring -------------------------------------------------------------------------------------------------
def _hit(row: Any, kind: str, target: Any, prog: Program) -> bool:
    if kind in ("kernel", "input_dep"):
        return int(row["instruction_id"]) == target and (prog.backend == "ort" or row["in_delegate_call"] is None
                                                         or _nan(row["in_delegate_call"]))
    if list(row["runtime_ops"]) == ["DELEGATE_CALL"]:
        return False  # names every op of the delegate: not the op
    names = set(row["aot_ops"])
    return any(names & prog.consumers[t] for t in target)


def _nan(x: Any) -> bool:
    return isinstance(x, float) and x != x


def score(insp: Any, df: Any, kind: str, target: Any, prog: Program) -> dict[str, Any]:
    cul = insp.find_culprits(df, top=3)
    acc = df.assign(_g=[g[0] for g in df["gap"]]).sort_values("_g", ascending=False, kind="stable").head(3)
    ours = [_hit(r, kind, target, prog) for _, r in cul.iterrows()]
    ref = [_hit(r, kind, target, prog) for _, r in acc.iterrows()]
    out = {"top1": bool(ours[:1] and ours[0]), "top3": any(ours), "ref_top1": bool(ref[:1] and ref[0]),
           "ref_top3": any(ref), "named": len(insp.find_culprits(df, top=1000))}
    if kind == "two":
        found = {t for t in target for _, r in cul.iterrows() if _hit(r, "weight", [t], prog)}
        out["both3"] = len(found) == len(target)
    return out


def plants(prog: Program, sizes: tuple[float, ...], sites: int) -> list[tuple[str, Any, float]]:
    out: list[tuple[str, Any, float]] = []
    ws = weight_sites(prog, sites)
    ks = kernel_sites(prog, sites)
    for s in sizes:
        out += [("weight", [w], s) for w in ws]
        out += [("kernel", k, s) for k in ks]
        out += [("input_dep", k, s) for k in ks[-2:]]
        if len(ws) >= 2:
            out.append(("two", [ws[0], ws[-1]], s))
    return out


def run_program(family: str, backend: str, sizes: tuple[float, ...], sites: int, log: Callable[[str], None]
                ) -> tuple[list[dict[str, Any]], int]:
    prog = export(family, backend)
    insp, df = debug_run(prog, prog.pte)
    clean = len(insp.find_culprits(df, top=1000))
    ratios = [lr / f for lr, f in zip(df["local_rel_error"], df["noise_floor"]) if lr is not None and f]
    log(f"{family:20s} {backend:8s} clean: {len(df)} rows, {clean} culprits named, largest local error "
        f"{max(ratios, default=0.0):.3f} x its noise floor")
    results = []
    for kind, target, s in plants(prog, sizes, sites):
        if kind in ("kernel", "input_dep"):
            insp, df = debug_run(prog, prog.pte, kernel_patch(target, s, kind == "input_dep"))
        else:
            insp, df = debug_run(prog, perturb_weights(prog, target, s))
        r = {"family": family, "backend": backend, "kind": kind, "size": s, "target": str(target),
             **score(insp, df, kind, target, prog)}
        results.append(r)
        log(f"  {kind:9s} s={s:.0e} {str(target)[:50]:50s} top1={int(r['top1'])} top3={int(r['top3'])} "
            f"ref_top1={int(r['ref_top1'])} ref_top3={int(r['ref_top3'])} named={r['named']}")
    return results, clean


# -- one layer quantized badly, compared against the float model (inspector.float_reference) --------------------
QUANT_FAMILIES = ("mlp", "small_cnn", "transformer_encoder", "vit_tiny")


def _outlier(model: torch.nn.Module, name: str, factor: float = 60.0) -> None:
    p = dict(model.named_parameters())[name]
    with torch.no_grad():
        p.view(-1)[0] = factor * p.abs().max()


def _calibration(inputs: tuple, n: int, seed: int = 0) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)

    def like(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            return torch.randn(t.shape, generator=g, dtype=t.dtype)
        return torch.randint(0, int(t.max()) + 1, t.shape, generator=g, dtype=t.dtype)

    return [tuple(inputs)] + [tuple(like(t) for t in inputs) for _ in range(n - 1)]


def _consumers(model: torch.nn.Module, inputs: tuple) -> dict[str, set[str]]:
    ep = torch.export.export(model, inputs)
    sig = ep.graph_signature.inputs_to_parameters
    return {sig[n.name]: _readers(n) for n in ep.graph.nodes if n.name in sig}


def run_quant(family: str, sites: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Plants a weight outlier (60 x the largest magnitude) in one layer, quantizes (INT8 per tensor, portable),
    ranks the float-reference rows (lowest local SQNR first) and the reference's way (largest accumulated gap)."""
    from edgetorch.devtools.inspector.float_reference import rank_quantization_culprits
    from edgetorch.export import ExportRecipe, PortableRecipeType
    from edgetorch.export import export as session_export
    from edgetorch.workflows.quant_fallback import inspect_quantized

    model, inputs = build(family)
    consumers = _consumers(model, inputs)
    params = dict(model.named_parameters())
    cands = [n for n, p in params.items() if p.dim() >= 2 and n in consumers and
             any(u.startswith(("linear", "conv")) for u in consumers[n])]
    out = []
    for name in _spread(cands, sites):
        m, _ = build(family)
        _outlier(m, name)
        samples = _calibration(inputs, 4)
        recipe = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_TENSOR)
        et = session_export(m, samples, recipe, generate_etrecord=True).get_executorch_program_manager()
        table = inspect_quantized(et, samples).table
        ours = rank_quantization_culprits(table, top=3)
        acc = table.assign(_g=[g[0] if isinstance(g, list) else g for g in table["gap"]]).sort_values(
            "_g", ascending=False, kind="stable").head(3)
        hit = [bool(set(ops) & consumers[name]) for ops in ours["aot_ops"]]
        ref = [bool(set(ops) & consumers[name]) for ops in acc["aot_ops"]]
        r = {"family": family, "backend": "portable_int8", "kind": "quant_outlier", "size": 60.0, "target": name,
             "top1": bool(hit[:1] and hit[0]), "top3": any(hit), "ref_top1": bool(ref[:1] and ref[0]),
             "ref_top3": any(ref), "named": len(ours)}
        out.append(r)
        log(f"  quant_outlier {family} {name:40s} top1={int(r['top1'])} top3={int(r['top3'])} "
            f"ref_top1={int(r['ref_top1'])} ref_top3={int(r['ref_top3'])} named={r['named']}")
    return out


# -- fix and prove it -----------------------------------------------------------------------------------------
#: (family, layers given a weight outlier, tolerance as a multiple of the clean INT8 model's final error)
FIX_CASES = (("resnet18", ("layer2.0.conv1.weight",), 2.0), ("transformer_encoder", ("layers.1.fc1.weight",), 2.0),
             ("resnet18", ("layer1.1.conv1.weight", "layer3.0.conv2.weight"), 1.25))


def run_fix(log: Callable[[str], None], max_reexports: int = 5, cases: list[int] | None = None
            ) -> list[dict[str, Any]]:
    """Quantized (INT8 per tensor, portable) ResNet-18 and transformer encoder with one badly quantized layer (a
    weight outlier), and ResNet-18 with two: the tolerance is a multiple of the final error of the same model
    quantized without the outliers; ``find_fix`` must find and prove the smallest fallback set within
    ``max_reexports``."""
    from edgetorch.export import ExportRecipe, PortableRecipeType
    from edgetorch.export import export as session_export
    from edgetorch.runtime import Runtime
    from edgetorch.workflows.fix import final_error, find_fix

    recipe = PortableRecipeType.INT8_STATIC_PER_TENSOR
    rows = []
    for i, (family, layers, factor) in enumerate(FIX_CASES):
        if cases is not None and i not in cases:
            continue
        clean, inputs = build(family)
        samples = _calibration(inputs, 4)
        pte = session_export(clean, samples, ExportRecipe.get_recipe(recipe)).get_pte_buffer()
        method = Runtime.get().load_program(pte).load_method("forward")
        with torch.no_grad():
            clean_err = final_error([clean(*s) for s in samples], [method.execute(*s) for s in samples])
        model, _ = build(family)
        for layer in layers:
            _outlier(model, layer)
        tol = factor * clean_err
        log(f"{family}: INT8 without the outlier: final error {clean_err:.3e}; tolerance {tol:.3e}")
        res = find_fix(model, samples, recipe, tol, max_reexports=max_reexports,
                       progress=lambda msg, f=family: log(f"  {f}: {msg}"))
        readers = _consumers(model, inputs)
        rows.append({"family": family, "layers": layers, "tolerance": tol, "baseline": res.baseline.final_error,
                     "fix": res.fix, "planted_in_fix": sum(bool(set(res.fix or ()) & readers[la]) for la in layers),
                     "reexports": res.reexports, "proven": res.proven,
                     "final": res.fix_step.final_error if res.fix_step else None,
                     "latency_ms": [round(s.latency_ms, 2) for s in res.steps],
                     "size_bytes": [s.size_bytes for s in res.steps]})
        log(f"{family}: {res.summary()}")
    return rows


def summarize(results: list[dict[str, Any]], clean: dict[str, int]) -> str:
    import pandas as pd

    df = pd.DataFrame(results)
    lines = []
    if len(df):
        kind = "initializer/weight"
        df["kind"] = [kind if k == "weight" else k for k in df["kind"]]
        df["ref_top3"] = df["ref_top3"].astype(float)  # None (not logged) -> NaN, left out of the means
        for by in ("kind", "size", "family"):
            g = df.groupby(by)[["top1", "top3", "ref_top1", "ref_top3"]].mean() * 100
            g["n"] = df.groupby(by).size()
            lines.append(g.round(1).to_string())
        tot = df[["top1", "top3", "ref_top1", "ref_top3"]].mean() * 100
        lines.append(f"ALL {len(df)} plants, {df['family'].nunique()} families, {df['kind'].nunique()} kinds: "
                     f"top-1 {tot['top1']:.1f} %, top-3 {tot['top3']:.1f} % | by accumulated gap: top-1 "
                     f"{tot['ref_top1']:.1f} %, top-3 {tot['ref_top3']:.1f} %")
        if "both3" in df:
            two = df[df["kind"] == "two"]
            lines.append(f"two faults: both in top-3 {100 * two['both3'].mean():.1f} % of {len(two)}")
    lines.append(f"clean programs: {sum(v > 0 for v in clean.values())} of {len(clean)} name a culprit "
                 f"({sum(clean.values())} culprits in all): {clean}")
    return "\n".join(lines)


_CLEAN = re.compile(r"\]\s+(\S+)\s+(\S+)\s+clean: \d+ rows, (\d+) culprits named")  # (old logs too)
_PLANT = re.compile(r"\]\s+(\w+)\s+s=(\S+)\s+(.*?)\s+top1=(\d) top3=(\d) ref_top1=(\d)(?: ref_top3=(\d))? "
                    r"named=(\d+)")


_QUANT = re.compile(r"\]\s+quant_outlier (\S+) (\S+)\s+top1=(\d) top3=(\d) ref_top1=(\d) ref_top3=(\d) "
                    r"named=(\d+)")


def from_logs(paths: list[str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The plants and clean counts of earlier runs, read back from their logs (runs split over families)."""
    results: list[dict[str, Any]] = []
    clean: dict[str, int] = {}
    for path in paths:
        family = backend = ""
        for line in open(path, encoding="utf-8", errors="replace"):
            m = _CLEAN.search(line)
            if m:
                family, backend = m.group(1), m.group(2)
                clean[f"{family}/{backend}"] = int(m.group(3))
                continue
            q = _QUANT.search(line)
            if q:
                results.append({"family": q.group(1), "backend": "portable_int8", "kind": "quant_outlier",
                                "size": 60.0, "target": q.group(2), "top1": q.group(3) == "1",
                                "top3": q.group(4) == "1", "ref_top1": q.group(5) == "1",
                                "ref_top3": q.group(6) == "1", "named": int(q.group(7))})
                continue
            m = _PLANT.search(line)
            if m and family:
                ref3 = m.group(7)
                results.append({"family": family, "backend": backend, "kind": m.group(1), "size": float(m.group(2)),
                                "target": m.group(3), "top1": m.group(4) == "1", "top3": m.group(5) == "1",
                                "ref_top1": m.group(6) == "1", "ref_top3": None if ref3 is None else ref3 == "1",
                                "named": int(m.group(8))})
    return results, clean


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(ZOO + HF))
    ap.add_argument("--backends", default="portable,ort")
    ap.add_argument("--sizes", default=",".join(f"{s:g}" for s in SIZES))
    ap.add_argument("--sites", type=int, default=2, help="weights and kernels planted per program and size")
    ap.add_argument("--clean-only", action="store_true", help="only count culprits on the clean programs")
    ap.add_argument("--quant-families", default=",".join(QUANT_FAMILIES),
                    help="families of the quantized-outlier plants ('' to skip)")
    ap.add_argument("--fix", action="store_true", help="only the fix figure (quantized ResNet-18 and encoder)")
    ap.add_argument("--fix-cases", default=None, help="indices into FIX_CASES to run (default: all)")
    ap.add_argument("--from-logs", nargs="+", default=None, help="summarize the logs of earlier runs instead")
    args = ap.parse_args(argv)
    if args.from_logs:
        print(summarize(*from_logs(args.from_logs)))
        return 0
    torch.manual_seed(0)
    sizes = tuple(float(s) for s in args.sizes.split(","))
    results: list[dict[str, Any]] = []
    clean: dict[str, int] = {}
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    if args.fix:
        cases = None if args.fix_cases is None else [int(c) for c in args.fix_cases.split(",")]
        for row in run_fix(log, cases=cases):
            print(row)
        return 0
    for family in [f for f in args.families.split(",") if f]:
        for backend in args.backends.split(","):
            r, c = run_program(family, backend, () if args.clean_only else sizes, args.sites, log)
            results += r
            clean[f"{family}/{backend}"] = c
    if not args.clean_only:
        for family in [f for f in args.quant_families.split(",") if f]:
            results += run_quant(family, args.sites, log)
    print(summarize(results, clean))
    return 0


if __name__ == "__main__":
    sys.exit(main())
