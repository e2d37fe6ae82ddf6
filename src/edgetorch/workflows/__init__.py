"""Workflows: the applications of the compiler and the debugger together, above ``export`` and ``devtools``.

``find_fix`` (:mod:`edgetorch.workflows.fix`), ``find_generation_fix`` (:mod:`edgetorch.workflows.generation_fix`: a
low-bit LLM's layers kept at int8 / float until its greedy tokens agree with the float model's) and
``selective_fallback`` (:mod:`edgetorch.workflows.quant_fallback`) re-export a model with the recipe exclusions the
Inspector's culprits suggest and measure each candidate again. Neither ``export`` nor ``devtools`` imports this
package; ``cli`` and the root package may. Names are imported lazily so that ``import edgetorch.workflows`` stays
light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FixResult": "edgetorch.workflows.fix",
    "FixStep": "edgetorch.workflows.fix",
    "find_fix": "edgetorch.workflows.fix",
    "GenerationFixResult": "edgetorch.workflows.generation_fix",
    "GenerationStep": "edgetorch.workflows.generation_fix",
    "find_generation_fix": "edgetorch.workflows.generation_fix",
    "FallbackReport": "edgetorch.workflows.quant_fallback",
    "selective_fallback": "edgetorch.workflows.quant_fallback",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'edgetorch.workflows' has no attribute '{name}'")
