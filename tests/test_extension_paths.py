"""The four extension paths of docs/architecture.md ("Adding to edgetorch, step by step"), each followed once as a
newcomer would, with everything defined here in the test suite:

- a **backend** (``toy_bf16``: its partitions are JSON lists of ATen calls that its runtime side runs with plain
  torch in bfloat16): export -> lower -> run traced -> Inspector -> gap, the in-delegate rows mapped to their ops;
- a **metric** (``TOY_MAX_REL``) registered with ``register_comparator`` and used as ``distance=``, its figure
  checked against the same formula computed here on eager PyTorch and the runtime's output;
- a **recipe** (``ToyRecipeType.BF16``) registered with ``register_backend_recipe_provider`` and exported;
- an **ETDump field**: every field of ``formats/schema/etdump.fbs`` is a field of the dataclass its reader and
  writer fill, and survives a round trip with a non-default value (a field added to the schema and forgotten in
  ``formats/etdump.py`` fails here, naming it).
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector.comparators import (
    _METRICS,
    LARGER_IS_WORSE,
    NumericalComparatorBase,
    register_comparator,
)
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.exir.backend import (
    BackendDetails,
    DelegationSpec,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    register_backend_details,
)
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.export import ExportRecipe, export
from edgetorch.export.recipe import (
    BackendRecipeProvider,
    LoweringRecipe,
    RecipeType,
    recipe_registry,
    register_backend_recipe_provider,
)
from edgetorch.formats import etdump as ed
from edgetorch.formats.alignment import debug_bytes
from edgetorch.formats.dtypes import dtype_code
from edgetorch.formats.handles import DELEGATE_CALL, IN_DELEGATE, KERNEL
from edgetorch.runtime import Runtime
from edgetorch.runtime.backend_registry import register_backend

TOY = "toy_bf16"
_TOY_OPS = {torch.ops.aten.relu.default, torch.ops.aten.sigmoid.default, torch.ops.aten.mul.Tensor,
            torch.ops.aten.add.Tensor}


# -- the backend, ahead of time: a partitioner and preprocess --------------------------------------------------

class ToyPartitioner(Partitioner):
    """Tags each maximal run of consecutive supported nodes (a convex partition) for the toy backend."""

    def partition(self, exported_program):
        tags, run = {}, None
        for n in exported_program.graph.nodes:
            if n.op == "call_function" and n.target in _TOY_OPS and get_debug_handle(n) is not None:
                if run is None:
                    run = f"toy{len(tags)}"
                    tags[run] = DelegationSpec(TOY, [])
                n.meta["delegation_tag"] = run
            else:
                run = None
        return PartitionResult(exported_program, tags)


def _arg(a, names: dict):
    if isinstance(a, torch.fx.Node):
        return {"ref": names[a.name]}
    if isinstance(a, (int, float, bool)):
        return a
    raise ValueError(f"the toy backend cannot take the argument {a!r}")


@register_backend_details
class ToyBackend(BackendDetails):
    """The blob: the partition's ATen calls as JSON; backend debug id = the call's position in it."""

    backend_id = TOY

    @classmethod
    def preprocess(cls, edge_program, compile_specs):
        names, calls, dmap, logged = {}, [], {}, []
        for n in edge_program.graph.nodes:
            if n.op == "placeholder":
                names[n.name] = len(names)
            elif n.op == "call_function":
                t = n.target
                calls.append({"op": [t.namespace, t._opname, t._overloadname],
                              "args": [_arg(a, names) for a in n.args]})
                names[n.name] = len(names)
                dmap[len(calls) - 1] = (get_debug_handle(n),)
                logged.append(n.meta["val"].numel() * n.meta["val"].element_size())
            elif n.op == "output":
                outs = [names[a.name] for a in n.args[0]]
        blob = json.dumps({"inputs": sum(1 for n in edge_program.graph.nodes if n.op == "placeholder"),
                           "calls": calls, "outputs": outs}).encode()
        # what one traced call logs (each call's value), declared once: emission adds it to the plan's figure
        return PreprocessResult(blob, dmap, debug_buffer_bytes=debug_bytes(logged))


# -- the backend, at run time: it imports only torch and the runtime ----------------------------------------

class ToyRuntime:
    name = TOY

    def init(self, processed, compile_specs):
        return json.loads(bytes(processed))

    def execute(self, handle, inputs, outputs, tracer=None):
        env = [x.to(torch.bfloat16) for x in inputs]
        log = getattr(tracer, "log_delegate_output", None)
        for i, call in enumerate(handle["calls"]):
            ns, op, overload = call["op"]
            fn = getattr(getattr(getattr(torch.ops, ns), op), overload)
            args = [env[a["ref"]] if isinstance(a, dict) else a for a in call["args"]]
            env.append(fn(*args))
            if log is not None:
                log(i, env[-1].float())  # the id is a key of the debug_handle_map preprocess declared
        for o, k in zip(outputs, handle["outputs"]):
            o.copy_(env[k])


register_backend(ToyRuntime())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x)) * 0.5 + 1.0  # relu, mul, add: one toy partition
        return torch.sigmoid(self.fc2(h))  # sigmoid: another


# -- the metric ---------------------------------------------------------------------------------------------

def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / torch.maximum(a.abs().max(), b.abs().max()).clamp_min(1e-30)).item()


class ToyMaxRel(NumericalComparatorBase):
    """The largest element-wise difference relative to the larger magnitude (a discrepancy: larger is worse)."""

    name = "TOY_MAX_REL"
    larger_is_worse = True

    def element_compare(self, a: torch.Tensor, b: torch.Tensor) -> float:
        return _max_rel(a, b)


@pytest.fixture
def toy_metric():
    register_comparator(ToyMaxRel)
    yield ToyMaxRel.name
    _METRICS.pop(ToyMaxRel.name, None)
    LARGER_IS_WORSE.pop(ToyMaxRel.name, None)


def test_a_toy_backend_and_a_toy_metric_from_export_to_gap(tmp_path, toy_metric):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 16)
    et = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[ToyPartitioner()],
                                     generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs([(x,)])
    rec.save(tmp_path / "rec.bin")
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    assert [d.backend_id for d in prog.plan("forward").delegates] == [TOY, TOY]
    got = prog.load_method("forward").execute(x)[0]
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)  # bfloat16 inside the delegates
    assert prog.tracer.sink.used_bytes <= prog.plan("forward").debug_buffer_bytes  # what preprocess declared
    prog.write_etdump_result_to_file(tmp_path / "r.etdp", tmp_path / "r.bin")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        insp = Inspector(etdump_path=tmp_path / "r.etdp", etrecord=tmp_path / "rec.bin",
                         debug_buffer_path=tmp_path / "r.bin")
        df = insp.calculate_numeric_gap(distance=toy_metric)
    assert set(df["kind"]) >= {KERNEL, DELEGATE_CALL, IN_DELEGATE}
    inner = df[df["kind"] == IN_DELEGATE]
    assert len(inner) == 4  # relu, mul, add | sigmoid: one row per backend debug id
    ops = [str(o) for ops in inner["aot_ops"] for o in ops]
    assert any("relu" in o for o in ops) and any("sigmoid" in o for o in ops)
    last = df[df["kind"] == IN_DELEGATE].iloc[-1]  # the sigmoid, the program's output
    gap = last["gap"]
    gap = max(gap) if isinstance(gap, (list, tuple)) else float(gap)
    assert gap == pytest.approx(_max_rel(want, got), rel=1e-3, abs=1e-6)  # the metric, computed here
    assert 1e-4 < gap < 2e-2  # bfloat16's rounding, seen through the toy metric


# -- the recipe ---------------------------------------------------------------------------------------------

class ToyRecipeType(RecipeType):
    BF16 = "toy_bf16"

    @classmethod
    def get_backend_name(cls) -> str:
        return TOY


class ToyRecipeProvider(BackendRecipeProvider):
    @property
    def backend_name(self) -> str:
        return TOY

    def get_supported_recipes(self):
        return list(ToyRecipeType)

    def create_recipe(self, recipe_type, **kwargs):
        if recipe_type not in list(ToyRecipeType):
            return None
        return ExportRecipe(name=recipe_type.value, lowering_recipe=LoweringRecipe(partitioners=[ToyPartitioner()]))


@pytest.fixture
def toy_recipes():
    register_backend_recipe_provider(ToyRecipeProvider())
    yield
    with recipe_registry._lock:
        recipe_registry._providers.pop(TOY, None)


def test_a_toy_recipe_is_registered_and_exported(toy_recipes):
    assert TOY in recipe_registry.list_backends()
    torch.manual_seed(1)
    model, x = Net().eval(), torch.randn(2, 16)
    session = export(model, [(x,)], ExportRecipe.get_recipe(ToyRecipeType.BF16))
    prog = Runtime.get().load_program(session.get_pte_buffer())
    assert [d.backend_id for d in prog.plan("forward").delegates] == [TOY, TOY]
    with torch.no_grad():
        torch.testing.assert_close(prog.load_method("forward").execute(x)[0], model(x), rtol=2e-2, atol=2e-2)


# -- an ETDump field ----------------------------------------------------------------------------------------

_SCHEMA = Path(__file__).resolve().parents[1] / "src" / "edgetorch" / "formats" / "schema" / "etdump.fbs"
#: schema table -> the dataclass of formats/etdump.py that holds it (TensorList is Value.tensor_list, a list)
_TABLES = {"Tensor": ed.Tensor, "Value": ed.Value, "ProfileEvent": ed.ProfileEvent, "DebugEvent": ed.DebugEvent,
           "Event": ed.Event, "RunData": ed.RunData, "ETDump": ed.ETDump}


def _schema_fields() -> dict[str, list[str]]:
    tables, cur = {}, None
    for line in _SCHEMA.read_text().splitlines():
        m = re.match(r"\s*table\s+(\w+)", line)
        if m:
            cur = tables.setdefault(m.group(1), [])
        elif cur is not None and (f := re.match(r"\s+(\w+)\s*:", line)):
            cur.append(f.group(1))
        elif line.startswith("}"):
            cur = None
    return tables


def _every_field_set() -> ed.ETDump:
    t = ed.Tensor(dtype_code(torch.float32), [2, 3], [3, 1], 64, 24)  # at offset 64 of the debug buffer
    values = [ed.Value(ed.ValueType.Tensor, tensor=t, output=True),
              ed.Value(ed.ValueType.TensorList, tensor_list=[dataclasses.replace(t, offset=128)]),
              ed.Value(ed.ValueType.Int, int_value=-7), ed.Value(ed.ValueType.Float, float_value=0.5),
              ed.Value(ed.ValueType.Double, double_value=0.25), ed.Value(ed.ValueType.Bool, bool_value=True),
              ed.Value(ed.ValueType.String, string_value="s")]
    events = [ed.Event(profile_event=ed.ProfileEvent("DELEGATE_CALL", 0, 3, 5, "", b"\x01meta", 10, 20)),
              ed.Event(profile_event=ed.ProfileEvent("inner", 0, 3, -1, "inner", b"", 11, 12))]
    events += [ed.Event(debug_event=ed.DebugEvent(0, 3, 5 if j == 0 else -1, "d" if j == 1 else "", v, j, f"n{j}"))
               for j, v in enumerate(values)]
    run = ed.RunData(ed.EXECUTE_BLOCK, "forward", 2, events)
    return ed.ETDump(version=ed.ETDUMP_SCHEMA_VERSION, program_hash="ab" * 32, run_data=[run],
                     debug_buffer_bytes=192, run_id="cd" * 16, debug_buffer_crc32=12345)


def test_every_etdump_schema_field_is_read_and_written():
    """Adding an ETDump field (docs/architecture.md): schema, dataclass, writer and reader, checked together."""
    schema = _schema_fields()
    assert set(_TABLES) <= set(schema), "a dataclass-backed table left the schema: update _TABLES"
    for table, cls in _TABLES.items():
        missing = [f for f in schema[table] if f not in {x.name for x in dataclasses.fields(cls)}]
        assert missing == [], f"etdump.fbs {table}.{missing} has no field in formats/etdump.py {cls.__name__}"
    dump = _every_field_set()
    back = ed.deserialize_etdump(ed.serialize_etdump(dump))
    for f in schema["ETDump"]:
        assert getattr(back, f) == getattr(dump, f), f"ETDump.{f} does not survive a round trip"
    ev_back = back.run_data[0].events
    assert ev_back == dump.run_data[0].events, "an event field does not survive a round trip"
    assert (back.run_data[0].name, back.run_data[0].method, back.run_data[0].bundled_input_index) == \
        (ed.EXECUTE_BLOCK, "forward", 2)
