"""Where a traced run's tensor bytes go: the debug-buffer sinks (``BufferSink``: a fixed in-memory buffer;
``FileSink``: a stream to a named file, or to an anonymous in-memory file for ``debug_buffer_size="auto"``),
``make_sink`` (what ``load_program``'s arguments ask for) and the writers that fill a sink during a run (a
thread, ``Writer``, or inline, ``InlineWriter``). Every blob starts at a ``formats.alignment.ALIGNMENT`` offset.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from edgetorch._fileio import atomic_write
from edgetorch.errors import DebugBufferConfigError, DebugBufferOverflowError, EdgeTorchError
from edgetorch.formats.alignment import ALIGNMENT, align, padding

__all__ = ["MAX_DEBUG_BUFFER_BYTES", "DebugSink", "BufferSink", "is_sink_file", "FileSink", "Writer", "InlineWriter",
           "make_sink"]

_ZEROS = memoryview(bytes(ALIGNMENT))
_memmove = ctypes.memmove  # releases the GIL while it copies
MAX_DEBUG_BUFFER_BYTES = 1 << 40  # a fixed buffer beyond 1 TiB is a mistake, not a plan


class DebugSink:
    """Append-only store for tensor bytes; every blob starts at a 64-byte aligned offset (zero padding).

    ``alloc`` (the running thread) hands out offsets in order; ``put`` (the writer thread) stores the bytes of
    each allocated blob, in the same order. Offsets are final as soon as they are allocated.
    """

    path: str | None = None
    method = ""  # the method running now (for messages)

    @property
    def used_bytes(self) -> int:
        """Bytes allocated so far: up to the end of the last blob, rounded up to the alignment."""
        raise NotImplementedError

    def reserve(self, nbytes: int, method: str, what: str = "a run") -> None:
        """Makes sure ``nbytes`` more fit (before a run allocates anything), or raises
        ``DebugBufferOverflowError``."""

    def alloc(self, nbytes: int) -> int:
        """Reserves room for the next ``nbytes``-byte blob; returns its offset."""
        raise NotImplementedError

    def put(self, offset: int, address: int, data: memoryview) -> None:
        """Stores the blob allocated at ``offset`` (its bytes are at ``address``, also given as ``data``)."""
        raise NotImplementedError

    def rollback(self, mark: int) -> None:
        """Forgets everything allocated after ``mark`` (a failed run leaves nothing behind)."""
        raise NotImplementedError

    def lend(self, nbytes: int) -> tuple[int, torch.Tensor] | None:
        """Allocates a blob and returns (offset, uint8 tensor over its bytes in the buffer) for a producer to
        write in place (no ``put`` then); None when this sink cannot lend memory (the caller logs a copy)."""
        return None

    def flush(self) -> None:
        pass

    def save(self, path: str | os.PathLike) -> None:
        """Writes the used prefix of the buffer to ``path`` atomically."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class BufferSink(DebugSink):
    """A fixed in-memory buffer of ``capacity`` bytes, reserved when the program loads; a run that would not
    fit raises ``DebugBufferOverflowError`` before it stores anything. As every blob is padded to 64 bytes, a
    capacity that is not a multiple of 64 is rounded down.

    The buffer is an anonymous private mapping whose pages the OS provides (zero-filled) on first write: a
    1 GiB buffer costs only the bytes runs actually log in resident memory, and the first run that writes a
    page pays its fault once (later runs, which rewind and rewrite, find it warm)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._cap = capacity - capacity % ALIGNMENT
        self._used = 0
        self._map: mmap.mmap | None = None
        self._addr = 0
        if self._cap:
            self._map = mmap.mmap(-1, self._cap, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._addr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    @property
    def used_bytes(self) -> int:
        return self._used

    def reserve(self, nbytes: int, method: str, what: str = "a run") -> None:
        used = self._used
        if used + nbytes > self._cap:
            raise DebugBufferOverflowError(
                f"debug buffer of {self.capacity} bytes is too small: {what} of method '{method}' stores "
                f"{nbytes} bytes of intermediate outputs and only {self._cap - used} are left ({used} used by "
                f"earlier runs); a buffer of at least {used + nbytes} bytes is needed (or pass "
                "debug_buffer_size='auto' to size it per run, or debug_buffer_path to stream to a file)",
                needed_bytes=used + nbytes, capacity=self.capacity)

    def alloc(self, nbytes: int) -> int:
        pos = self._used
        if pos + nbytes > self._cap:  # only blobs nobody reserved for (delegate outputs, dynamic tensors)
            self.reserve(nbytes, self.method, "an output logged during a run")
        end = pos + nbytes
        self._used = align(end)
        if self._used > end:  # the padding reads as zeros even where an earlier (rewound) run wrote
            ctypes.memset(self._addr + end, 0, self._used - end)
        return pos

    def put(self, offset: int, address: int, data: memoryview) -> None:
        _memmove(self._addr + offset, address, data.nbytes)

    def lend(self, nbytes: int) -> tuple[int, torch.Tensor] | None:
        if not nbytes or self._map is None:
            return None
        off = self.alloc(nbytes)
        # a view from the address, not the buffer protocol: exported pointers would keep the mmap from closing
        raw = (ctypes.c_uint8 * nbytes).from_address(self._addr + off)
        return off, torch.from_numpy(np.ctypeslib.as_array(raw))

    def rollback(self, mark: int) -> None:
        self._used = mark  # no need to zero: ``alloc`` zeroes each blob's padding, ``put`` fills the blob

    def getvalue(self) -> memoryview:
        """The used prefix of the buffer (a view: it changes with later runs)."""
        return memoryview(self._map)[:self._used] if self._map is not None else memoryview(b"")

    def save(self, path: str | os.PathLike) -> None:
        atomic_write(path, [self.getvalue()])


def is_sink_file(sink: DebugSink, path: str | os.PathLike) -> bool:
    """True when ``path`` is the file a streaming sink writes (nothing to copy then)."""
    own = getattr(sink, "path", None)
    if own is None:
        return False
    path = os.fspath(path)
    return os.path.abspath(path) == os.path.abspath(own) or (os.path.exists(path) and os.path.samefile(path, own))


def _anonymous_file() -> Any:
    """A file that lives in memory only (memfd on Linux; else an unnamed temporary file)."""
    if hasattr(os, "memfd_create"):
        try:
            return os.fdopen(os.memfd_create("edgetorch-debug-buffer"), "w+b", buffering=1 << 20)
        except OSError:
            pass
    import tempfile
    return tempfile.TemporaryFile(buffering=1 << 20)


class FileSink(DebugSink):
    """Streams blobs to a file as the run goes: ``path`` (opened and truncated now), or with ``path=None`` an
    anonymous in-memory file that grows by exactly what each run stores ("auto": writing through the page
    cache costs about half of faulting in fresh anonymous pages). No size limit unless ``limit`` is given."""

    def __init__(self, path: str | os.PathLike | None, limit: int | None = None) -> None:
        if path is None:
            self.path = None
            self._f = _anonymous_file()
        else:
            self.path = os.fspath(path)
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._f = open(self.path, "w+b", buffering=1 << 20)
        self._pos = 0  # allocated
        self._written = 0  # put
        self.limit = limit

    @property
    def used_bytes(self) -> int:
        return self._pos

    def reserve(self, nbytes: int, method: str, what: str = "a run") -> None:
        if self.limit is not None and self._pos + nbytes > self.limit:
            where = f"debug buffer file {self.path}" if self.path else "debug buffer"
            raise DebugBufferOverflowError(
                f"{where} is limited to {self.limit} bytes: {what} of method '{method}' stores {nbytes} bytes "
                f"and only {self.limit - self._pos} are left; a limit of at least {self._pos + nbytes} bytes is "
                "needed", needed_bytes=self._pos + nbytes, capacity=self.limit)

    def alloc(self, nbytes: int) -> int:
        pos = self._pos
        if self.limit is not None and pos + nbytes > self.limit:
            self.reserve(nbytes, self.method, "an output logged during a run")
        self._pos = align(pos + nbytes)
        return pos

    def put(self, offset: int, address: int, data: memoryview) -> None:
        if offset != self._written:
            raise EdgeTorchError(f"debug buffer: blob at offset {offset} written out of order (the stream has "
                                 f"{self._written} bytes)")
        n = data.nbytes
        self._f.write(data)
        pad = padding(n)
        if pad:
            self._f.write(_ZEROS[:pad])
        self._written = offset + n + pad

    def rollback(self, mark: int) -> None:
        self._f.flush()
        self._f.seek(mark)
        self._f.truncate(mark)
        self._pos = self._written = mark

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def chunks(self, size: int = 1 << 22) -> Iterator[bytes]:
        """The stream's bytes, read back in pieces."""
        self.flush()
        fd = self._f.fileno()
        for off in range(0, self._written, size):
            yield os.pread(fd, min(size, self._written - off), off)

    def getvalue(self) -> bytes:
        return b"".join(self.chunks())

    def save(self, path: str | os.PathLike) -> None:
        self.flush()
        if self.path is not None:
            if os.path.abspath(os.fspath(path)) == os.path.abspath(self.path):
                return
            if os.path.exists(path) and os.path.samefile(path, self.path):
                return
        atomic_write(path, self.chunks())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class Writer:
    """The thread that copies queued blobs into a sink during one run. ``done`` is the mark of the last
    static blob stored (marks count a run's static blobs, 1-based; other blobs carry 0)."""

    def __init__(self, sink: DebugSink) -> None:
        self.sink = sink
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.done = 0
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="edgetorch-debug-buffer-writer", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        get, put, cond = self.q.get, self.sink.put, self.cond
        while True:
            item = get()
            if item is None:
                return
            off, addr, data, _keep, mark = item
            if self.error is None:
                try:
                    put(off, addr, data)
                except BaseException as e:  # reported by wait()/finish() in the running thread
                    self.error = e
            if mark:
                with cond:
                    self.done = mark
                    cond.notify()

    def wait(self, mark: int) -> None:
        with self.cond:
            while self.done < mark and self.error is None:
                self.cond.wait()
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


