"""Fitting a reference ExecuTorch ETDump to its ETRecord before the Inspector builds its event blocks.

The reference's runtime does not name the method a run executed, and logs every argument of a delegate call
(inputs, then outputs). With the reference's ETRecord at hand: each run gets the method whose instructions it ran
(``assign_methods``: the run's instruction ids and kernel names against each method's handle groups and edge ops;
a run matching no method, or several, keeps the default ``forward``), and each delegate call keeps its outputs
only (``formats.etdump_executorch.trim_delegate_call_inputs``, with the ETRecord's output counts).
"""

from __future__ import annotations

import logging
from typing import Any

from edgetorch.devtools.inspector.events import FRAMEWORK_EVENTS
from edgetorch.formats import etdump as ed
from edgetorch.formats.etdump_executorch import trim_delegate_call_inputs
from edgetorch.formats.handles import DELEGATE_CALL, IN_DELEGATE

log = logging.getLogger(__name__)
_KERNEL_PREFIX = "native_call_"


def _kernel_op(event_name: str) -> str | None:
    """``native_call_addmm.out`` -> ``addmm``; None for anything else."""
    if not event_name.startswith(_KERNEL_PREFIX):
        return None
    return event_name[len(_KERNEL_PREFIX):].split(".", 1)[0]


def _method_signature(etrecord: Any, method: str) -> dict[int, set[str] | None]:
    """{instruction id: the edge op names its kernel may be (None: a delegate call)} of ``method``."""
    try:
        table = etrecord.handle_table(method)
    except (KeyError, Exception):  # no edge program for the method: nothing to match kernel names against
        table = {}
    sig: dict[int, set[str] | None] = {}
    for g in (etrecord.handle_groups or {}).get(method, []):
        if g.kind == IN_DELEGATE:
            continue
        sig[g.instruction_id] = None if g.kind == DELEGATE_CALL else {
            n.op.split("::")[-1] for h in g.handles for n in table.get(h, [])}
    return sig


def _fits(run: ed.RunData, sig: dict[int, set[str] | None]) -> bool:
    seen = set()
    for e in run.events:
        p = e.profile_event
        if p is None or p.name in FRAMEWORK_EVENTS or p.instruction_id < 0:
            continue
        if p.instruction_id not in sig:
            return False
        seen.add(p.instruction_id)
        ops, op = sig[p.instruction_id], _kernel_op(p.name)
        if op is not None and (ops is None or (ops and op not in ops)):
            return False
        if p.name == ed.DELEGATE_CALL and ops is not None:
            return False
    return bool(seen)


def assign_methods(etdump: ed.ETDump, etrecord: Any) -> None:
    """Names the method of each execute run of a reference ETDump (in place); see the module docstring."""
    methods = sorted(etrecord.handle_groups or {})
    if len(methods) < 2:
        return
    sigs = {m: _method_signature(etrecord, m) for m in methods}
    for i, run in enumerate(etdump.run_data):
        if run.method:
            continue
        fits = [m for m in methods if _fits(run, sigs[m])]
        if len(fits) == 1:
            run.method = fits[0]
        elif any(e.profile_event is not None and e.profile_event.instruction_id >= 0 for e in run.events):
            log.warning("reference ETDump run %d (%s) fits methods %s of the ETRecord: read as 'forward'", i,
                        run.name, fits or "none")


def fit_reference_etdump(etdump: ed.ETDump, etrecord: Any) -> None:
    """``assign_methods`` then the delegate-input trimming, for an ETDump the reference's runtime wrote."""
    if etdump.producer != "executorch" or etrecord is None:
        return
    assign_methods(etdump, etrecord)
    for method, per_instruction in (getattr(etrecord, "num_outputs", None) or {}).items():
        trim_delegate_call_inputs(etdump, per_instruction, method)
