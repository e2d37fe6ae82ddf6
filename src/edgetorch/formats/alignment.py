"""Byte alignment of every edgetorch artifact, and the one formula for the debug bytes a run logs.

Every aligned offset in a ``.pte`` (constants, delegate blobs, arena slots), a ``.bpte``, an ETDump debug buffer
and an ONNX Runtime delegate blob is a multiple of :data:`ALIGNMENT`. Emission, the tracer and delegates all size
a debug buffer with :func:`debug_bytes`, so what ``MethodMeta.debug_buffer_bytes`` promises is what a run asks for.
:func:`release_mapped_range` is the one way a reader of a mapped artifact gives back the pages of a byte range.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable

__all__ = ["ALIGNMENT", "align", "padding", "debug_bytes", "release_mapped_range"]

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


def release_mapped_range(mapping: object, start: int, end: int) -> int:
    """Tells the OS that this process does not need the whole pages inside bytes ``[start, end)`` of ``mapping``
    now. Only for a private *file* mapping (an ``mmap`` of an artifact never written through): its pages are read
    back from the file if touched again (on anonymous memory ``MADV_DONTNEED`` would zero them). Anything else
    (bytes, a platform without ``madvise``) keeps its pages. Returns the bytes released."""
    if not isinstance(mapping, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    page = mmap.PAGESIZE
    lo = -(-max(start, 0) // page) * page
    hi = len(mapping) if end >= len(mapping) else end // page * page
    if hi <= lo:
        return 0
    mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return hi - lo
