"""Developer tools: ETRecord (AOT debug record), ETDump (runtime trace) and the Inspector that joins them.

Names are imported lazily so that ``import edgetorch.devtools.etdump`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Inspector": "edgetorch.devtools.inspector",
    "TimeScale": "edgetorch.devtools.inspector",
    "ETRecord": "edgetorch.devtools.etrecord",
    "generate_etrecord": "edgetorch.devtools.etrecord",
    "parse_etrecord": "edgetorch.devtools.etrecord",
    "BundledProgram": "edgetorch.devtools.bundled_program",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'edgetorch.devtools' has no attribute '{name}'")
