"""The stage types an export pipeline is made of."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["StageType"]


class StageType(StrEnum):
    """One step of an export pipeline; the session keeps one artifact per stage type."""

    SOURCE_TRANSFORM = "source_transform"
    QUANTIZE = "quantize"
    TORCH_EXPORT = "torch_export"
    TO_EDGE_TRANSFORM_AND_LOWER = "to_edge_transform_and_lower"
    TO_EDGE = "to_edge"
    EDGE_PROGRAM_MANAGER_TRANSFORM = "edge_program_manager_transform"
    TO_BACKEND = "to_backend"
    TO_EXECUTORCH = "to_executorch"

    def __str__(self) -> str:
        return self.name
