"""Lets the runtime load a bundled program (.bpte) like a .pte: returns the embedded program's bytes."""

from __future__ import annotations

from typing import Any

__all__ = ["unwrap_bundled"]


def unwrap_bundled(buffer: Any, path: str | None) -> Any:
    """Returns ``buffer`` itself for a .pte, or a view of the embedded .pte for a .bpte."""
    try:
        from edgetorch.formats import bundled_program as bp
    except ImportError:
        return buffer
    return bp.embedded_program(buffer, path)
