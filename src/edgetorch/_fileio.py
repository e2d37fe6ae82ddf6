"""Small file helpers shared by every artifact writer: atomic writes (temp file + rename).

An ``OSError`` while writing (no permission, a directory in the way, disk full) becomes an
``edgetorch.errors.ArtifactIOError`` naming the path, with the original ``errno`` kept; the temp file is removed
and the old file, if any, is left as it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from typing import BinaryIO

from edgetorch.errors import ArtifactIOError, artifact_io_error


def atomic_write(path: str | os.PathLike, chunks: Iterable[bytes | memoryview] | None = None,
                 writer: Callable[[BinaryIO], None] | None = None) -> None:
    """Writes ``chunks`` (or calls ``writer(file)``) to a temp file next to ``path``, then renames it."""
    path = os.fspath(path)
    try:
        _write(path, chunks, writer)
    except ArtifactIOError:
        raise
    except OSError as e:
        err = artifact_io_error(e, "cannot write", path)
        err.errno = e.errno  # callers may still test for ENOSPC etc.
        raise err from e


def _write(path: str, chunks: Iterable[bytes | memoryview] | None, writer: Callable[[BinaryIO], None] | None) -> None:
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
