"""The partitioner API: a partitioner tags edge nodes with a delegation tag per partition."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram

__all__ = ["DELEGATION_TAG", "CompileSpec", "DelegationSpec", "PartitionResult", "Partitioner"]

#: node.meta key holding the partition tag a partitioner chose for the node
DELEGATION_TAG = "delegation_tag"


@dataclass(frozen=True)
class CompileSpec:
    """A backend option passed to ``preprocess`` and stored with the delegate in the program."""

    key: str
    value: bytes


@dataclass
class DelegationSpec:
    backend_id: str
    compile_specs: list[CompileSpec] = field(default_factory=list)


@dataclass
class PartitionResult:
    """``tagged_exported_program``: the program the partitioner was given, with ``node.meta["delegation_tag"]``
    set on every node to delegate; ``partition_tags``: tag -> which backend lowers it."""

    tagged_exported_program: ExportedProgram
    partition_tags: dict[str, DelegationSpec]


class Partitioner(ABC):
    """Chooses the nodes each backend takes. Tags must describe convex partitions of call_function nodes."""

    @abstractmethod
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        ...

    def ops_to_not_decompose(
        self, exported_program: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """ATen ops the backend wants whole (kept out of decomposition by ``to_edge_transform_and_lower``)."""
        return [], None
