"""Multi-sample gaps: per-op mean / max / p99 equal to the statistics of independent single-sample runs, one
sample's intermediates at a time, rank stability, bundled test suites as samples, argument errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.bundled_program import BundledProgram, MethodTestCase, MethodTestSuite
from edgetorch.devtools.inspector import inspector as inspector_module
from edgetorch.devtools.inspector.culprits import find_culprits
from edgetorch.devtools.inspector.inspector import numeric_gap_over_samples
from edgetorch.errors import InspectorError
from edgetorch.exir import to_edge
from edgetorch.models import get_model
from edgetorch.runtime import Runtime


@pytest.fixture(scope="module")
def mlp():
    model, inputs = get_model("mlp")
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    g = torch.Generator().manual_seed(3)
    samples = [(torch.randn(inputs[0].shape, generator=g),) for _ in range(5)]
    return model, et, rec, samples


def _single(et, rec, sample, tmp_path, i):
    """The gap table of one sample, the ordinary way (its own program load, ETDump files and Inspector)."""
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    program.load_method("forward").execute(*sample)
    dump, dbg = str(tmp_path / f"s{i}.etdp"), str(tmp_path / f"s{i}.bin")
    program.write_etdump_result_to_file(dump, dbg)
    return Inspector(etdump_path=dump, etrecord=rec, debug_buffer_path=dbg).calculate_numeric_gap(
        "MSE", inputs=sample)


def test_statistics_match_single_sample_runs(mlp, tmp_path):
    _, et, rec, samples = mlp
    agg = numeric_gap_over_samples(rec, et, samples)
    singles = [_single(et, rec, s, tmp_path, i) for i, s in enumerate(samples)]
    assert agg.attrs["samples"] == len(samples)
    assert len(agg) == len(singles[0])
    for j in range(len(agg)):
        gaps = np.array([s.iloc[j]["gap"][0] for s in singles])
        rels = np.array([s.iloc[j]["rel_error"] for s in singles], dtype=float)
        assert agg.iloc[j]["gap_mean"] == pytest.approx(gaps.mean(), abs=1e-30)
        assert agg.iloc[j]["gap_max"] == pytest.approx(gaps.max(), abs=1e-30)
        assert agg.iloc[j]["gap_p99"] == pytest.approx(np.percentile(gaps, 99), abs=1e-30)
        assert agg.iloc[j]["rel_error_max"] == pytest.approx(rels.max(), abs=1e-30)
    # the portable backend runs ATen's kernels: a clean program, every sample, no culprit, stable ranking
    assert (agg["culprit_frequency"] == 0).all()
    assert agg.attrs["rank_stability"] == 1.0 and agg.attrs["top1_agreement"] is None


def test_one_sample_in_memory_at_a_time_and_an_input_dependent_fault(mlp, monkeypatch):
    """Every Inspector built during the run sees exactly one execution; an op that is wrong only on some inputs
    is a culprit on those samples only (culprit_frequency), and the aggregate names it."""
    _, et, rec, samples = mlp
    seen = []
    orig = inspector_module.Inspector.__init__

    def spy(self, *a, **k):
        orig(self, *a, **k)
        seen.append(sum(1 for b in self.event_blocks if b.name != "load" and any(
            e.instruction_id is not None for e in b.events)))

    monkeypatch.setattr(inspector_module.Inspector, "__init__", spy)
    first = samples[0][0]
    method_cls = type(Runtime.get().load_program(et.buffer).load_method("forward"))
    orig_exec = method_cls.execute

    def wrong_on_first(self, *args, **kwargs):  # a kernel fault that only the first sample's values trigger
        if self.observer is not None and torch.equal(args[0], first):
            k = next(i.index for i in self.instructions if i.name.startswith("native_call_addmm"))
            j = next(j for j, (kk, _) in enumerate(self._fast) if kk == k)  # the run loop's (index, call) list
            call = self._fast[j][1]
            outs = self.instructions[k].outputs

            def bad():
                r = call()
                self.value(outs[0]).mul_(1.01)
                return r
            self._fast[j] = (k, bad)
            try:
                return orig_exec(self, *args, **kwargs)
            finally:
                self._fast[j] = (k, call)
        return orig_exec(self, *args, **kwargs)

    monkeypatch.setattr(method_cls, "execute", wrong_on_first)
    agg = numeric_gap_over_samples(rec, et, samples)
    assert seen == [1] * len(samples)
    hit = agg[agg["culprit_frequency"] > 0]
    assert len(hit) == 1 and hit.iloc[0]["culprit_frequency"] == pytest.approx(1 / len(samples))
    assert hit.iloc[0]["local_rel_error_max"] == pytest.approx(0.01, rel=1e-3)
    assert hit.iloc[0]["local_rel_error_mean"] == pytest.approx(0.01 / len(samples), rel=1e-3)
    cul = find_culprits(agg, top=3)  # the aggregate is the worst case: find_culprits works on it
    assert list(cul.index) == list(hit.index)


def test_bundled_test_suite_as_samples_and_errors(mlp):
    model, et, rec, samples = mlp
    bp = BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(s, model(*s)) for s in samples[:3]])])
    agg = numeric_gap_over_samples(rec, bp, bp)
    assert agg.attrs["samples"] == 3
    with pytest.raises(InspectorError, match="samples is empty"):
        numeric_gap_over_samples(rec, et, [])
    with pytest.raises(InspectorError, match="samples must be"):
        numeric_gap_over_samples(rec, et, 3)
    with pytest.raises(InspectorError, match="program must be"):
        numeric_gap_over_samples(rec, 3.5, samples)
    with pytest.raises(InspectorError, match="top"):
        numeric_gap_over_samples(rec, et, samples, top=0)
