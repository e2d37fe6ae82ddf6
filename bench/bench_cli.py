"""Start-up cost of the command-line runner (issue 5 figure: CLI start-up + one run <= 1.5x the same run from
Python).

Usage: python bench/bench_cli.py [--model vit_b_16] [--runs 5]

Builds a bundled program (.bpte) of the model with one test case, then times (medians of ``--runs``):
  * in-process: ``load_program(bpte) + load_method + execute`` from a Python process that already imported
    torch and edgetorch: the first call ("first", what a script doing one run pays after its imports) and
    the median of later calls with a fresh Program each ("warm");
  * ``edgetorch run --bundled_program_path X --output_verification`` as a subprocess (interpreter start,
    imports, reading the test case, load, one execute, verification, exit);
  * a minimal Python script doing only ``import torch`` + load + execute, as a subprocess (what any Python
    entry point pays), and interpreter start + ``import torch`` alone (ended with ``os._exit`` as the CLI is);
and prints the ratios. Also reports which heavy modules ``edgetorch run`` imports (``-X importtime``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
HEAVY = ("edgetorch.exir", "edgetorch.export", "edgetorch.devtools.inspector", "pandas", "rich", "onnx",
         "onnxruntime", "torch._dynamo", "torch._inductor")

_SCRIPT = """
import sys, torch
from edgetorch.runtime import Runtime
from edgetorch.formats import bundled_program as bpf
with open(sys.argv[1], "rb") as f:
    b = bpf.read_bundle(f.read())
x = [bpf.tensor_to_torch(v) for v in b.suites[0].test_cases[0].inputs]
p = Runtime.get().load_program(sys.argv[1])
p.load_method("forward").execute(*x)
"""


def build_bundle(model_name: str, path: str) -> tuple:
    import torch

    from edgetorch.devtools.bundled_program import BundledProgram, MethodTestCase, MethodTestSuite
    from edgetorch.exir import to_edge
    from edgetorch.models import get_model

    model, inputs = get_model(model_name)
    t0 = time.perf_counter()
    et = to_edge(torch.export.export(model, inputs)).to_executorch()
    with torch.no_grad():
        expected = model(*inputs)
    BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(inputs, expected)])]).save(path)
    print(f"{model_name}: bundle built in {time.perf_counter() - t0:.1f}s, {os.path.getsize(path) / 2**20:.1f} MB")
    return inputs


def time_subprocess(cmd: list[str], runs: int, env: dict) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        samples.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return statistics.median(samples)


def heavy_imports(cmd: list[str], env: dict) -> list[str]:
    r = subprocess.run([sys.executable, "-X", "importtime", *cmd[1:]], capture_output=True, text=True, env=env)
    found = set()
    for line in r.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        mod = line.rsplit("|", 1)[-1].strip()
        for h in HEAVY:
            if mod == h or mod.startswith(h + "."):
                found.add(h)
    return sorted(found)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    sys.path.insert(0, SRC)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    tmp = tempfile.mkdtemp(prefix="edgetorch-bench-cli-")
    path = os.path.join(tmp, f"{args.model}.bpte")
    inputs = build_bundle(args.model, path)

    import torch

    from edgetorch.runtime import Runtime

    def in_process() -> float:
        t0 = time.perf_counter()
        program = Runtime.get().load_program(path)
        program.load_method("forward").execute(*inputs)
        return time.perf_counter() - t0

    py_first = in_process()  # includes first-call kernel initialisation
    py = statistics.median(in_process() for _ in range(args.runs))
    cli_cmd = [sys.executable, "-m", "edgetorch", "run", "--bundled_program_path", path, "--output_verification"]
    cli = time_subprocess(cli_cmd, args.runs, env)
    script = os.path.join(tmp, "minimal.py")
    with open(script, "w") as f:
        f.write(_SCRIPT)
    minimal = time_subprocess([sys.executable, script, path], args.runs, env)
    torch_only = time_subprocess([sys.executable, "-c", "import os, torch; os._exit(0)"], args.runs, env)
    heavy = heavy_imports(cli_cmd, env)
    print(f"threads: {torch.get_num_threads()}, runs: {args.runs} (medians)")
    print(f"in-process load+execute, first call:      {1000 * py_first:8.1f} ms")
    print(f"in-process load+execute, warm (median):   {1000 * py:8.1f} ms")
    print(f"edgetorch run (subprocess, verification): {1000 * cli:8.1f} ms  ratio {cli / py_first:.2f}x first, "
          f"{cli / py:.2f}x warm")
    print(f"minimal python script (subprocess):       {1000 * minimal:8.1f} ms  ratio {minimal / py_first:.2f}x first, "
          f"{minimal / py:.2f}x warm")
    print(f"python start + import torch (no teardown):{1000 * torch_only:8.1f} ms")
    print(f"CLI overhead over the minimal script:     {1000 * (cli - minimal):8.1f} ms ({cli / minimal:.2f}x)")
    print(f"CLI minus interpreter+torch start-up:     {1000 * (cli - torch_only):8.1f} ms "
          f"({(cli - torch_only) / py_first:.2f}x first in-process run)")
    print(f"heavy modules imported by edgetorch run:  {', '.join(heavy) or 'none'}")


if __name__ == "__main__":
    main()
