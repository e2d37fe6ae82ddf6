"""Turns the ``data`` given to ``load_program`` (path, bytes or file object) into a parsed program.

Paths are memory-mapped (copy-on-write, so tensors made from the mapping are writable without touching the
file): weights are used in place and paged in on first use.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any

from edgetorch.errors import ProgramFormatError, artifact_io_error
from edgetorch.formats import plan_check
from edgetorch.formats import program as pf
from edgetorch.formats.alignment import release_mapped_range

__all__ = ["LoadedFile", "read_data", "body_digest", "verify_hash", "parse"]


@dataclass
class LoadedFile:
    buffer: Any  # mmap.mmap | bytes | bytearray: supports the buffer protocol
    path: str | None
    header: pf.FileHeader
    program: pf.ProgramDef

    @property
    def segment_base(self) -> int:
        return self.header.segment_offset

    def named_data_keys(self) -> list[str]:
        return [k for k, _, _ in self.program.named_data]

    def named_data(self, key: str) -> memoryview:
        """The bytes stored under ``key`` (``PreprocessResult.data_store_output``): a read-only view of the
        loaded file, no copy. Bounds are checked here whatever the verification level; an unknown key or a range
        outside the segment area raises ``ProgramFormatError`` naming the key."""
        index = self.__dict__.get("_named_index")
        if index is None:
            index = self.__dict__["_named_index"] = {k: (o, n) for k, o, n in self.program.named_data}
        if key not in index:
            raise ProgramFormatError(f"no named data '{key}' (the program stores "
                                     f"{len(index)} keys)", field=f"named_data['{key}']", path=self.path)
        off, size = index[key]
        seg = self.header.segment_size
        if off < 0 or size < 0 or off % pf.ALIGNMENT or off + size > seg:
            raise ProgramFormatError(f"named data '{key}' range [{off}, {off + size}) is "
                                     f"misaligned or outside the segment area ({seg} bytes)",
                                     field=f"named_data['{key}']", path=self.path)
        base = self.segment_base + off
        return memoryview(self.buffer)[base:base + size].toreadonly()

    def release_named_data(self, key: str) -> int:
        """Tells the OS that the pages of named data ``key`` are not needed now (a backend that copied them at
        init calls it): a program mapped from a file (private, never written there) drops them from resident
        memory and reads them back from the file if they are touched again. Programs in memory (bytes) keep
        them. Returns the bytes released."""
        view = self.named_data(key)
        start = self.segment_base + dict((k, o) for k, o, _ in self.program.named_data)[key]
        return release_mapped_range(self.buffer, start, start + view.nbytes)


def read_data(data: Any) -> tuple[Any, str | None]:
    """Returns (buffer, path) for a path, bytes-like object or binary file object."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    return b"", path
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), path
        except OSError as e:
            raise artifact_io_error(e, "program file", path) from None
    if isinstance(data, (bytes, bytearray, memoryview)):
        return (bytes(data) if isinstance(data, memoryview) else data), None
    if isinstance(data, io.IOBase) or hasattr(data, "read"):
        name = getattr(data, "name", None)
        try:
            fileno = data.fileno()
            if data.seekable() and data.tell() == 0:
                size = os.fstat(fileno).st_size
                if size:
                    return mmap.mmap(fileno, 0, access=mmap.ACCESS_COPY), name if isinstance(name, str) else None
        except (OSError, AttributeError, io.UnsupportedOperation):
            pass
        return data.read(), name if isinstance(name, str) else None
    raise TypeError(f"load_program expects a path, bytes or a binary file object, got {type(data).__name__}")


def _sha256(mv: memoryview, out: list[bytes], k: int) -> None:
    out[k] = hashlib.sha256(mv).digest()  # hashlib releases the GIL on large buffers


def body_digest(buffer: Any, header_version: int) -> str:
    """The content hash of a .pte body (everything after the header): version 1, plain SHA-256; version 2, the
    pieces of ``pf.hash_boundaries`` hashed in parallel threads and combined (``pf.combine_digests``)."""
    body = memoryview(buffer)[pf.HEADER_SIZE:]
    if header_version == 1:
        return hashlib.sha256(body).hexdigest()
    cuts = pf.hash_boundaries(body.nbytes)
    digests: list[bytes] = [b""] * pf.HASH_CHUNKS
    threads = [threading.Thread(target=_sha256, args=(body[cuts[k]:cuts[k + 1]], digests, k))
               for k in range(1, pf.HASH_CHUNKS)]
    for t in threads:
        t.start()
    _sha256(body[cuts[0]:cuts[1]], digests, 0)
    for t in threads:
        t.join()
    return pf.combine_digests(digests).hex()


def verify_hash(buffer: Any, header: pf.FileHeader, label: str) -> None:
    """Recomputes the content hash of everything after the header (``Verification.Full``)."""
    digest = body_digest(buffer, header.header_version)
    if digest != header.content_hash:
        raise ProgramFormatError(f"{label}: content hash mismatch: the header records {header.content_hash[:16]}..., "
                                 f"the file body hashes to {digest[:16]}... (the file is corrupted or was modified)",
                                 field="header.content_hash")


def parse(buffer: Any, path: str | None, consistency: bool, full: bool = False) -> LoadedFile:
    label = path or "program"
    try:
        header = pf.read_header(memoryview(buffer), label)
        if full:
            verify_hash(buffer, header, label)
        fbuf = memoryview(buffer)[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size]
        program = pf.decode_flatbuffer(fbuf)
        if consistency:
            pf.check_consistency(program, header.segment_size)
            for plan in program.plans:  # re-prove what the compiler proved: def-use, no live overlap, I/O
                plan_check.check_plan(plan)
    except ProgramFormatError as e:
        if e.path is None and path is not None:
            raise ProgramFormatError(e.message if e.message.startswith(label) else e.message, field=e.field,
                                     path=path) from None
        raise
    return LoadedFile(buffer, path, header, program)
