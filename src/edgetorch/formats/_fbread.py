"""A small, bounds-checked flatbuffer table reader for the hot parts of the program (values, instructions) and of
the ETDump (its events).

The generated accessors cost several Python calls per field and do no bounds checks; this reader resolves a
table's vtable once and reads fields with ``struct.unpack_from``, refusing any offset outside the buffer.
Field indices follow declaration order in the schema (a union takes two: its type, then its value).
"""

from __future__ import annotations

import struct

from edgetorch.formats.errors import ProgramFormatError

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_SCALARS = {"b": 1, "B": 1, "?": 1, "h": 2, "i": 4, "I": 4, "q": 8, "Q": 8, "d": 8, "f": 4}


class Table:
    """One flatbuffer table: ``pos`` in ``buf`` and its field offsets (0 = absent)."""

    __slots__ = ("buf", "pos", "offs")

    def __init__(self, buf: bytes, pos: int) -> None:
        n = len(buf)
        if not 0 <= pos <= n - 4:
            raise ProgramFormatError(f"table offset {pos} outside the flatbuffer ({n} bytes)", field="flatbuffer")
        vt = pos - _I32.unpack_from(buf, pos)[0]
        if not 0 <= vt <= n - 4:
            raise ProgramFormatError(f"vtable offset {vt} outside the flatbuffer", field="flatbuffer")
        vsize = _U16.unpack_from(buf, vt)[0]
        if vsize < 4 or vsize % 2 or vt + vsize > n:
            raise ProgramFormatError(f"malformed vtable at {vt}", field="flatbuffer")
        self.buf, self.pos = buf, pos
        self.offs = struct.unpack_from(f"<{(vsize - 4) // 2}H", buf, vt + 4)

    def _at(self, i: int, size: int) -> int:
        if i >= len(self.offs) or not self.offs[i]:
            return -1
        p = self.pos + self.offs[i]
        if p + size > len(self.buf):
            raise ProgramFormatError(f"field {i} of the table at {self.pos} lies outside the flatbuffer",
                                     field="flatbuffer")
        return p

    def scalar(self, i: int, fmt: str, default=0):
        p = self._at(i, _SCALARS[fmt])
        return default if p < 0 else struct.unpack_from("<" + fmt, self.buf, p)[0]

    def _ref(self, i: int) -> int:
        p = self._at(i, 4)
        if p < 0:
            return -1
        q = p + _U32.unpack_from(self.buf, p)[0]
        if q > len(self.buf) - 4:
            raise ProgramFormatError(f"reference in field {i} of the table at {self.pos} points outside the "
                                     "flatbuffer", field="flatbuffer")
        return q

    def table(self, i: int) -> Table | None:
        q = self._ref(i)
        return None if q < 0 else Table(self.buf, q)

    def _vector(self, i: int, itemsize: int) -> tuple[int, int]:
        q = self._ref(i)
        if q < 0:
            return 0, 0
        n = _U32.unpack_from(self.buf, q)[0]
        if q + 4 + n * itemsize > len(self.buf):
            raise ProgramFormatError(f"vector in field {i} of the table at {self.pos} ({n} items) runs past the "
                                     "end of the flatbuffer", field="flatbuffer")
        return q + 4, n

    def scalars(self, i: int, fmt: str) -> list:
        start, n = self._vector(i, _SCALARS[fmt])
        return list(struct.unpack_from(f"<{n}{fmt}", self.buf, start)) if n else []

    def raw(self, i: int) -> bytes:
        """The bytes of a ``[ubyte]`` vector field (empty when absent)."""
        start, n = self._vector(i, 1)
        return bytes(self.buf[start:start + n]) if n else b""

    def tables(self, i: int) -> list[Table]:
        start, n = self._vector(i, 4)
        out = []
        for k in range(n):
            p = start + 4 * k
            out.append(Table(self.buf, p + _U32.unpack_from(self.buf, p)[0]))
        return out

    def string(self, i: int) -> str:
        start, n = self._vector(i, 1)
        if not n:
            return ""
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise ProgramFormatError(f"string in field {i} of the table at {self.pos} is not UTF-8",
                                     field="flatbuffer") from None
