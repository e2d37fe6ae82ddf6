"""Inspector data classes: ``TimeScale``, ``PerfData``, ``Event``, ``EventBlock``, built from an ETDump.

Runs of one method with the same event sequence merge into one ``EventBlock``: each event then has one timing
sample per run, and keeps the intermediate outputs of every run that logged them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from edgetorch.formats import etdump as ed
from edgetorch.formats.handles import HandleGroup

__all__ = ["FRAMEWORK_EVENTS", "TimeScale", "scale_factor", "PerfData", "Event", "EventBlock", "ObserverEffect",
           "observer_effects", "TimeConverter", "gen_event_blocks"]

FRAMEWORK_EVENTS = {ed.METHOD_EXECUTE, ed.PROGRAM_LOAD_METHOD, ed.METHOD_INIT}
_NO_VALUES = FRAMEWORK_EVENTS | {ed.OPERATOR_CALL}  # the reference's OPERATOR_CALL times a kernel's instruction


class TimeScale(enum.Enum):
    NS = "ns"
    US = "us"
    MS = "ms"
    S = "s"
    CYCLES = "cycles"


_PER_SECOND = {TimeScale.NS: 1e9, TimeScale.US: 1e6, TimeScale.MS: 1e3, TimeScale.S: 1.0, TimeScale.CYCLES: 1.0}


def scale_factor(source: TimeScale, target: TimeScale) -> float:
    """Divide a duration in ``source`` units by this to get ``target`` units."""
    return _PER_SECOND[source] / _PER_SECOND[target]


@dataclass
class PerfData:
    """Timing samples of one event, one per run, in the Inspector's target time unit."""

    raw: list[float]

    @cached_property
    def _arr(self) -> np.ndarray:
        return np.asarray(self.raw, dtype=np.float64)

    @property
    def p10(self) -> float:
        return float(np.percentile(self._arr, 10))

    @property
    def p50(self) -> float:
        return float(np.percentile(self._arr, 50))

    @property
    def p90(self) -> float:
        return float(np.percentile(self._arr, 90))

    @property
    def avg(self) -> float:
        return float(self._arr.mean())

    @property
    def min(self) -> float:
        return float(self._arr.min())

    @property
    def max(self) -> float:
        return float(self._arr.max())


@dataclass
class Event:
    """One instruction (or one op inside a delegate) of a method, over every merged run."""

    name: str
    perf_data: PerfData | None = None
    op_types: list[str] = field(default_factory=list)
    delegate_debug_identifier: int | str | None = None
    debug_handles: int | list[int] | None = None
    stack_traces: dict[str, str] = field(default_factory=dict)
    module_hierarchy: dict[str, Any] = field(default_factory=dict)
    is_delegated_op: bool = False
    delegate_backend_name: str | None = None
    debug_data: list[Any] = field(default_factory=list)  # outputs logged by the first run that logged any
    num_outputs: int = 1
    run_debug_data: list[list[Any]] = field(default_factory=list)  # per run (empty list: nothing logged)
    raw_delegate_debug_metadatas: list[bytes] = field(default_factory=list)
    #: the ETRecord's handle group of this event (None: no ETRecord, or the event covers no handle)
    handle_group: HandleGroup | None = None
    _instruction_id: int | None = None
    _start_time: list[int] = field(default_factory=list)
    _delegate_metadata_parser: Callable[[bytes], Any] | None = None

    @property
    def instruction_id(self) -> int | None:
        return self._instruction_id

    @property
    def delegate_debug_metadatas(self) -> list[Any]:
        """The delegate's debug metadata of each sample, parsed by the Inspector's ``delegate_metadata_parser``
        for an op inside a delegate (raw bytes otherwise)."""
        parse = self._delegate_metadata_parser
        if parse is None or not self.is_delegated_op:
            return list(self.raw_delegate_debug_metadatas)
        return [parse(m) for m in self.raw_delegate_debug_metadatas]

    @property
    def start_time(self) -> list[int]:
        return self._start_time

    def asdict(self, units: str = "") -> dict[str, Any]:
        suffix = f" ({units})" if units else ""
        pd_ = self.perf_data
        row: dict[str, Any] = {"event_name": self.name, "raw": pd_.raw if pd_ else []}
        for stat in ("p10", "p50", "p90", "avg", "min", "max"):
            row[stat + suffix] = getattr(pd_, stat) if pd_ and pd_.raw else None
        ops = self.op_types
        row["op_types"] = ops if len(ops) < 5 else [f"{ops[0]}, {ops[1]} ... {ops[-1]} ({len(ops)} total)"]
        row.update({
            "delegate_debug_identifier": self.delegate_debug_identifier,
            "stack_traces": self.stack_traces,
            "module_hierarchy": self.module_hierarchy,
            "is_delegated_op": self.is_delegated_op,
            "delegate_backend_name": self.delegate_backend_name,
            "debug_data": self.debug_data,
            "start_time": self._start_time,
        })
        return row


