"""The backend contract, runtime side: a process that only runs programs never loads the compiler.

For the portable runtime and every backend folder under ``src/edgetorch/backends/``, the parent process writes a
small ``.pte`` (mlp) that delegates to that backend; a fresh process imports ``edgetorch.runtime`` alone, loads
it, executes it plainly and traced (ETDump + debug buffer, so the backend's observer calls run too), checks the
outputs, and prints what it imported. None of the compiler, the export session, the models, the developer tools
or the command line may be among them, nor the heavy AOT-only third-party packages, nor the backend's own
ahead-of-time modules. docs/architecture.md ("The backend contract") states the rule; issue 27.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from edgetorch.models import get_model
from tests.conftest import lower

ROOT = Path(__file__).resolve().parents[1]
BACKENDS_DIR = ROOT / "src" / "edgetorch" / "backends"

#: module prefixes a runtime-only process must not import (layers above the runtime, AOT-only third parties)
FORBIDDEN = ("edgetorch.exir", "edgetorch.export", "edgetorch.models", "edgetorch.devtools", "edgetorch.cli",
             "torchao", "transformers", "onnxscript", "torch.onnx")


def _portable(model: torch.nn.Module, inputs: tuple) -> bytes:
    return lower(model, inputs).buffer


def _onnxruntime(model: torch.nn.Module, inputs: tuple) -> bytes:
    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model, inputs)
    return to_edge_transform_and_lower(ep, partitioner=[OrtPartitioner()]).to_executorch().buffer


#: backend id ("portable": no delegate) -> writes the .pte bytes of ``model`` delegating to it. A new backend
#: folder must add its entry here (``test_every_backend_folder_is_covered``).
WRITERS: dict[str, Callable[[torch.nn.Module, tuple], bytes]] = {
    "portable": _portable,
    "onnxruntime": _onnxruntime,
}

_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import edgetorch.runtime as rt

    io = torch.load(sys.argv[2])
    outs = {}
    for traced in (False, True):
        kw = {"enable_etdump": True, "debug_buffer_size": "auto"} if traced else {}
        prog = rt.Runtime.get().load_program(sys.argv[1], **kw)
        got = prog.load_method("forward").execute(*io["inputs"])[0]
        outs[traced] = (got - io["want"]).abs().max().item() / io["want"].abs().max().item()
        if traced:
            events = [ev.profile_event or ev.debug_event for run in prog.tracer.etdump().run_data
                      for ev in run.events]
            in_delegate = [e for e in events if e is not None
                           and (e.delegate_debug_id_str or e.delegate_debug_id_int >= 0)]
    print(json.dumps({"backends": [d.backend_id for d in prog.plan("forward").delegates],
                      "errors": [outs[False], outs[True]], "in_delegate_events": len(in_delegate),
                      "modules": sorted(sys.modules)}))
""")


def _backend_folders() -> set[str]:
    return {p.name for p in BACKENDS_DIR.iterdir() if (p / "__init__.py").is_file()}


def test_every_backend_folder_is_covered():
    """A backend folder without a writer here would escape the fresh-process check below."""
    assert _backend_folders() == set(WRITERS) - {"portable"}
    for name in _backend_folders():
        assert (BACKENDS_DIR / name / "runtime.py").is_file(), f"backends/{name} has no runtime.py"


def _run_child(pte: Path, io: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run([sys.executable, "-c", _CHILD, str(pte), str(io)], capture_output=True, text=True,
                       env=env, cwd=str(pte.parent), timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", sorted(WRITERS))
def test_the_runtime_side_loads_without_the_compiler(backend: str, tmp_path: Path):
    model, inputs = get_model("mlp")
    pte, io = tmp_path / "model.pte", tmp_path / "io.pt"
    pte.write_bytes(WRITERS[backend](model, inputs))
    torch.save({"inputs": list(inputs), "want": model(*inputs).detach()}, io)
    child = _run_child(pte, io)
    assert child["backends"] == ([] if backend == "portable" else [backend])
    assert max(child["errors"]) <= 1e-5, child["errors"]
    if backend != "portable":  # the traced run reached the backend's observer calls (DelegateEvents)
        assert child["in_delegate_events"] > 0
    modules = child["modules"]
    assert "edgetorch.runtime" in modules
    bad = [m for m in modules if m.startswith(FORBIDDEN)]
    assert bad == [], f"a runtime-only process running a {backend} program imported {bad}"
    # the backend's runtime side is backends/<name>/runtime.py and what it needs, never its AOT side
    aot = [m for m in modules if m.startswith("edgetorch.backends.")
           and m.split(".")[-1] in ("preprocess", "partitioner", "ops")]
    assert aot == [], f"the {backend} runtime side imported its ahead-of-time modules {aot}"
    others = {m.split(".")[2] for m in modules if m.startswith("edgetorch.backends.")} - {backend}
    assert others == set(), f"running a {backend} program imported other backends {sorted(others)}"
