"""What each verification level costs at load: ViT-B/16 (a 330 MiB .pte) by default.

Usage: python bench/bench_verification.py [--model vit_b_16] [--runs 9]

Loads the program from disk (the file is in the page cache after the first load) with ``Minimal``,
``InternalConsistency`` and ``Full`` (the content hash of the whole file, weights included), alternating, and
prints the median load time of each; ``Full`` minus ``InternalConsistency`` is the cost of hashing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import alternate  # noqa: E402

from edgetorch.exir import to_edge  # noqa: E402
from edgetorch.models import get_spec  # noqa: E402
from edgetorch.runtime import Runtime, Verification  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    spec = get_spec(args.model)
    model, inputs = spec.build().eval(), spec.example_inputs()["forward"]
    et = to_edge(torch.export.export(model, inputs)).to_executorch()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.pte")
        et.save(path)
        size = os.path.getsize(path) / 2**20
        fns = {level.name: (lambda level=level: Runtime.get().load_program(path, verification=level))
               for level in (Verification.Minimal, Verification.InternalConsistency, Verification.Full)}
        med = alternate(fns, args.runs, warmup=1)
    print(f"{args.model}: {size:.0f} MiB .pte, median load over {args.runs} alternating runs: "
          + ", ".join(f"{k} {v:.3f} s" for k, v in med.items())
          + f"; hashing costs {med['Full'] - med['InternalConsistency']:.3f} s")


if __name__ == "__main__":
    main()