@dataclass
class EventBlock:
    """All events of one method over a group of identical runs."""

    name: str
    events: list[Event]
    method: str = "forward"
    source_time_scale: TimeScale = TimeScale.NS
    target_time_scale: TimeScale = TimeScale.MS
    bundled_input_index: int | None = None
    run_output: list[Any] | None = None
    reference_output: Any = None
    num_runs: int = 0

    def to_dataframe(self, include_units: bool = False) -> pd.DataFrame:
        units = self.target_time_scale.value if include_units else ""
        rows = [{"event_block_name": self.name, **e.asdict(units)} for e in self.events]
        return pd.DataFrame(rows)


@dataclass(frozen=True)
class ObserverEffect:
    """What exposing a delegate call's intermediates did to its final outputs, per checked run: the largest
    relative difference from a plain run of the call (see ``formats.etdump.OBSERVER_EFFECT_ID``)."""

    method: str
    instruction_id: int
    delegate_backend_name: str | None
    values: list[float]

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def exceeds_tolerance(self) -> bool:
        """True when the logged inside-delegate values are not exactly what a plain run computes."""
        return self.max > ed.OBSERVER_EFFECT_TOLERANCE


def observer_effects(blocks: list[EventBlock]) -> list[ObserverEffect]:
    """The observer-effect events of every block (one entry per method and delegate call)."""
    found: dict[tuple[str, int], ObserverEffect] = {}
    for b in blocks:
        for e in b.events:
            if e.delegate_debug_identifier != ed.OBSERVER_EFFECT_ID or e.instruction_id is None:
                continue
            vals = [float(v[0]) for v in e.run_debug_data if v and isinstance(v[0], (int, float))]
            if not vals:
                continue
            key = (b.method, e.instruction_id)
            if key in found:
                found[key].values.extend(vals)
            else:
                found[key] = ObserverEffect(b.method, e.instruction_id, e.delegate_backend_name, vals)
    return list(found.values())


# -- building blocks from an ETDump ----------------------------------------------------------------------

def _delegate_id(ev: ed.ProfileEvent | ed.DebugEvent) -> int | str | None:
    if ev.delegate_debug_id_int is not None and ev.delegate_debug_id_int >= 0:
        return ev.delegate_debug_id_int
    return ev.delegate_debug_id_str or None


def _signature(run: ed.RunData) -> tuple:
    sig = []
    for e in run.events:
        if e.profile_event is not None:
            p = e.profile_event
            sig.append(("p", p.name, p.instruction_id, _delegate_id(p)))
    return tuple(sig)


@dataclass
class _RawEvent:
    key: tuple
    name: str
    instruction_id: int | None
    delegate_id: int | str | None
    durations: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    metadata: list[bytes] = field(default_factory=list)
    debug_per_run: list[list[tuple[int, ed.Value]]] = field(default_factory=list)

    def add_profile(self, p: ed.ProfileEvent) -> None:
        end, start = p.end_time, p.start_time
        self.durations.append(end - start if end >= start else (2**32 - 1 - start) + end)
        self.starts.append(start)
        if p.delegate_debug_metadata:
            self.metadata.append(p.delegate_debug_metadata)


#: ``delegate_time_scale_converter(event name, time) -> time in the target unit``, for events inside a delegate
TimeConverter = Callable[[int | str, int | float], int | float]


