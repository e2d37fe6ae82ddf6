"""Saving a .pte and loading it: from disk in a fresh process, from bytes and file objects, metadata."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from edgetorch.models import get_model
from edgetorch.runtime import Runtime, Verification
from tests.conftest import lower

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_saved_program_runs_in_a_fresh_process(tmp_path):
    model, inputs = get_model("transformer_encoder")
    et = lower(model, inputs)
    pte = tmp_path / "model.pte"
    et.save(pte)
    torch.save({"x": inputs[0], "y": model(*inputs).detach()}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        import edgetorch.runtime as rt
        assert "edgetorch.exir" not in sys.modules
        io = torch.load({str(tmp_path / "io.pt")!r})
        p = rt.Runtime.get().load_program({str(pte)!r})
        out = p.load_method("forward").execute_structured(io["x"])
        assert "edgetorch.exir" not in sys.modules, "the runtime must not import the compiler"
        err = (out - io["y"]).abs().max().item() / io["y"].abs().max().item()
        assert err <= 1e-5, err
        print("OK", err)
    """)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK")


def test_load_from_bytes_path_and_file_object(tmp_path):
    model, inputs = get_model("mlp")
    et = lower(model, inputs)
    path = tmp_path / "m.pte"
    et.save(path)
    assert path.read_bytes() == et.buffer
    want = model(*inputs).detach()
    for data in (et.buffer, str(path), path, open(path, "rb")):
        p = Runtime.get().load_program(data, verification=Verification.Minimal)
        torch.testing.assert_close(p.load_method("forward").execute_structured(*inputs), want)
        if hasattr(data, "close"):
            data.close()
    assert p.content_hash == et.content_hash


def test_constants_are_mapped_not_copied(tmp_path):
    model, inputs = get_model("mlp")
    et = lower(model, inputs)
    path = tmp_path / "m.pte"
    et.save(path)
    method = Runtime.get().load_program(str(path)).load_method("forward")
    import mmap

    buf = method._program._loaded.buffer
    assert isinstance(buf, mmap.mmap)
    base = torch.frombuffer(buf, dtype=torch.uint8)
    lo, hi = base.data_ptr(), base.data_ptr() + base.numel()
    constants = [method._slots[i] for i, v in enumerate(method.plan.values)
                 if getattr(v, "placement", None) == 1]
    assert constants and all(lo <= c.data_ptr() < hi for c in constants)
    assert all(c.data_ptr() % 64 == 0 for c in constants)


def test_method_metadata():
    model, inputs = get_model("multi_output")
    p = Runtime.get().load_program(lower(model, inputs).buffer)
    meta = p.load_method("forward").metadata
    assert [i.dtype for i in meta.inputs] == [t.dtype for t in inputs]
    assert [i.shape for i in meta.inputs] == [tuple(t.shape) for t in inputs]
    outs = model(*inputs)
    assert [o.dtype for o in meta.outputs] == [o.dtype for o in outs]
    assert [o.shape for o in meta.outputs] == [tuple(o.shape) for o in outs]
    assert meta.input_names == ["x", "labels"]
    assert meta.arena_bytes > 0 and meta.num_instructions > 0


def test_two_methods_in_one_file(tmp_path):
    from edgetorch.exir import to_edge
    from edgetorch.models import get_spec, method_module

    spec = get_spec("two_method")
    model = spec.build()
    inputs = spec.example_inputs()
    eps = {m: torch.export.export(method_module(model, m), inp) for m, inp in inputs.items()}
    et = to_edge(eps).to_executorch()
    et.save(tmp_path / "two.pte")
    p = Runtime.get().load_program(tmp_path / "two.pte")
    assert p.method_names == {"forward", "encode"}
    for m, inp in inputs.items():
        torch.testing.assert_close(p.load_method(m).execute_structured(*inp), getattr(model, m)(*inp).detach())


def test_full_verification_checks_the_content_hash_of_weights(tmp_path):
    from edgetorch.errors import ProgramFormatError
    from edgetorch.exir import to_edge

    model = torch.nn.Linear(16, 16)
    x = torch.randn(1, 16)
    et = to_edge(torch.export.export(model, (x,))).to_executorch()
    data = bytearray(et.buffer)
    Runtime.get().load_program(bytes(data), verification=Verification.Full)  # intact: accepted
    data[-8] ^= 0x40  # one bit of a weight in the segment area
    for level in (Verification.Minimal, Verification.InternalConsistency):  # these do not read the weights
        Runtime.get().load_program(bytes(data), verification=level)
    with pytest.raises(ProgramFormatError, match="content hash mismatch"):
        Runtime.get().load_program(bytes(data), verification=Verification.Full)
