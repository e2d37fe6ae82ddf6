"""Memory planning: no two live tensors share bytes, aliases keep their root alive, arena is tight."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from edgetorch.exir.memory_planning import Buffer, plan_memory
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime
from tests.conftest import lower


def _check_no_overlap(buffers: list[Buffer], offsets: dict[int, int]) -> None:
    for i, a in enumerate(buffers):
        for b in buffers[i + 1:]:
            if a.size == 0 or b.size == 0:
                continue
            if a.first <= b.last and b.first <= a.last:
                oa, ob = offsets[a.key], offsets[b.key]
                assert oa + a.size <= ob or ob + b.size <= oa, (a, b, oa, ob)


def test_random_lifetimes_never_overlap_and_respect_alignment():
    rng = random.Random(0)
    for _ in range(20):
        bufs = []
        for k in range(60):
            first = rng.randrange(0, 50)
            bufs.append(Buffer(k, rng.choice([0, 4, 100, 1000, 4096, 10000]), first, first + rng.randrange(0, 15)))
        plan = plan_memory(bufs, 64)
        _check_no_overlap(bufs, plan.offsets)
        assert all(off % 64 == 0 for off in plan.offsets.values())
        assert plan.arena_size >= plan.peak_live_bytes
        assert all(plan.offsets[b.key] + b.size <= plan.arena_size for b in bufs)


def test_chain_reuses_memory():
    # a chain of equal tensors, each dying right after the next is made: two slots suffice
    bufs = [Buffer(k, 1024, k, k + 1) for k in range(10)]
    plan = plan_memory(bufs, 64)
    assert plan.arena_size == 2 * 1024 == plan.peak_live_bytes


class AliasTrap(torch.nn.Module):
    """Views of multi-output ops whose base is not used again directly, read long after."""

    def forward(self, x):
        base = x * 2
        a, b = torch.split(base, [3, 5], dim=1)  # views of `base`; `base` itself is never read again
        ln = F.layer_norm(x, (8,))  # native_layer_norm -> getitem -> view
        ln_view = ln.view(4, 2, 4).transpose(0, 1)
        y = a + 1
        for _ in range(6):  # many short-lived temporaries that want to reuse freed memory
            y = torch.cat([y * 1.5, y - 1], dim=1)[:, :3].contiguous() + y
        mx, idx = torch.max(x, dim=1)  # multi-output op; use only a view of `idx` late
        idx_v = idx.view(4, 1)
        z = y.sum() + b.sum(dim=1).view(4, 1) * 0.5
        return z + ln_view.sum() + idx_v.float() + mx.view(4, 1)


def test_planner_trap_model_is_correct():
    model = AliasTrap()
    x = torch.randn(4, 8)
    et = lower(model, (x,))
    m = Runtime.get().load_program(et.buffer).load_method("forward")
    for _ in range(3):
        xi = torch.randn(4, 8)
        torch.testing.assert_close(m.execute_structured(xi), model(xi), rtol=0, atol=1e-5)
    # structural check: planned tensors with intersecting lifetimes never share bytes
    report = et.memory_plan_report()["forward"]
    assert report["arena_bytes"] <= report["peak_live_bytes"]
    plan = et.program.plan("forward")
    planned = [v for v in plan.values if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED]
    assert all(v.arena_offset % 64 == 0 for v in planned)


def test_arena_is_no_larger_than_live_bytes_at_peak_on_zoo_models():
    from edgetorch.models import get_model

    for name in ("mlp", "small_cnn", "transformer_encoder", "vit_tiny", "multi_output"):
        model, inputs = get_model(name)
        report = lower(model, inputs).memory_plan_report()["forward"]
        assert 0 < report["arena_bytes"] <= report["peak_live_bytes"], (name, report)


def test_verifier_derives_the_planner_lifetimes_from_instructions():
    """live_ranges sees the same lifetimes the planner was given: every pair it calls live together is apart."""
    from edgetorch.exir.memory_planning import live_ranges

    et = lower(AliasTrap(), (torch.randn(4, 8),))
    plan = et.program.plan("forward")
    spans = live_ranges(plan)
    planned = [i for i, v in enumerate(plan.values)
               if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED and v.nbytes]
    assert set(planned) <= set(spans)
    assert all(spans[i][0] == -1 for i in plan.inputs)
    assert all(spans[i][1] == len(plan.instructions) for i in plan.outputs if i in spans)
    bufs = [Buffer(i, plan.values[i].nbytes, *spans[i]) for i in planned]
    _check_no_overlap(bufs, {i: plan.values[i].arena_offset for i in planned})


def test_to_executorch_refuses_a_plan_with_overlapping_live_tensors(monkeypatch):
    """A planner bug (everything at offset 0) is caught at emission with an error naming both values."""
    from edgetorch.errors import MemoryPlanError
    from edgetorch.exir import emit, memory_planning

    def broken(buffers, alignment=64, algorithm="greedy"):
        plan = memory_planning.plan_memory(buffers, alignment, algorithm)
        return memory_planning.MemoryPlan({k: 0 for k in plan.offsets}, plan.arena_size, plan.peak_live_bytes, "x")

    monkeypatch.setattr(emit, "plan_memory", broken)
    with pytest.raises(MemoryPlanError, match=r"method 'forward': values \d+ .* share arena bytes"):
        lower(AliasTrap(), (torch.randn(4, 8),))


def test_to_executorch_refuses_a_tensor_outside_the_arena(monkeypatch):
    from edgetorch.errors import MemoryPlanError
    from edgetorch.exir import emit, memory_planning

    def short(buffers, alignment=64, algorithm="greedy"):
        plan = memory_planning.plan_memory(buffers, alignment, algorithm)
        return memory_planning.MemoryPlan(plan.offsets, 64, plan.peak_live_bytes, "x")

    monkeypatch.setattr(emit, "plan_memory", short)
    with pytest.raises(MemoryPlanError, match="outside the 64-byte arena"):
        lower(AliasTrap(), (torch.randn(4, 8),))
