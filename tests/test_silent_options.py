"""Options accepted for the reference's API do what they say or are refused (issue 27):
``ExecutorchBackendConfig.memory_planning_algo`` plans with the named order, ``print_data_tabular`` prints the
delegate debug data it is asked for; ``EdgeCompileConfig._core_aten_ops_exception_list`` (nothing to except in
edgetorch's verifier) is refused, typed; ``PreprocessResult.data_store_output`` is stored in the program once
per key (a key with two contents is refused, typed)."""

from __future__ import annotations

import io
import itertools

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.errors import ExportError, MemoryPlanError
from edgetorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
from edgetorch.exir.backend import PreprocessResult
from edgetorch.exir.memory_planning import ALGORITHMS, Buffer, plan_memory
from edgetorch.runtime import Runtime
from tests.devtools.test_inspector import _delegate_etdump
from tests.exir.nested_backend import ADD_MUL, NestedBackend, OpTypePartitioner


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(h) + torch.relu(self.b(h * 2))


def _buffers() -> list[Buffer]:
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(40):
        first = int(torch.randint(0, 30, (1,), generator=g))
        out.append(Buffer(k, int(torch.randint(1, 4096, (1,), generator=g)), first,
                          first + int(torch.randint(0, 10, (1,), generator=g))))
    return out


def test_memory_planning_algo_plans_with_the_named_order():
    bufs = _buffers()
    plans = {a: plan_memory(bufs, 64, a) for a in ALGORITHMS}
    assert plans["greedy"].arena_size == min(p.arena_size for p in plans.values())  # the best of every order
    for a in ALGORITHMS[1:]:
        assert plans[a].algorithm.split("+")[0] == a
        for b1 in bufs:  # no two live buffers overlap (checked independently of the planner)
            for b2 in bufs:
                if b1.key < b2.key and b1.first <= b2.last and b2.first <= b1.last:
                    o1, o2 = plans[a].offsets[b1.key], plans[a].offsets[b2.key]
                    assert o1 + b1.size <= o2 or o2 + b2.size <= o1


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_a_program_planned_with_each_algorithm_runs_like_eager(algo):
    model, x = _Net().eval(), torch.randn(3, 16)
    et = to_edge(torch.export.export(model, (x,))).to_executorch(ExecutorchBackendConfig(memory_planning_algo=algo))
    used = et.memory_plan_report()["forward"]["algorithm"].split("+")[0]  # "+best_fit" when that fit won
    assert used in ALGORITHMS[1:] if algo == "greedy" else used == algo
    out = Runtime.get().load_program(et.buffer).load_method("forward").execute(x)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, model(x), rtol=1e-6, atol=1e-6)


def test_an_unknown_memory_planning_algo_is_refused():
    with pytest.raises(MemoryPlanError, match="memory_planning_algo 'naive' is unknown"):
        ExecutorchBackendConfig(memory_planning_algo="naive")
    with pytest.raises(MemoryPlanError, match="unknown memory planning algorithm"):
        plan_memory(_buffers(), 64, "naive")


def test_a_core_aten_exception_list_is_refused():
    assert EdgeCompileConfig(_core_aten_ops_exception_list=[])._core_aten_ops_exception_list == []
    with pytest.raises(ExportError, match="_core_aten_ops_exception_list"):
        EdgeCompileConfig(_core_aten_ops_exception_list=[torch.ops.aten.add.Tensor])


def _with_store(monkeypatch, stores):
    real = NestedBackend.preprocess.__func__
    calls = itertools.cycle(stores)

    def with_store(cls, edge_program, compile_specs):
        res = real(cls, edge_program, compile_specs)
        return PreprocessResult(res.processed_bytes, res.debug_handle_map, data_store_output=next(calls))

    monkeypatch.setattr(NestedBackend, "preprocess", classmethod(with_store))


def test_data_store_output_is_stored_once_per_key_and_a_conflict_is_refused_naming_the_key(monkeypatch):
    from edgetorch.exir.backend.backend_details import NamedDataConflictError, NamedDataStore
    from edgetorch.formats import program as pf

    store = NamedDataStore()
    store.add_named_data("w", b"x" * 100)
    store.add_named_data("w", b"x" * 100)  # same key, same bytes: once
    _with_store(monkeypatch, [store, {"w": b"x" * 100, "v": b"y" * 10}])
    model, x = _Net().eval(), torch.randn(3, 16)
    ep = torch.export.export(model, (x,))
    prog = to_edge_transform_and_lower({"a": ep, "b": ep}, partitioner=[OpTypePartitioner(ADD_MUL)]).to_executorch()
    defn = pf.decode_flatbuffer(prog.buffer[pf.HEADER_SIZE:])
    assert [(k, size) for k, _, size in defn.named_data] == [("v", 10), ("w", 100)]
    seg = pf.read_header(prog.buffer).segment_offset
    assert all(off % 64 == 0 for _, off, _ in defn.named_data)
    assert [prog.buffer[seg + off:seg + off + size] for _, off, size in defn.named_data] == [b"y" * 10, b"x" * 100]
    torch.testing.assert_close(Runtime.get().load_program(prog.buffer).load_method("a").execute([x])[0], model(x))
    with pytest.raises(NamedDataConflictError, match="'w'"):
        store.add_named_data("w", b"z")
    _with_store(monkeypatch, [{"w": b"x"}, {"w": b"z"}])
    with pytest.raises(NamedDataConflictError, match="named data 'w'"):
        to_edge_transform_and_lower({"a": ep, "b": ep}, partitioner=[OpTypePartitioner(ADD_MUL)]).to_executorch()


def test_print_data_tabular_prints_the_delegate_debug_data_when_asked():
    insp = Inspector(etdump_data=_delegate_etdump(), delegate_metadata_parser=lambda b: dict([b.decode().split("=")]))
    plain, asked = io.StringIO(), io.StringIO()
    insp.print_data_tabular(file=plain)
    insp.print_data_tabular(file=asked, include_delegate_debug_data=True)
    assert "delegate_debug_metadata" not in plain.getvalue()
    assert "delegate_debug_metadata" in asked.getvalue() and "{'k': 'v'}" in asked.getvalue()
