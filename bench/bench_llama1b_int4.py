"""llama_1b with int4 weights (issue 25): export through a torchao recipe (the float program recorded in the
ETRecord), generate 32 tokens on the runtime, then record an 8-token generation with an ETDump and compute the
per-token x per-layer float-reference table from the ETRecord's float program alone (no float model passed); peak
RSS against (float weights + packed weights), the issue's bound being 1.5x.

    .venv/bin/python bench/bench_llama1b_int4.py [--model llama_1b]
        [--recipe TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR]
        [--group-size 32] [--tokens 32] [--table-tokens 8] [--prompt-len 8] [--out DIR] [--one-process]

Needs about 8-10 GB of memory for llama_1b (4.4 GB of float weights). The SOURCE_TRANSFORM stage quantizes in
place (``source_transform_in_place``): the eager model's Linears become packed low-bit modules while the float
weights live on in the recorded float program only, so they are held once. Peak RSS is the process's
``ru_maxrss`` after each phase (it only grows), with the resident memory at that moment (anonymous and file-backed);
figures are printed and written to ``<out>/result.json``. The table runs in a fresh process by default, as a user
runs it (`edgetorch generate --etdump` exports, generates and records; `edgetorch inspect --reference-graph float`
reads the recording in a process of its own); ``--one-process`` keeps it in the exporting process, whose peak then
also counts what the C allocator kept from the export phase (freed, not returned to the system).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from edgetorch.devtools import Inspector  # noqa: E402
from edgetorch.export import ExportRecipe, PortableRecipeType, export  # noqa: E402
from edgetorch.export.lowbit import LowBitEmbedding, LowBitLinear  # noqa: E402
from edgetorch.models import get_spec  # noqa: E402
from edgetorch.models.generation import greedy_generate_with_logits  # noqa: E402
from edgetorch.models.llama import example_prompt, llama_dynamic_shapes, llama_method_inputs  # noqa: E402
from edgetorch.runtime import Runtime  # noqa: E402

MiB = 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def now_mib() -> dict[str, float]:
    """This process's resident memory now (Linux /proc/self/status): total, anonymous and file-backed MiB."""
    try:
        st = dict(line.split(":", 1) for line in open("/proc/self/status", encoding="utf-8") if ":" in line)
    except OSError:
        return {}
    return {k: round(int(st[k].split()[0]) / 1024, 1) for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM") if k in st}


def _packed_bytes(model: torch.nn.Module) -> int:
    return sum(b.numel() * b.element_size() for m in model.modules() if isinstance(m, (LowBitLinear, LowBitEmbedding))
               for b in m.buffers(recurse=False) if b is not None)


def _table(etdp: str, etr: str, dbg: str) -> dict:
    """The per-token x per-layer table from the recording and the ETRecord alone; a summary of it."""
    t = time.perf_counter()
    df = Inspector(etdump_path=etdp, etrecord=etr, debug_buffer_path=dbg).quantized_generation_table()
    toks = df.attrs["tokens"]
    return {"table_s": round(time.perf_counter() - t, 1), "table_calls": len(toks), "table_rows": len(df),
            "logits_sqnr_db": [round(float(v), 2) for v in toks["logits_sqnr_db"]],
            "first_divergence": df.attrs["first_divergence"], "responsible_layer": df.attrs["responsible_layer"]}


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--table-only":
        table = _table(*sys.argv[2:])
        # VmHWM, not ru_maxrss: after fork + exec ru_maxrss still counts the parent's pages at the fork
        print(json.dumps({**table, "peak_rss_mib": now_mib().get("VmHWM", peak_mib()), "rss_now_mib": now_mib()}))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama_1b")
    ap.add_argument("--recipe", default="TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--table-tokens", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--one-process", action="store_true",
                    help="compute the table in this process too (default: in a fresh one, as the CLI's inspect)")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="llama1b_int4_")
    os.makedirs(out, exist_ok=True)
    res: dict = {"model": args.model, "recipe": args.recipe, "group_size": args.group_size, "threads":
                 torch.get_num_threads()}
    phases: dict[str, float] = {}
    now: dict[str, dict[str, float]] = {}
    base = peak_mib()  # the interpreter, torch and edgetorch before any model

    torch.manual_seed(0)
    model = get_spec(args.model).build().eval()
    cfg = model.config
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    phases["build"] = peak_mib()
    now["build"] = now_mib()
    kw = {"group_size": args.group_size} if args.recipe.endswith(("PER_TENSOR", "INT4_WEIGHT_ONLY")) else {}
    recipe = ExportRecipe.get_recipe(PortableRecipeType[args.recipe], **kw)
    recipe.source_transform_in_place = True  # the float weights are held by the recorded float program only
    inputs = llama_method_inputs(cfg)
    t = time.perf_counter()
    session = export({"prefill": model, "decode": model}, {k: [v] for k, v in inputs.items()}, recipe,
                     dynamic_shapes=llama_dynamic_shapes(cfg), generate_etrecord=True)
    res["export_s"] = round(time.perf_counter() - t, 1)
    packed_bytes = _packed_bytes(model)
    phases["export"] = peak_mib()
    now["export"] = now_mib()
    pte, etr = os.path.join(out, "model.pte"), os.path.join(out, "etrecord.bin")
    session.get_executorch_program_manager().save(pte)
    rec = session.get_etrecord()
    res["etrecord_graphs"] = sorted(rec.graph_map_names())
    rec.save(etr)
    phases["save"] = peak_mib()
    now["save"] = now_mib()
    del session, rec, model
    gc.collect()

    prompt = example_prompt(cfg, args.prompt_len)
    prog = Runtime.get().load_program(pte)
    t = time.perf_counter()
    got = greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                      prompt, args.tokens)
    dt = time.perf_counter() - t
    res["generated_tokens"] = len(got.tokens)
    res["generate_s"] = round(dt, 2)
    phases["generate"] = peak_mib()
    now["generate"] = now_mib()
    del prog, got
    gc.collect()

    prog = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
    greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                prompt, args.table_tokens)
    etdp, dbg = os.path.join(out, "etdump.etdp"), os.path.join(out, "debug_buffer.bin")
    prog.write_etdump_result_to_file(etdp, dbg)
    del prog
    gc.collect()
    phases["record"] = peak_mib()
    now["record"] = now_mib()
    if args.one_process:
        table = _table(etdp, etr, dbg)
        phases["table"] = peak_mib()
        now["table"] = now_mib()
    else:  # as `edgetorch inspect --reference-graph float` does it: a process of its own
        child = subprocess.run([sys.executable, __file__, "--table-only", etdp, etr, dbg], check=True,
                               capture_output=True, text=True)
        table = json.loads(child.stdout.strip().splitlines()[-1])
        phases["table (own process)"] = table.pop("peak_rss_mib")
        now["table (own process)"] = table.pop("rss_now_mib")
    res.update(table)
    res["pte_mib"] = round(os.path.getsize(pte) / MiB, 1)
    res["etrecord_mib"] = round(os.path.getsize(etr) / MiB, 1)
    res["float_weights_mib"] = round(float_bytes / MiB, 1)
    res["packed_weights_mib"] = round(packed_bytes / MiB, 1)
    res["peak_rss_mib_after"] = {k: round(v, 1) for k, v in phases.items()}
    res["rss_now_mib_after"] = now
    bound = (float_bytes + packed_bytes) / MiB
    res["rss_baseline_mib"] = round(base, 1)
    res["peak_rss_over_float_plus_packed"] = round(max(phases.values()) / bound, 3)
    res["peak_rss_less_baseline_over_float_plus_packed"] = round((max(phases.values()) - base) / bound, 3)
    res["bound"] = 1.5
    print(json.dumps(res, indent=2))
    with open(os.path.join(out, "result.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
