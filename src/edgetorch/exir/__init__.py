"""The edgetorch compiler: edge dialect, passes, delegation, memory planning and emission to .pte."""

from edgetorch.exir.config import EdgeCompileConfig, ExecutorchBackendConfig
from edgetorch.exir.program import (
    EdgeProgramManager,
    ExecutorchProgramManager,
    to_edge,
    to_edge_transform_and_lower,
)

__all__ = [
    "EdgeCompileConfig",
    "EdgeProgramManager",
    "ExecutorchBackendConfig",
    "ExecutorchProgramManager",
    "to_edge",
    "to_edge_transform_and_lower",
]
