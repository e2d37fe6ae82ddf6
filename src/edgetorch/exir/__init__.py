"""The edgetorch compiler: edge dialect, passes, delegation, memory planning and emission to .pte.

The names below load on first use (PEP 562), so that importing one leaf module (``edgetorch.exir.debug_handles``,
which the developer tools read) does not load the whole compiler."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from edgetorch.exir.config import EdgeCompileConfig, ExecutorchBackendConfig
    from edgetorch.exir.program import (
        EdgeProgramManager,
        ExecutorchProgramManager,
        to_edge,
        to_edge_transform_and_lower,
    )

_WHERE = {
    "EdgeCompileConfig": "edgetorch.exir.config",
    "ExecutorchBackendConfig": "edgetorch.exir.config",
    "EdgeProgramManager": "edgetorch.exir.program",
    "ExecutorchProgramManager": "edgetorch.exir.program",
    "to_edge": "edgetorch.exir.program",
    "to_edge_transform_and_lower": "edgetorch.exir.program",
    "ExportedProgram": "torch.export",  # re-exported as the reference's exir does (its scripts import it here)
}

__all__ = [
    "EdgeCompileConfig",
    "EdgeProgramManager",
    "ExecutorchBackendConfig",
    "ExecutorchProgramManager",
    "ExportedProgram",
    "to_edge",
    "to_edge_transform_and_lower",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'edgetorch.exir' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
