"""Small file helpers shared by every artifact writer: atomic writes (temp file + rename)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from typing import BinaryIO


def atomic_write(path: str | os.PathLike, chunks: Iterable[bytes | memoryview] | None = None,
                 writer: Callable[[BinaryIO], None] | None = None) -> None:
    """Writes ``chunks`` (or calls ``writer(file)``) to a temp file next to ``path``, then renames it."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            if writer is not None:
                writer(f)
            for c in chunks or ():
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give artifacts the usual permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
