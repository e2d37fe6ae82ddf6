"""ETRecord save / load figures on ViT-B/16 by default.

Builds the record (export -> to_edge(generate_etrecord=True) -> to_executorch -> get_etrecord, with the
example input as representative input) and saves it, then, in fresh subprocesses (cold imports, cold caches
of this process), times ``parse_etrecord``, ``reference_graph()`` and ``handle_table()``, checks that no
program was deserialized (``torch._export.serde.serialize`` not imported), measures the anonymous (copied)
memory they add, and checks that the reference graph reproduces eager outputs bit for bit.

Usage: python bench/bench_etrecord.py [--model vit_b_16] [--runs 5] [--keep DIR]
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

_LOAD = r"""
import gc, json, sys, time
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0
t0 = time.perf_counter()
import torch
from edgetorch.devtools.etrecord import parse_etrecord
t1 = time.perf_counter()
gc.collect()  # the first full collection of torch's import heap (~0.3 s) is not part of loading a record
anon0, rss0, hwm0 = status("RssAnon"), status("VmRSS"), status("VmHWM")
t2 = time.perf_counter()
rec = parse_etrecord(sys.argv[1])
t3 = time.perf_counter()
gm = rec.reference_graph("forward")
t4 = time.perf_counter()
table = rec.handle_table("forward")
t5 = time.perf_counter()
anon1, rss1 = status("RssAnon"), status("VmRSS")
out = {"import_s": t1 - t0, "parse_s": t3 - t2, "reference_s": t4 - t3, "handles_s": t5 - t4,
       "anon_growth_bytes": anon1 - anon0, "rss_growth_bytes": rss1 - rss0,
       "peak_rss_growth_bytes": max(0, status("VmHWM") - max(hwm0, rss0)),
       "serde_imported": "torch._export.serde.serialize" in sys.modules,
       "dynamo_imported": "torch._dynamo" in sys.modules,
       "nodes": len(gm.graph.nodes), "handles": len(table), "handle_nodes": sum(map(len, table.values()))}
if len(sys.argv) > 2:
    x = torch.load(sys.argv[2])
    with torch.no_grad():
        t6 = time.perf_counter()
        ref = gm(*x)
        t7 = time.perf_counter()
    out.update(anon_after_run_bytes=status("RssAnon") - anon0, rss_after_run_bytes=status("VmRSS") - rss0,
               serde_imported_after_run="torch._export.serde.serialize" in sys.modules)
    from edgetorch.models import get_model
    model, _ = get_model(sys.argv[3])
    with torch.no_grad():
        t8 = time.perf_counter()
        eager = model(*x)
        t9 = time.perf_counter()
    out.update(reference_run_s=t7 - t6, eager_run_s=t9 - t8, bit_exact=bool(torch.equal(ref[0], eager)))
    t10 = time.perf_counter()
    rec.exported_programs, rec.edge_programs  # the full programs, on demand (imports torch._export.serde)
    out.update(programs_s=time.perf_counter() - t10)
print(json.dumps(out))
"""


def _run_load(path: str, extra: list[str]) -> dict:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "src"), root, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", _LOAD, path, *extra], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", default=None, help="folder to keep the record in (default: a temp folder)")
    args = ap.parse_args()

    import torch

    from edgetorch.exir import to_edge
    from edgetorch.models import get_model

    out = args.keep or tempfile.mkdtemp(prefix="bench_etrecord_")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{args.model}.etrecord")
    model, inputs = get_model(args.model)
    t0 = time.perf_counter()
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    t_build = time.perf_counter() - t0
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    t0 = time.perf_counter()
    rec.save(path)
    t_save = time.perf_counter() - t0
    torch.save(inputs, os.path.join(out, "inputs.pt"))
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())

    runs = [_run_load(path, []) for _ in range(args.runs)]
    check = _run_load(path, [os.path.join(out, "inputs.pt"), args.model])

    def med(k: str) -> float:
        return statistics.median(r[k] for r in runs)

    total = med("parse_s") + med("reference_s") + med("handles_s")
    print(f"model {args.model}: weights {weights / 2**20:.1f} MiB, export+to_edge+to_executorch {t_build:.1f} s")
    print(f"save: {t_save:.2f} s, file {os.path.getsize(path) / 2**20:.1f} MiB")
    print(f"load (median of {args.runs} fresh processes; import of torch + etrecord {med('import_s'):.2f} s):")
    print(f"  parse_etrecord      {med('parse_s') * 1e3:8.1f} ms")
    print(f"  reference_graph()   {med('reference_s') * 1e3:8.1f} ms   ({runs[0]['nodes']} nodes)")
    print(f"  handle_table()      {med('handles_s') * 1e3:8.1f} ms   ({runs[0]['handles']} handles, "
          f"{runs[0]['handle_nodes']} edge nodes)")
    print(f"  total               {total * 1e3:8.1f} ms   (target < 150 ms)")
    print(f"  memory added: RSS {statistics.median(r['rss_growth_bytes'] for r in runs) / 2**20:.1f} MiB, of which "
          f"anonymous {statistics.median(r['anon_growth_bytes'] for r in runs) / 2**20:.1f} MiB "
          f"(weights {weights / 2**20:.1f} MiB are mapped, not copied)")
    print(f"  peak RSS above the start: {max(r['peak_rss_growth_bytes'] for r in runs) / 2**20:.1f} MiB")
    print(f"  torch._export.serde imported: {any(r['serde_imported'] for r in runs)}, torch._dynamo imported: "
          f"{any(r['dynamo_imported'] for r in runs)}")
    print(f"reference graph vs eager: bit-exact={check['bit_exact']}, first reference run (includes its code "
          f"generation) {check['reference_run_s']:.3f} s, eager {check['eager_run_s']:.3f} s; after the run RSS "
          f"+{check['rss_after_run_bytes'] / 2**20:.1f} MiB (pages of the mapped file), anonymous "
          f"+{check['anon_after_run_bytes'] / 2**20:.1f} MiB; serde imported: "
          f"{check['serde_imported_after_run']}")
    print(f"full programs on first access (ATen + edge, torch's deserializer, import included): "
          f"{check['programs_s']:.2f} s")
    if not args.keep:
        for name in os.listdir(out):
            os.unlink(os.path.join(out, name))
        os.rmdir(out)


if __name__ == "__main__":
    main()
