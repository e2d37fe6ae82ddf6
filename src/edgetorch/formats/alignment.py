"""Byte alignment of every edgetorch artifact, and the one formula for the debug bytes a run logs.

Every aligned offset in a ``.pte`` (constants, delegate blobs, arena slots), a ``.bpte``, an ETDump debug buffer
and an ONNX Runtime delegate blob is a multiple of :data:`ALIGNMENT`. Emission, the tracer and delegates all size
a debug buffer with :func:`debug_bytes`, so what ``MethodMeta.debug_buffer_bytes`` promises is what a run asks for.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ALIGNMENT", "align", "padding", "debug_bytes"]

#: bytes; the alignment of every offset in every edgetorch format
ALIGNMENT = 64


def align(n: int, a: int = ALIGNMENT) -> int:
    """``n`` rounded up to a multiple of ``a`` (a power of two or not)."""
    return (n + a - 1) // a * a


def padding(n: int, a: int = ALIGNMENT) -> int:
    """Zero bytes to append after ``n`` bytes to reach the next multiple of ``a``."""
    return -n % a


def debug_bytes(nbytes: Iterable[int]) -> int:
    """Debug-buffer bytes needed to log tensors of these sizes: each one starts at an aligned offset."""
    return sum(align(n) for n in nbytes)