class InlineWriter:
    """Same interface as ``Writer``, but stores each blob at once in the running thread: for runs that
    store little, a thread and its hand-offs would cost more than the copies."""

    def __init__(self, sink: DebugSink) -> None:
        self.put_blob = sink.put
        self.done = 0
        self.q = self

    def put(self, item: tuple) -> None:
        off, addr, data, _keep, mark = item
        self.put_blob(off, addr, data)
        if mark:
            self.done = mark

    def wait(self, mark: int) -> None:
        pass

    def finish(self) -> None:
        pass


def make_sink(debug_buffer_size: int | str = 0, debug_buffer_path: str | os.PathLike | None = None
              ) -> DebugSink | None:
    """The sink ``load_program``'s arguments ask for: a file when a path is given (limited to
    ``debug_buffer_size`` bytes when that is an int > 0), else a fixed buffer of ``debug_buffer_size`` bytes,
    else a growing one for "auto"; ``None`` when no intermediates are wanted."""
    size = debug_buffer_size
    if isinstance(size, bool) or not isinstance(size, (int, str)) or size is None or \
            (isinstance(size, str) and size != "auto"):
        raise DebugBufferConfigError(f"debug_buffer_size must be a number of bytes or 'auto', got {size!r}")
    if isinstance(size, int) and not 0 <= size <= MAX_DEBUG_BUFFER_BYTES:
        raise DebugBufferConfigError(f"debug_buffer_size must be between 0 and {MAX_DEBUG_BUFFER_BYTES} bytes "
                                     f"(a fixed buffer is allocated up front; use 'auto' or debug_buffer_path for "
                                     f"large runs), got {size}")
    if debug_buffer_path is not None:
        return FileSink(debug_buffer_path, size if isinstance(size, int) and size > 0 else None)
    if size == "auto":
        return FileSink(None)
    if size:
        try:
            return BufferSink(size)
        except (OSError, MemoryError, RuntimeError) as e:
            raise DebugBufferConfigError(f"debug_buffer_size={size}: a buffer of that size cannot be reserved "
                                         f"({e}); use 'auto' or debug_buffer_path") from None
    return None
