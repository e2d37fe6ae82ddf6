"""Reading an ETDump and the debug buffer its tensors point into.

``DebugBuffer`` memory-maps the buffer file (copy-on-write: tensors are writable, the file is never touched)
and hands out tensors that are views of the mapping (``torch.frombuffer``, no copy). Every access is
bounds-checked: an offset or size beyond the end of the buffer raises ``ETDumpFormatError`` naming the tensor,
the range and the buffer size.
"""

from __future__ import annotations

import mmap
import os
import warnings
import zlib
from typing import Any

import torch

from edgetorch.errors import ArtifactMismatchError, ETDumpFormatError, artifact_io_error
from edgetorch.formats import etdump as ed
from edgetorch.formats.alignment import release_mapped_range
from edgetorch.formats.dtypes import PLAIN_CODE_TO_DTYPE, contiguous_strides
from edgetorch.formats.etdump_executorch import read_any_etdump

__all__ = ["read_etdump", "DebugBuffer"]

_CRC_CHUNK = 8 << 20  # bytes read at a time to check a mapped buffer's CRC


def read_etdump(path: str | os.PathLike) -> ed.ETDump:
    """Reads and decodes an .etdp file (``ETDumpFormatError`` if it is malformed)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise artifact_io_error(e, "ETDump file", str(path)) from None
    return read_any_etdump(data, path)  # edgetorch's or the reference's


class DebugBuffer:
    """A debug buffer, from a file path (memory-mapped) or from bytes; ``tensor(t)`` returns the tensor an
    ETDump ``Tensor`` describes without copying it (the tensors keep the mapping alive)."""

    def __init__(self, source: str | os.PathLike | bytes | bytearray | memoryview) -> None:
        self._mmap: mmap.mmap | None = None
        self._closed = False
        if isinstance(source, (str, os.PathLike)):
            self.path: str | None = os.fspath(source)
            try:
                with open(self.path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    self._buf: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
            except OSError as e:
                raise artifact_io_error(e, "debug buffer file", str(self.path)) from None
            if size:
                self._mmap = self._buf
        elif isinstance(source, (bytes, bytearray, memoryview)):
            self.path = None
            self._buf = source if not isinstance(source, memoryview) else source.cast("B")
        else:
            raise TypeError(f"DebugBuffer expects a path or bytes, got {type(source).__name__}")
        file_size = len(self._buf) if not isinstance(self._buf, memoryview) else self._buf.nbytes
        #: the identity of the recording that wrote this buffer (None: written before trailers existed)
        self.trailer = ed.read_trailer(self._buf, file_size, self.path)
        self.size = self.trailer.data_bytes if self.trailer is not None else file_size
        self._verified: str | None = None  # the run id this buffer was checked against

    def _fail(self, msg: str, fld: str) -> ETDumpFormatError:
        where = self.path or "debug buffer"
        return ETDumpFormatError(f"{where}: {msg}", field=fld, path=self.path)

    def tensor(self, t: ed.Tensor, what: str = "tensor") -> torch.Tensor:
        """The tensor ``t`` describes, viewed in place from the buffer (shape ``t.sizes``)."""
        dtype = PLAIN_CODE_TO_DTYPE.get(t.scalar_type)
        if dtype is None:  # unknown, or quantized (which would crash torch.frombuffer)
            raise self._fail(f"{what}: unknown scalar type code {t.scalar_type} (quantized codes are never stored)",
                             "tensor.scalar_type")
        numel = t.numel
        if t.nbytes != numel * dtype.itemsize:
            raise self._fail(f"{what}: nbytes is {t.nbytes}, but {dtype} {t.sizes} has {numel * dtype.itemsize}",
                             "tensor.nbytes")
        if numel == 0:
            return torch.empty(t.sizes, dtype=dtype)
        if t.offset == ed.NO_OFFSET:
            raise self._fail(f"{what}: its {t.nbytes} bytes were not stored in the debug buffer (offset -1)",
                             "tensor.offset")
        end = t.offset + t.nbytes
        if t.offset < 0 or end > self.size:
            raise self._fail(
                f"{what}: bytes [{t.offset}, {end}) lie beyond the end of the debug buffer ({self.size} bytes): "
                "the file is truncated or is not the buffer this ETDump was recorded with", "tensor.offset")
        if self._closed:
            raise ValueError(f"{self!r} is closed")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # frombuffer on a read-only bytes object
            flat = torch.frombuffer(self._buf, dtype=dtype, count=numel, offset=t.offset)
        if not t.strides or list(t.strides) == contiguous_strides(t.sizes):
            return flat.view(t.sizes)
        if len(t.strides) != len(t.sizes) or any(s < 0 for s in t.strides) or \
                sum((n - 1) * s for n, s in zip(t.sizes, t.strides)) >= numel:
            raise self._fail(f"{what}: strides {t.strides} do not fit {numel} stored elements of sizes {t.sizes}",
                             "tensor.strides")
        return flat.as_strided(t.sizes, t.strides)

    def value(self, v: ed.Value, what: str = "value") -> Any:
        """A logged value as a Python object: a tensor, a list of tensors, an int, float, bool, str or None."""
        vt = v.val
        if vt == ed.ValueType.Tensor:
            return self.tensor(v.tensor, what)
        if vt == ed.ValueType.TensorList:
            return [self.tensor(t, f"{what}[{i}]") for i, t in enumerate(v.tensor_list or [])]
        if vt == ed.ValueType.Int:
            return v.int_value
        if vt == ed.ValueType.Bool:
            return v.bool_value
        if vt == ed.ValueType.Float:
            return v.float_value
        if vt == ed.ValueType.Double:
            return v.double_value
        if vt == ed.ValueType.String:
            return v.string_value
        return None

    def _check_size(self, etdump: ed.ETDump) -> None:
        if self.size < etdump.debug_buffer_bytes:
            raise self._fail(f"the debug buffer has {self.size} bytes but the ETDump was recorded with "
                             f"{etdump.debug_buffer_bytes}: truncated, or not the buffer of this ETDump",
                             "debug_buffer_bytes")

    def check_identity(self, etdump: ed.ETDump) -> None:
        """Refuses a buffer that this ETDump's recording did not write: its trailer must name the ETDump's
        program and run id and hold the ETDump's number of data bytes, and the data must match the CRC-32 of
        the trailer and of the ETDump. ``ArtifactMismatchError`` for another program's or run's buffer (or a
        file that is no debug buffer), ``ETDumpFormatError`` for corrupted data. An ETDump written before run
        ids existed (empty ``run_id``) is not checked."""
        if not etdump.run_id or self._verified == etdump.run_id:
            return
        where = self.path or "debug buffer"
        t = self.trailer
        if t is None:
            raise ArtifactMismatchError(f"{where} is truncated or is not the debug buffer of this ETDump (recording "
                                        f"{etdump.run_id}): it has no edgetorch debug buffer trailer")
        if t.program_hash != etdump.program_hash or t.run_id != etdump.run_id:
            raise ArtifactMismatchError(
                f"{where} was written by recording {t.run_id} of program {t.program_hash[:16]}…, but the ETDump is "
                f"recording {etdump.run_id} of program {etdump.program_hash[:16]}…: pass the debug buffer written "
                "together with this ETDump")
        if t.data_bytes != etdump.debug_buffer_bytes:
            raise ArtifactMismatchError(f"{where} holds {t.data_bytes} bytes of data, the ETDump was written with "
                                        f"{etdump.debug_buffer_bytes}: the buffer and ETDump were written at "
                                        "different times")
        crc = self._crc32(t.data_bytes)
        if crc != t.crc32 or etdump.debug_buffer_crc32 not in (-1, crc):
            raise self._fail(f"the data does not match its CRC-32 (trailer {t.crc32:08x}, ETDump "
                             f"{etdump.debug_buffer_crc32 & 0xFFFFFFFF:08x}, data {crc:08x}): the file is corrupted",
                             "debug_buffer_crc32")
        self._verified = etdump.run_id

    def _crc32(self, nbytes: int) -> int:
        """CRC-32 of the first ``nbytes`` bytes. A mapped file is read in chunks through the page cache, not
        through the mapping: checking a 1 GiB buffer must not make 1 GiB of it resident in this process."""
        if self._mmap is None or self.path is None:
            return zlib.crc32(memoryview(self._buf)[:nbytes])
        crc, chunk = 0, bytearray(_CRC_CHUNK)
        try:
            with open(self.path, "rb", buffering=0) as f:
                left = nbytes
                while left > 0:
                    n = f.readinto(memoryview(chunk)[:min(left, _CRC_CHUNK)])
                    if not n:
                        break  # shorter than the trailer says: the CRC will not match
                    crc = zlib.crc32(memoryview(chunk)[:n], crc)
                    left -= n
        except OSError as e:
            raise artifact_io_error(e, "debug buffer file", str(self.path)) from None
        return crc

    def release_pages(self, start: int = 0, end: int | None = None) -> None:
        """Lets the kernel drop this process's pages of bytes ``[start, end)`` of a mapped buffer (whole pages
        inside the range only). Tensors handed out stay valid: their bytes are read back from the file when next
        touched, so a long analysis that visits a large buffer once, call by call, holds one call's values at a
        time rather than the whole buffer. (A tensor changed in place would lose its changes; the Inspector
        never changes logged values.) A no-op for a buffer given as bytes."""
        if self._mmap is not None:
            release_mapped_range(self._mmap, start, self.size if end is None else min(end, self.size))

    def check(self, etdump: ed.ETDump) -> None:
        """Checks that this buffer was written with ``etdump`` (``check_identity``), is at least as long as the
        ETDump says and that every stored tensor of the ETDump lies inside it; raises ``ETDumpFormatError`` (or
        ``ArtifactMismatchError``) on the first problem."""
        self._check_size(etdump)
        self.check_identity(etdump)
        for i, run in enumerate(etdump.run_data):
            for j, e in enumerate(run.events):
                d = e.debug_event
                if d is None:
                    continue
                v = d.debug_entry
                tensors = [v.tensor] if v.val == ed.ValueType.Tensor else \
                    (v.tensor_list or []) if v.val == ed.ValueType.TensorList else []
                for t in tensors:
                    if t is not None and t.offset != ed.NO_OFFSET and t.offset + t.nbytes > self.size:
                        raise self._fail(
                            f"run_data[{i}].events[{j}] (instruction {d.instruction_id}, output {d.output_index}): "
                            f"bytes [{t.offset}, {t.offset + t.nbytes}) lie beyond the end of the debug buffer "
                            f"({self.size} bytes)", f"run_data[{i}].events[{j}].debug_event.debug_entry.tensor.offset")

    def close(self) -> None:
        """Drops this reader's reference to the mapping. Tensors handed out keep it alive (and valid) until
        they are freed; the file is unmapped then. Unmapping here would leave them dangling."""
        self._closed = True
        self._mmap = None
        self._buf = b""

    def __enter__(self) -> DebugBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DebugBuffer({self.path or 'bytes'!r}, {self.size} bytes)"


