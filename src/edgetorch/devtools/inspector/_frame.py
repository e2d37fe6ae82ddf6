"""``GapFrame``: the gap table's DataFrame, printed so that a reader can trust its numbers.

pandas prints a list cell with its display precision (6 decimals), so ``[1.4e-17]`` reads ``[0.0]`` and a reader
concludes every gap is zero. A ``GapFrame`` is a plain DataFrame (same columns, same list cells, same API:
``df["gap"].str[0]`` still works) whose ``print(df)`` / notebook display shows a one-value list as that value in
scientific notation (``1.396e-17``; ``0`` for an exact zero). Slices and copies stay ``GapFrame``\\s.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

#: the columns displayed as numbers (one value per output in the data)
LIST_COLUMNS = ("gap", "local_gap")


def _readable(v: Any) -> Any:
    if isinstance(v, (list, tuple)) and len(v) == 1:
        v = v[0]
        if v is None:
            return ""
    if isinstance(v, float):
        return "0" if v == 0 else (f"{v:.3e}" if math.isfinite(v) else str(v))
    if isinstance(v, (list, tuple)) and all(isinstance(x, float) for x in v):
        return "[" + ", ".join(_readable(x) for x in v) + "]"
    return v


class GapFrame(pd.DataFrame):
    """A gap table (see the module docstring)."""

    @property
    def _constructor(self) -> type[GapFrame]:
        return GapFrame

    def readable(self) -> pd.DataFrame:
        """A plain DataFrame copy with the gap columns as text numbers, for display."""
        out = pd.DataFrame(self).copy()
        for c in LIST_COLUMNS:
            if c in out.columns:
                out[c] = [_readable(v) for v in out[c]]
        return out

    def __repr__(self) -> str:
        return repr(self.readable())

    def _repr_html_(self) -> str | None:
        return self.readable()._repr_html_()
