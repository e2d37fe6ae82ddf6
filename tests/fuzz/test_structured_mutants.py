"""Structure-aware mutants (issue 23): decode a ``.pte``, move one tensor argument of one kernel instruction to
another planned or constant tensor of another shape or dtype, re-encode with a valid hash. Each mutant is loaded
under ``Verification.Full`` and run in a worker subprocess (a crash is attributed to its mutant): it must be
refused with a typed error or run; a crash or a generic exception fails. On small_cnn every such mutant of a
batch-norm statistic used to crash the process (SIGSEGV)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from edgetorch.formats import program as pf
from edgetorch.models import get_model
from tests.conftest import lower

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = 60

_WORKER = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
from edgetorch.errors import EdgeTorchError
from edgetorch.runtime import Runtime, Verification
from tests.fuzz.pte_edit import edit
pte, inputs_path, mutants_path, out_path = sys.argv[1:5]
data = open(pte, "rb").read()
inputs = torch.load(inputs_path)
with open(out_path, "a") as out:
    for k, j, t in json.load(open(mutants_path)):
        def mutate(prog, k=k, j=j, t=t):
            prog.plans[0].instructions[k].call.args[j] = t
        out.write(json.dumps([k, j, t, "start"]) + "\n"); out.flush()
        try:
            Runtime.get().load_program(edit(data, mutate), verification=Verification.Full).load_method(
                "forward").execute(*inputs)
            status = "ran"
        except EdgeTorchError:
            status = "typed"
        except Exception as e:
            status = f"generic: {type(e).__name__}: {str(e)[:200]}"
        out.write(json.dumps([k, j, t, status]) + "\n"); out.flush()
"""


def _mutants(data: bytes) -> list[tuple[int, int, int]]:
    from tests.fuzz.pte_edit import decode

    p = decode(data)[0].plans[0]
    tensors = [i for i, v in enumerate(p.values) if isinstance(v, pf.TensorDef)
               and v.placement in (pf.PLACEMENT_PLANNED, pf.PLACEMENT_CONSTANT)]
    out = []
    for k, ins in enumerate(p.instructions):
        c = ins.call
        if not isinstance(c, pf.KernelCallDef) or c.kind == pf.CALL_VIEW:
            continue
        for j, a in enumerate(c.args):
            v = p.values[a]
            if not isinstance(v, pf.TensorDef):
                continue
            seen = {(tuple(v.sizes), v.scalar_type)}
            for t in tensors:
                key = (tuple(p.values[t].sizes), p.values[t].scalar_type)
                if key not in seen:
                    seen.add(key)
                    out.append((k, j, t))
    return out


@pytest.mark.parametrize("name", ["small_cnn"])
def test_moved_tensor_arguments_never_crash(name, tmp_path):
    model, inputs = get_model(name)
    data = lower(model, inputs).buffer
    pte, inp = tmp_path / "m.pte", tmp_path / "inputs.pt"
    pte.write_bytes(data)
    torch.save(inputs, inp)
    everything = _mutants(data)
    bn = [m for m in everything if m[1] in (1, 2, 3, 4) and "batch_norm" in _op(data, m[0])]
    rng = random.Random(23)
    todo = bn + rng.sample([m for m in everything if m not in bn], min(SAMPLE, len(everything) - len(bn)))
    results: dict[tuple, str] = {}
    while len(results) < len(todo):
        rest = [m for m in todo if tuple(m) not in results]
        (tmp_path / "todo.json").write_text(json.dumps(rest))
        log = tmp_path / "log.jsonl"
        r = subprocess.run([sys.executable, "-c", _WORKER, str(pte), str(inp), str(tmp_path / "todo.json"), str(log)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        for k, j, t, st in lines:
            if st != "start":
                results[(k, j, t)] = st
        if r.returncode != 0:  # the worker died on the mutant it started last
            k, j, t, _ = lines[-1]
            results[(k, j, t)] = f"crash (exit {r.returncode})"
        log.unlink(missing_ok=True)
    bad = {m: s for m, s in results.items() if s not in ("typed", "ran")}
    assert not bad, bad
    assert sum(s == "typed" for s in results.values()) >= len(todo) // 2


def _op(data: bytes, k: int) -> str:
    from tests.fuzz.pte_edit import decode

    p = decode(data)[0].plans[0]
    return p.operators[p.instructions[k].call.op_index].name
