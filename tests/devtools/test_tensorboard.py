"""``Inspector.write_tensorboard_artifact`` (issue 26): the event files a real writer library wrote hold each
event's average time and each op's gap, equal to the Inspector's own tables; without a writer library the call
says what to install. ``reference_graph_name`` picks the gap's default reference graph."""

from __future__ import annotations

import glob
import struct
import sys

import pytest

from edgetorch.devtools import Inspector
from edgetorch.errors import InspectorError
from tests.devtools.test_inspector import _pipeline


def _records(path: str) -> list[bytes]:
    """The records of a TFRecord file (length, length CRC, data, data CRC): read back, as TensorBoard does."""
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos + 12:pos + 12 + n])
        pos += 12 + n + 4
    return out


def _scalars(logdir: str) -> dict[str, dict[int, float]]:
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    got: dict[str, dict[int, float]] = {}
    files = glob.glob(f"{logdir}/events.out.tfevents.*")
    assert files, "no event file written"
    for rec in (r for f in files for r in _records(f)):
        ev = event_pb2.Event.FromString(rec)
        for v in ev.summary.value:
            if v.HasField("simple_value"):
                got.setdefault(v.tag, {})[ev.step] = v.simple_value
    return got


@pytest.fixture(scope="module")
def mlp_inspector(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlp")
    _, _, _, rec_path, dump, dbg = _pipeline("mlp", str(out))
    return Inspector(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg)


def test_event_files_hold_the_profile_and_the_gaps(mlp_inspector, tmp_path):
    pytest.importorskip("tensorboardX")
    written = mlp_inspector.write_tensorboard_artifact(tmp_path / "tb")
    scalars = _scalars(str(tmp_path / "tb"))
    df = mlp_inspector.to_dataframe(include_units=False)
    block = mlp_inspector.event_blocks[-1]
    rows = df[(df["event_block_name"] == block.name) & df["avg"].notna()]
    rows = rows[~rows["event_name"].isin(["Method::init", "Program::load_method", "Method::execute"])]
    assert len(rows) > 3 and written["latency"] >= len(rows)
    seen: dict[str, int] = {}
    for name, avg in zip(rows["event_name"], rows["avg"]):  # one step per occurrence of a name
        step = seen[name] = seen.get(name, -1) + 1
        tag = f"latency_ms/{block.name}/{name}".replace(" ", "_")
        assert scalars[tag][step] == pytest.approx(avg, rel=1e-6)  # float32 in the event file
    gaps = mlp_inspector.calculate_numeric_gap("MSE", method="forward")
    gap_tags = {t: v for t, v in scalars.items() if t.startswith("numeric_gap/forward/")}
    assert written["numeric_gap"] >= len(gaps) and len(gap_tags) > 0
    for step, (ops, gap) in enumerate(zip(gaps["aot_ops"], gaps["gap"])):
        op = ",".join(map(str, ops)) if isinstance(ops, (list, tuple)) else str(ops)
        value = gap[0] if isinstance(gap, (list, tuple)) else gap
        tag = "numeric_gap/forward/" + "".join(c if c.isalnum() or c in "._-:" else "_" for c in op)
        assert scalars[tag][step] == pytest.approx(value, abs=1e-12)  # a clean portable program: 0


def test_gaps_false_writes_the_profile_only(mlp_inspector, tmp_path):
    pytest.importorskip("tensorboardX")
    written = mlp_inspector.write_tensorboard_artifact(tmp_path / "tb", gaps=False)
    assert written["numeric_gap"] == 0 and written["latency"] > 0
    assert not [t for t in _scalars(str(tmp_path / "tb")) if "gap" in t]


def test_without_a_writer_library_the_error_says_what_to_install(mlp_inspector, tmp_path, monkeypatch):
    for mod in ("tensorboardX", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, mod, None)  # import raises ImportError
    with pytest.raises(InspectorError, match="pip install tensorboardX"):
        mlp_inspector.write_tensorboard_artifact(tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


def test_reference_graph_name_is_the_gaps_default_reference(tmp_path):
    _, _, _, rec_path, dump, dbg = _pipeline("mlp", str(tmp_path))
    kw = dict(etdump_path=dump, etrecord=rec_path, debug_buffer_path=dbg)
    default = Inspector(**kw).calculate_numeric_gap("MSE")
    assert Inspector(**kw, reference_graph_name="edge_dialect_graph_module").reference_graph_name \
        == "edge_dialect_graph_module"
    edge = Inspector(**kw, reference_graph_name="edge_dialect_exported_program").calculate_numeric_gap("MSE")
    assert edge.attrs["reference_graph"] == "edge_dialect_exported_program"
    assert default.attrs["reference_graph"] in ("exported_program", "edge_dialect_exported_program")
    assert list(edge["gap"]) == list(default["gap"])  # a clean program: the same zeros from either graph
    with pytest.raises(InspectorError, match="reference_graph_name 'no_such_graph'"):
        Inspector(**kw, reference_graph_name="no_such_graph")
