"""The reference ExecuTorch artifacts under ``tests/data/reference`` (issue 26); debug buffers are committed
gzipped (the reference writes the whole buffer, zero tail included) and unpacked once per process here."""

from __future__ import annotations

import atexit
import functools
import gzip
import shutil
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "reference"
FAULTS = DATA / "faults"


@functools.cache
def _unpacked() -> Path:
    d = Path(tempfile.mkdtemp(prefix="edgetorch_ref_"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def unpack(gz: Path) -> Path:
    """The raw file of a gzipped artifact (unpacked on first use)."""
    out = _unpacked() / gz.parent.name / gz.name.removesuffix(".gz")
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(gzip.decompress(gz.read_bytes()))
    return out


def debug_buffer(name: str) -> Path:
    """The debug buffer file of the clean reference run ``name`` (e.g. ``"cnn_xnnpack"``)."""
    return unpack(DATA / f"{name}_debug.bin.gz")


def paths(name: str) -> dict[str, str]:
    """The Inspector's arguments for the clean reference run ``name``."""
    return {"etdump_path": str(DATA / f"{name}.etdp"), "etrecord": str(DATA / f"{name}_etrecord.bin"),
            "debug_buffer_path": str(debug_buffer(name))}


def assert_reference_rows(ins, ref: dict, name: str) -> None:  # noqa: ANN001 - an Inspector
    """Every row of the reference Inspector's MSE and L1 tables (``ref``: a ``<name>_gaps.json``) is in ``ins``'s
    table, gap within 1e-6 relative, and the clean program has no culprit."""
    import pytest

    for metric in ("MSE", "L1"):
        df = ins.calculate_numeric_gap(metric)
        ours = {tuple(sorted(set(h))): g for h, g in zip(df["aot_debug_handle"], df["gap"])}
        assert ref["gaps"][metric], name
        for row in ref["gaps"][metric]:
            key = tuple(sorted(set(row["aot_debug_handle"])))
            assert key in ours, (name, metric, key, sorted(ours))
            assert ours[key][0] == pytest.approx(row["gap"][0], rel=1e-6, abs=0), (name, metric, key)
        if metric == "MSE":
            assert len(ins.find_culprits(df)) == 0, name


def handle_reading(rec, param: str) -> int:
    """The debug handle of the ATen op that reads parameter ``param`` of a reference record's program (an
    independent walk of the program: where a planted fault in ``param`` first shows)."""
    from edgetorch.exir.debug_handles import get_debug_handle

    ep = rec.exported_programs["forward"]
    placeholder = {v: k for k, v in ep.graph_signature.inputs_to_parameters.items()}[param]
    node = next(n for n in ep.graph.nodes if n.name == placeholder)
    return next(get_debug_handle(u) for u in node.users if get_debug_handle(u))
