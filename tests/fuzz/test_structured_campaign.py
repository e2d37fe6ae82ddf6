"""CI sample of the structure-aware mutation campaign (``tests/fuzz/structured.py``; long runs:
``bench/fuzz_structured.py``): per kind (mlp, small_cnn, small_cnn on ONNX Runtime and llama_tiny ``.pte``; the
mlp's ETRecord, ETDump and debug buffer) a seeded sample of mutants with ONE field edited semantically and every
hash, manifest and CRC valid, each checked in a worker subprocess: refused with a typed error, or run with the same
outputs, or with other outputs only where the edit made another valid program or recording. No generic
exception, crash, hang, read of arena bytes nothing wrote, write outside a planned slot or written constant."""

from __future__ import annotations

import json

import pytest

from tests.fuzz import structured

SEED = 20261126
MUTANTS = {"mlp": 150, "cnn": 50, "cnn_ort": 150, "llama": 50, "etrecord": 100, "etdump": 150, "debug_buffer": 80}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("sfuzz"))
    structured.build_artifacts(folder)
    return folder


@pytest.mark.parametrize("kind", structured.KINDS)
def test_structured_mutants_are_refused_typed_or_make_another_valid_artifact(artifacts, kind):
    report = structured.run_batch(artifacts, kind, SEED, 0, MUTANTS[kind])
    assert len(report.results) == MUTANTS[kind]
    assert not report.failures, "\n".join(json.dumps(f)[:600] for f in report.failures[:10])
    counts = report.counts()
    # the edits reach the semantic checks: a good share is refused, and most edits are encodable
    assert counts["typed"] >= MUTANTS[kind] // (10 if kind == "debug_buffer" else 5), dict(counts)
    assert counts["unencodable"] <= MUTANTS[kind] // 10, dict(counts)


def test_structured_mutants_are_deterministic_and_keep_hashes_valid(artifacts):
    """A mutant is a pure function of (kind, seed, index), and passes the integrity checks (hash, manifest, CRC):
    its refusal, when it is refused, comes from a semantic check."""
    from edgetorch.runtime.loader import parse

    for kind in ("mlp", "llama"):
        ctx = structured.Context(structured.build_artifacts(artifacts), "", kind)
        ctx.original = open(ctx.paths[kind], "rb").read()
        a = [structured.make_mutant(ctx, SEED, i) for i in range(10)]
        assert a == [structured.make_mutant(ctx, SEED, i) for i in range(10)]
        assert len({m for m, _ in a}) >= 8
        for m, _ in a:
            try:
                parse(m, None, consistency=False, full=True)  # the content hash holds
            except Exception as e:  # noqa: BLE001
                assert "content hash" not in str(e), e
