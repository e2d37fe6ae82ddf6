"""CI part of the mutation fuzzer (``fuzzlib``): a few hundred seeded mutants of every artifact kind, each kind
in worker subprocesses (a crash or hang is caught and names its mutant). Every mutant must be refused with a
typed edgetorch error or give the original outputs / gap table: no generic exception, crash, hang, silent
output change under ``Verification.Full``, shape disagreement under InternalConsistency, silent gap change from
a corrupted ETRecord or debug buffer, or ``edgetorch run`` exit 3. Long runs: ``bench/fuzz_artifacts.py``."""

from __future__ import annotations

import json

import pytest

from tests.fuzz import fuzzlib

SEED = 20261124
# mutants per kind: the gap-table kinds run the Inspector per mutant (~50 ms), programs load in ~2 ms
MUTANTS = {"pte": 300, "pte_ort": 300, "etdp": 300, "debug_buffer": 300, "etrecord": 150, "bpte": 200}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("fuzz"))
    fuzzlib.build_artifacts(folder)
    return folder


@pytest.mark.parametrize("kind", fuzzlib.KINDS)
def test_mutants_are_refused_with_typed_errors_or_change_nothing(artifacts, kind):
    report = fuzzlib.run_batch(artifacts, kind, SEED, 0, MUTANTS[kind], timeout=240.0)
    assert len(report.results) == MUTANTS[kind]
    assert not report.failures, "\n".join(json.dumps(f)[:600] for f in report.failures[:10])
    counts = report.counts
    # the fuzzer does reach the checks: most mutants are refused, and the typed errors are real ones
    assert counts["typed"] >= MUTANTS[kind] // 2, dict(counts)


def test_mutants_are_deterministic(artifacts):
    original = open(f"{artifacts}/{fuzzlib.FILES['pte']}", "rb").read()
    a = [fuzzlib.mutate("pte", original, SEED, i) for i in range(20)]
    assert a == [fuzzlib.mutate("pte", original, SEED, i) for i in range(20)]
    assert len({m for m, _ in a}) > 15  # and different from one another
    kinds = {w.split("@")[0].split(":")[0] for k in fuzzlib.KINDS for i in range(60)
             for _, w in [fuzzlib.mutate(k, open(f"{artifacts}/{fuzzlib.FILES[k]}", "rb").read(), SEED, i)]}
    assert {"bitflip", "overwrite", "truncate", "append", "zero", "swap", "fb-offset", "json-edit"} <= kinds


def test_a_worker_crash_is_caught_and_names_the_mutant(artifacts, monkeypatch):
    """The driver attributes a dying worker to the mutant it was on and carries on after it."""
    monkeypatch.setenv("EDGETORCH_FUZZ_CRASH_AT", "3")
    report = fuzzlib.run_batch(artifacts, "bpte", SEED, 0, 6)
    by_index = {r["i"]: r["outcome"] for r in report.results}
    assert by_index[3] == "crash" and len(by_index) == 6
