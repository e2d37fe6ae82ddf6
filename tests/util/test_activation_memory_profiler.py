"""``edgetorch.util.activation_memory_profiler.generate_memory_trace`` (issue 26): the Chrome trace of a method's
memory plan. Every planned tensor's offset, bytes and live steps are checked against lifetimes recomputed here from
the edge graph (each node live from the instruction that computes it to its last user's), and the file against
Chrome's trace-event format."""

from __future__ import annotations

import json

import pytest
import torch

from edgetorch.errors import MethodNotFoundError
from edgetorch.exir import ExecutorchBackendConfig, to_edge
from edgetorch.exir.passes import MemoryPlanningPass
from edgetorch.formats import program as pf
from edgetorch.util.activation_memory_profiler import MemoryTraceError, generate_memory_trace


class _Chain(torch.nn.Module):
    """Ops without views, so that each graph node is one instruction; ``act`` gives a module path."""

    def __init__(self) -> None:
        super().__init__()
        self.act = torch.nn.Tanh()

    def forward(self, x):
        a = torch.relu(x)
        b = torch.sigmoid(a)
        c = a * b
        d = self.act(c)
        return c + d, b


@pytest.fixture(scope="module")
def program():
    return to_edge(torch.export.export(_Chain(), (torch.randn(4, 5),))).to_executorch()


def _trace(et, tmp_path, **kw) -> list[dict]:
    path = tmp_path / "trace.json"
    generate_memory_trace(et, str(path), **kw)
    root = json.loads(path.read_text())
    assert isinstance(root, dict) and isinstance(root["traceEvents"], list)
    for e in root["traceEvents"]:  # Chrome's complete events
        assert e["ph"] == "X" and e["cat"] == "memory_allocation" and isinstance(e["name"], str)
        assert all(isinstance(e[k], int) and e[k] >= 0 for k in ("ts", "dur", "pid", "tid"))
    return root["traceEvents"]


def _node_lifetimes(et) -> dict[str, tuple[int, int]]:
    """Each graph node -> [its instruction (-1: an input), its last user's instruction (an output: the end)]."""
    plan = et.program.plans[0]
    at = {ins.node_name: i for i, ins in enumerate(plan.instructions)}
    end = len(plan.instructions)
    spans = {}
    for node in et.exported_program().graph.nodes:
        if node.op in ("placeholder", "call_function"):
            first = -1 if node.op == "placeholder" else at[node.name]
            spans[node.name] = (first, max([first, *(end if u.op == "output" else at[u.name] for u in node.users)]))
    return spans


def test_every_planned_tensor_is_drawn_at_its_offset_over_the_steps_the_graph_keeps_it_live(program, tmp_path):
    events = _trace(program, tmp_path, enable_memory_offsets=True)
    plan = program.program.plans[0]
    spans = _node_lifetimes(program)
    # the nodes whose results each planned value holds, from the plan's instruction outputs and inputs
    holders: dict[int, list[str]] = {vid: [name] for vid, name in zip(plan.inputs, plan.input_names)}
    for ins in plan.instructions:
        for o in ins.call.outputs:
            holders.setdefault(o, []).append(ins.node_name)
    planned = {k: v for k, v in enumerate(plan.values)
               if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED and v.nbytes > 0}
    assert set(planned) == {e["args"]["value"] for e in events} and len(planned) >= 4
    for vid, v in planned.items():
        mine = [e for e in events if e["args"]["value"] == vid]
        assert {(e["ts"], e["dur"], e["args"]["bytes"]) for e in mine} == {(v.arena_offset, v.nbytes, v.nbytes)}
        assert v.nbytes == 4 * 5 * 4  # every tensor of the model is a 4x5 float32
        expected = {}  # step -> the node whose result the slot holds then
        for name in holders[vid]:
            first, last = spans[name]
            expected.update({t: name for t in range(first, last + 1)})
        assert {e["args"]["instruction"]: e["name"] for e in mine} == expected
    # one thread per step, in order; no two tensors live on one thread share bytes, and none leaves the arena
    steps = sorted({e["args"]["instruction"] for e in events})
    assert all(e["tid"] == steps.index(e["args"]["instruction"]) for e in events)
    for tid in range(len(steps)):
        spans_at = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == tid)
        assert all(a[1] <= b[0] for a, b in zip(spans_at, spans_at[1:]))
        assert spans_at[-1][1] <= plan.arena_size


def test_the_metadata_names_the_op_module_and_source(program, tmp_path):
    events = _trace(program, tmp_path, enable_memory_offsets=True)
    tanh = [e for e in events if e["name"] == "tanh"]
    assert tanh and all(e["args"]["op_name"] == "aten::tanh.out" and e["args"]["fqn"] == "act"
                        and "self.act(c)" in e["args"]["source"] and e["args"]["Memory ID"] == 1 for e in tanh)
    assert {e["args"]["op_name"] for e in events if e["name"] == "x"} == {"x"}
    assert all(e["args"] == {} for e in _trace(program, tmp_path, ommit_metadata=True))


def test_without_offsets_the_tensors_of_a_step_are_stacked(program, tmp_path):
    events = _trace(program, tmp_path)
    for tid in {e["tid"] for e in events}:
        row = [e for e in events if e["tid"] == tid]
        assert [e["ts"] for e in row] == [sum(r["dur"] for r in row[:i]) for i in range(len(row))]


def test_inputs_left_out_of_the_arena_are_not_drawn(tmp_path):
    config = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False))
    et = to_edge(torch.export.export(_Chain(), (torch.randn(4, 5),))).to_executorch(config)
    names = {e["name"] for e in _trace(et, tmp_path)}
    assert "x" not in names and "relu" in names


def test_refusals(program, tmp_path):
    with pytest.raises(MemoryTraceError, match="ExecutorchProgramManager") as err:
        generate_memory_trace(program.buffer, str(tmp_path / "t.json"))
    assert isinstance(err.value, ValueError)
    with pytest.raises(MethodNotFoundError, match="'decode'.*forward"):
        generate_memory_trace(program, str(tmp_path / "t.json"), method_name="decode")
    assert not (tmp_path / "t.json").exists()
