"""The Inspector: profile tables and per-op numeric gaps from an ETDump + ETRecord."""

from edgetorch.devtools.inspector.comparators import (
    CosineComparator,
    L1Comparator,
    MaxAbsComparator,
    MSEComparator,
    NumericalComparatorBase,
    SNRComparator,
)
from edgetorch.devtools.inspector.compare import compare_results
from edgetorch.devtools.inspector.events import Event, EventBlock, ObserverEffect, PerfData, TimeScale
from edgetorch.devtools.inspector.inspector import Inspector
from edgetorch.devtools.inspector.numeric_gap import Coverage

__all__ = [
    "CosineComparator",
    "Coverage",
    "Event",
    "EventBlock",
    "Inspector",
    "L1Comparator",
    "MSEComparator",
    "MaxAbsComparator",
    "NumericalComparatorBase",
    "ObserverEffect",
    "PerfData",
    "SNRComparator",
    "TimeScale",
    "compare_results",
]
