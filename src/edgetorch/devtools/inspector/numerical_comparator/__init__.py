"""The numerical comparators where the reference's users import them from
(``devtools.inspector.numerical_comparator``): the same classes as ``devtools.inspector.comparators``, and the
reference's two type names for what a comparator's ``preprocessing(mapping)`` receives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgetorch.devtools.inspector.comparators import (
    L1Comparator,
    MSEComparator,
    NumericalComparatorBase,
    SNRComparator,
)

#: the debug handles of one AOT or runtime value (a tuple of ints)
DebugHandle = tuple[int, ...]
#: ``{(aot handles, aot value): (runtime handles, runtime value)}``, the reference's ``preprocessing`` argument
IntermediateOutputMapping = Mapping[tuple[DebugHandle, Any], tuple[DebugHandle, Any]]

__all__ = ["DebugHandle", "IntermediateOutputMapping", "L1Comparator", "MSEComparator", "NumericalComparatorBase",
           "SNRComparator"]
