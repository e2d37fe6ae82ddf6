"""``torch.load(weights_only=True)`` of a ``torch.save`` archive stored (uncompressed) inside another archive
(the weights of a reference ETRecord's programs), without copying the entry twice: its bytes are read once into
one 64-byte aligned buffer, and every storage is a view of that buffer, as torch's own ``mmap=True`` loading
does for a file. The central directory and the pickle are read through a window on the outer file.
Untrusted pickles are only ever read by torch's weights-only unpickler."""

from __future__ import annotations

import io
import zlib
from typing import Any

import torch


class _Window(io.RawIOBase):
    """A read-only window [start, start + size) of a binary file (the inner archive of a stored entry)."""

    def __init__(self, fp: Any, start: int, size: int) -> None:
        super().__init__()
        self._fp, self._start, self._size, self._pos = fp, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self._size - self._pos))
        self._fp.seek(self._start + self._pos)
        got = self._fp.readinto(memoryview(b).cast("B")[:n]) or 0
        self._pos += got
        return got


class StoredCRCError(ValueError):
    """The entry's bytes do not match the CRC-32 its archive records (a corrupted or edited entry)."""


def load_stored(fp: Any, start: int, size: int, crc: int) -> Any:
    """torch.load(weights_only=True) of the torch.save archive at [start, start + size) of ``fp``: the archive
    is read into one aligned buffer and every storage is a view of it (torch's own mmap loading, on a buffer).
    The bytes are checked against ``crc``, the CRC-32 the outer archive records, as ``zipfile`` would."""
    from torch import _weights_only_unpickler

    buf = torch.empty(size, dtype=torch.uint8)
    fp.seek(start)
    if size and fp.readinto(buf.numpy()) != size:
        raise EOFError("entry truncated")
    found = zlib.crc32(buf.numpy()) if size else 0
    if found != crc:
        raise StoredCRCError(f"bad CRC-32 {found:#010x} (the archive records {crc:#010x})")
    reader = torch._C.PyTorchFileReader(io.BufferedReader(_Window(fp, start, size)))
    return torch.serialization._load(reader, None, _weights_only_unpickler, overall_storage=buf.untyped_storage(),
                                     encoding="utf-8")