@dataclass
class _Group:
    """The events of a group of identical runs, in first-seen order, and the first run's program outputs."""

    raw: dict[tuple, _RawEvent] = field(default_factory=dict)
    order: list[tuple] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)

    def add_run(self, r: int, run: ed.RunData) -> None:
        debug_this_run: dict[tuple, list[tuple[int, ed.Value]]] = {}
        for e in run.events:
            if e.profile_event is not None:
                p = e.profile_event
                did = _delegate_id(p)
                key = (p.instruction_id, did, p.name if did is None else None)
                if key not in self.raw:
                    self.raw[key] = _RawEvent(key, p.name, p.instruction_id if p.instruction_id >= 0 else None, did)
                    self.order.append(key)
                self.raw[key].add_profile(p)
            elif e.debug_event is not None:
                d = e.debug_event
                if ed.is_input_event(d):  # the call's inputs: read by inspector.generation
                    continue
                if d.debug_entry.output:
                    if r == 0:
                        self.outputs.append(d.debug_entry)
                    continue
                debug_this_run.setdefault((d.instruction_id, _delegate_id(d)), []).append((d.output_index,
                                                                                          d.debug_entry))
        self._add_debug(r, debug_this_run)

    def _add_debug(self, r: int, debug_this_run: dict[tuple, list[tuple[int, ed.Value]]]) -> None:
        for (iid, did), vals in debug_this_run.items():  # debug events without a profile event
            if not any(k[0] == iid and k[1] == did for k in self.order):
                key = (iid, did, None)
                self.raw[key] = _RawEvent(key, str(did) if did is not None else f"instruction_{iid}",
                                          iid if iid >= 0 else None, did)
                self.raw[key].debug_per_run = [[] for _ in range(r)]
                self.order.append(key)
        for key in self.order:
            ev = self.raw[key]
            vals = debug_this_run.get((ev.instruction_id if ev.instruction_id is not None else -1,
                                       ev.delegate_id), [])
            ev.debug_per_run.append([] if ev.name in _NO_VALUES else vals)


def _event(ev: _RawEvent, inflate: Callable[[ed.Value], Any], factor: float, convert: TimeConverter | None,
           parser: Callable[[bytes], Any] | None) -> Event:
    per_run = [[inflate(v) for _, v in sorted(vals, key=lambda x: x[0])] for vals in ev.debug_per_run]
    first = next((v for v in per_run if v), [])
    name = str(ev.delegate_id) if ev.delegate_id is not None else ev.name
    if ev.delegate_id is not None and convert is not None:  # start and end converted separately
        times = [convert(name, s + d) - convert(name, s) for s, d in zip(ev.starts, ev.durations)]
    else:
        times = [d / factor for d in ev.durations]
    return Event(name=name, perf_data=PerfData(times) if times else None, delegate_debug_identifier=ev.delegate_id,
                 is_delegated_op=ev.delegate_id is not None, debug_data=first, num_outputs=max(1, len(first)),
                 run_debug_data=per_run, raw_delegate_debug_metadatas=ev.metadata,
                 _instruction_id=ev.instruction_id, _start_time=ev.starts, _delegate_metadata_parser=parser)


def gen_event_blocks(etdump: ed.ETDump, inflate: Callable[[ed.Value], Any], source: TimeScale, target: TimeScale,
                     delegate_time_scale_converter: TimeConverter | None = None,
                     delegate_metadata_parser: Callable[[bytes], Any] | None = None) -> list[EventBlock]:
    """Groups an ETDump's runs into EventBlocks (one per method and run signature).

    ``inflate(value: ed.Value)`` turns a logged value into a tensor / Python value (the debug buffer reader).
    Times are scaled from ``source`` to ``target``; those of events inside a delegate by
    ``delegate_time_scale_converter`` instead, when given (applied to the start and the end time).
    """
    groups: dict[tuple, list[ed.RunData]] = {}
    for run in etdump.run_data:
        if run.events:
            groups.setdefault((run.name, run.method, _signature(run)), []).append(run)
    factor = scale_factor(source, target)
    blocks = []
    for (name, method, _sig), runs in groups.items():
        g = _Group()
        for r, run in enumerate(runs):
            g.add_run(r, run)
        events = [_event(g.raw[k], inflate, factor, delegate_time_scale_converter, delegate_metadata_parser)
                  for k in g.order]
        index = runs[0].bundled_input_index
        blocks.append(EventBlock(name=name, events=events, method=method or "forward", source_time_scale=source,
                                 target_time_scale=target, bundled_input_index=index if index >= 0 else None,
                                 run_output=[inflate(v) for v in g.outputs] or None, num_runs=len(runs)))
    return blocks
