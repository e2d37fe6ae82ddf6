"""Fitting a reference ExecuTorch ETDump to its ETRecord before the Inspector builds its event blocks.

The reference's runtime does not name the method a run executed, and logs every argument of a delegate call
(inputs, then outputs). With the reference's ETRecord at hand: each run gets the method whose instructions it ran
(``assign_methods``: the run's instruction ids and kernel names against each method's handle groups and edge ops;
a run matching no method, or several, keeps the default ``forward``), and each delegate call keeps its outputs
only (``formats.etdump_executorch.trim_delegate_call_inputs``, with the ETRecord's output counts). And
``gap_groups`` says which handle groups a gap row may use as they are: the reference's exporter may split one
op between a delegate call and kernels.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from edgetorch.devtools.inspector.events import FRAMEWORK_EVENTS
from edgetorch.formats import etdump as ed
from edgetorch.formats.etdump_executorch import trim_delegate_call_inputs
from edgetorch.formats.handles import DELEGATE_CALL, IN_DELEGATE, KERNEL, HandleGroup

__all__ = ["assign_methods", "fit_reference_etdump", "gap_groups"]

log = logging.getLogger(__name__)
_KERNEL_PREFIX = "native_call_"
#: (edge op as read, the reference's kernel running it): its dim-order ops are read as these ATen ops
_KERNEL_ALIASES = (("clone", "_clone_dim_order"), ("_to_copy", "_to_dim_order_copy"))


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
        ops = {n.op.split("::")[-1] for h in g.handles for n in table.get(h, [])}
        sig[g.instruction_id] = None if g.kind == DELEGATE_CALL else ops | {a for o, a in _KERNEL_ALIASES if o in ops}
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


def gap_groups(groups: Any) -> dict[HandleGroup, HandleGroup | None]:
    """The groups of a reference program whose gap row must differ from the group, and what it uses instead
    (None: no row). The reference's exporter may split one decomposed op between a delegate call and kernels
    (a ``matmul``'s ``expand_copy`` left outside XNNPACK, the ``slice_copy`` of an ``unbind`` inside it and its
    ``squeeze_copy`` ops outside); the part that runs first does not compute the op's output, so: a kernel whose
    op a later delegate call finishes adds no row (the call's row covers the op), and a delegate call keeps in
    its row only the handles no later instruction finishes (none left: no row). The perf tables keep every
    handle. The reference Inspector merges such rows into one instead."""
    gs = sorted((g for g in groups if g.kind != IN_DELEGATE), key=lambda g: g.instruction_id)
    out: dict[HandleGroup, HandleGroup | None] = {}
    for i, g in enumerate(gs):
        later = [c for c in gs[i + 1:] if c.instruction_id > g.instruction_id]
        if g.kind == KERNEL:
            if any(c.kind == DELEGATE_CALL and set(g.handles) & set(c.handles) for c in later):
                out[g] = None
            continue
        finished_later = {h for c in later for h in c.handles}
        keep = tuple(h for h in g.handles if h not in finished_later)
        if len(keep) != len(g.handles):
            out[g] = replace(g, handles=keep) if keep else None
    return out
