"""Issue 26's live comparison: artifacts made now by the installed reference (``executorch==1.5.1``), not the
committed ones, read by edgetorch and checked against the reference Inspector's own tables of the same run.

It runs when a Python with the reference is known: ``EDGETORCH_REFERENCE_PYTHON`` (``.ci/run`` sets it when the
reference venv of ``tests/data/reference/make_reference_artifacts.py`` exists), or this interpreter when it
imports ``executorch``. Otherwise it skips and says how to enable it: CI needs no ``executorch``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgetorch.devtools import Inspector
from tests.devtools._reference_data import assert_reference_rows

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "reference" / "make_reference_artifacts.py"
NAMES = [f"{m}_{b}" for m in ("mlp", "cnn") for b in ("portable", "xnnpack")]


def _reference_python() -> str | None:
    python = os.environ.get("EDGETORCH_REFERENCE_PYTHON")
    if python:
        return python
    return sys.executable if importlib.util.find_spec("executorch") is not None else None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    _reference_python() is None,
    reason="the reference (executorch==1.5.1) is not installed: set EDGETORCH_REFERENCE_PYTHON to a Python that has "
           "it (tests/data/reference/make_reference_artifacts.py says how to make one)")]


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference_live")
    r = subprocess.run([_reference_python(), str(SCRIPT), str(out), "mlp,cnn"], capture_output=True, text=True,
                       timeout=900, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr[-3000:]
    for name in NAMES:
        gz = out / f"{name}_debug.bin.gz"
        (out / f"{name}_debug.bin").write_bytes(gzip.decompress(gz.read_bytes()))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_live_reference_rows_are_present_and_equal(live: Path, name: str) -> None:
    """Every row of the reference Inspector's MSE and L1 tables is in edgetorch's, gap within 1e-6 relative, and
    the clean program has no culprit: on files the installed reference wrote a moment ago."""
    ins = Inspector(etdump_path=live / f"{name}.etdp", etrecord=live / f"{name}_etrecord.bin",
                    debug_buffer_path=live / f"{name}_debug.bin")
    ref = json.loads((live / f"{name}_gaps.json").read_text())
    assert_reference_rows(ins, ref, name)


@pytest.mark.parametrize("name", NAMES)
def test_live_events_match_the_reference_inspector(live: Path, name: str) -> None:
    """The event table (blocks, names, delegated or not, backend) equals the reference Inspector's, with the
    ETRecord and with the reference's own .pte alone in its place."""
    ref = json.loads((live / f"{name}_gaps.json").read_text())["events"]
    want = [[r[0], r[1], r[3], r[4]] for r in ref]
    for record in (f"{name}_etrecord.bin", f"{name}.pte"):
        ins = Inspector(etdump_path=live / f"{name}.etdp", etrecord=live / record,
                        debug_buffer_path=live / f"{name}_debug.bin")
        ours = [[b.name, e.name, e.is_delegated_op, e.delegate_backend_name] for b in ins.event_blocks
                for e in b.events]
        assert ours == want, (name, record)
