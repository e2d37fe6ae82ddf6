"""Configuration objects of the compiler: ``EdgeCompileConfig`` and ``ExecutorchBackendConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edgetorch.errors import ExportError, MemoryPlanError
from edgetorch.exir.memory_planning import ALGORITHMS

__all__ = ["DEFAULT_PRESERVED_OPS", "EdgeCompileConfig", "ExecutorchBackendConfig"]

#: Ops kept whole (not decomposed) by default. ``scaled_dot_product_attention`` decomposes into ~25 nodes
#: with a costly "safe softmax" tail; kept whole it runs through ATen's fused CPU kernel.
DEFAULT_PRESERVED_OPS: tuple = (torch.ops.aten.scaled_dot_product_attention.default,)


@dataclass
class EdgeCompileConfig:
    """How ``to_edge`` turns an ATen program into the edge dialect.

    ``preserve_ops``: ATen ops left whole by decomposition (default: ``DEFAULT_PRESERVED_OPS``).
    ``_check_ir_validity``: run the edge verifier (rejects ops the runtime cannot execute).
    ``_skip_dim_order``: accepted for compatibility with the reference API; edgetorch keeps strides.
    ``_core_aten_ops_exception_list``: the reference's verifier lets these non-core ATen ops through; edgetorch's
    has no core-ATen check (every ATen op the runtime executes passes), so a non-empty list, which would do
    nothing, is refused (``ExportError``): ``preserve_ops`` keeps an op whole through decomposition.
    """

    preserve_ops: tuple = DEFAULT_PRESERVED_OPS
    _check_ir_validity: bool = True
    _skip_dim_order: bool = True
    _core_aten_ops_exception_list: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self._core_aten_ops_exception_list:
            raise ExportError(
                "EdgeCompileConfig._core_aten_ops_exception_list: edgetorch's edge verifier has no core-ATen check "
                "(every ATen op the runtime can execute passes), so the list would do nothing; leave it empty "
                f"(preserve_ops keeps an op whole through decomposition): {list(self._core_aten_ops_exception_list)}")


@dataclass
class ExecutorchBackendConfig:
    """How ``to_executorch`` plans memory and emits the program.

    ``alignment``: byte alignment of every planned tensor in the arena (64).
    ``memory_planning_algo``: "greedy" tries several greedy orders and keeps the smallest arena; the name of one
    order ("greedy_by_size", "greedy_by_start", "greedy_by_size_x_lifetime") plans with that order only
    (``exir.memory_planning.ALGORITHMS``; another name is refused with ``MemoryPlanError``).
    ``emit_stacktrace``: store each instruction's source line in the program.
    ``extract_delegate_segments``: accepted for compatibility; delegate blobs always live in segments.
    """

    alignment: int = 64
    memory_planning_algo: str = "greedy"
    emit_stacktrace: bool = True
    extract_delegate_segments: bool = True

    def __post_init__(self) -> None:
        if self.memory_planning_algo not in ALGORITHMS:
            raise MemoryPlanError(f"ExecutorchBackendConfig.memory_planning_algo {self.memory_planning_algo!r} is "
                                  f"unknown: one of {', '.join(ALGORITHMS)}")
