"""Planted faults made in the reference's own program files (issue 26): a constant's bytes of a clean reference
``.pte`` perturbed in place (``make_reference_artifacts.py pte_faults``: found by content in the layout the
exporter stored it, the same seeded noise as the before-export faults), the edited program run by the reference's
runtime, and its ETDump debugged by edgetorch against the clean program's ETRecord."""

from __future__ import annotations

import json

from edgetorch.devtools import Inspector
from edgetorch.devtools.etrecord import parse_etrecord
from tests.devtools._reference_data import DATA, FAULTS, handle_reading, unpack


def test_constants_perturbed_in_the_reference_pte_are_named_top1():
    """Each fault: the first culprit covers the op reading the perturbed constant (>= 95 %; 41/41 when made),
    where the reference Inspector's largest-gap row does far less often (its gap accumulates downstream)."""
    index = json.loads((FAULTS / "pte_index.json").read_text())
    faults = index["faults"]
    assert len(faults) >= 30 and {f["backend"] for f in faults} == {"portable", "xnnpack"}
    assert len({f["model"] for f in faults}) >= 5
    records, missed, reference_hits = {}, [], 0
    for f in faults:
        name = f"{f['model']}_{f['backend']}"
        rec = records.get(name) or records.setdefault(name, parse_etrecord(DATA / f"{name}_etrecord.bin"))
        want = handle_reading(rec, f["param"])
        ins = Inspector(etdump_path=FAULTS / f["etdump"], etrecord=rec,
                        debug_buffer_path=unpack(FAULTS / f["debug_buffer"]))
        culprits = ins.find_culprits(ins.calculate_numeric_gap("MSE"))
        top = set(culprits["aot_debug_handle"].iloc[0]) if len(culprits) else set()
        if want not in top:
            missed.append((name, f["param"], sorted(top)))
        reference_hits += want in f["reference_top1_by_gap"]
    assert len(missed) <= 0.05 * len(faults), missed
    assert reference_hits < len(faults) - len(missed), reference_hits
