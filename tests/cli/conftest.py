"""Artifacts shared by the CLI tests: an MLP exported once, as .pte, .bpte (correct and altered) and ETRecord."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Artifacts:
    folder: str
    pte: str
    bpte: str
    bad_bpte: str
    etrecord: str
    inputs: tuple
    expected: torch.Tensor


def cli(*args: str, cwd: str | None = None, python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Runs ``python -m edgetorch ARGS`` in a subprocess (edgetorch from this checkout)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    return subprocess.run([sys.executable, *python_flags, "-m", "edgetorch", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Artifacts:
    from edgetorch.devtools.bundled_program import BundledProgram, MethodTestCase, MethodTestSuite
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.models import get_model

    folder = str(tmp_path_factory.mktemp("cli"))
    model, inputs = get_model("mlp")
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    with torch.no_grad():
        expected = model(*inputs)
        other = (torch.randn_like(inputs[0]),)
        cases = [MethodTestCase(inputs, expected), MethodTestCase(other, model(*other)), MethodTestCase(other)]
    paths = {k: os.path.join(folder, v) for k, v in
             {"pte": "mlp.pte", "bpte": "mlp.bpte", "bad": "mlp_altered.bpte", "rec": "etrecord.bin"}.items()}
    et.save(paths["pte"])
    bp = BundledProgram(et, [MethodTestSuite("forward", cases)])
    bp.save(paths["bpte"])
    altered = expected.clone()
    altered[0, 3] += 0.5  # one element far outside rtol=1e-3 / atol=1e-5
    BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(inputs, altered)])]).save(paths["bad"])
    rec = et.get_etrecord()
    rec.update_representative_inputs(bp)
    rec.save(paths["rec"])
    return Artifacts(folder, paths["pte"], paths["bpte"], paths["bad"], paths["rec"], inputs, expected)
