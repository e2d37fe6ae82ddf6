"""What every ``edgetorch`` subcommand shares: the argument error, the early output-path check, the guarded
entry point (one ``error: ...`` line and an exit status instead of a traceback) and the fast process exit.

Imports nothing but the standard library: ``edgetorch run`` must stay light.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable

EXIT_BAD_INPUT, EXIT_FAILED = 2, 3


class CliError(Exception):
    """A problem with the arguments or input files (exit status 2)."""


def check_output_path(path: str, flag: str) -> None:
    """Fails early (before a long run) when ``path`` cannot be written."""
    if os.path.isdir(path):
        raise CliError(f"{flag} {path} is a directory")
    d = os.path.dirname(os.path.abspath(path))
    _check_writable_ancestor(d, path, flag, "write")
    if os.path.isdir(d):  # permissions say little (root, /proc, a read-only mount): create a file there, as the
        try:              # atomic writer will (temp file + rename)
            fd, probe = tempfile.mkstemp(dir=d, prefix=".edgetorch-probe-")
        except OSError as e:
            raise CliError(f"cannot write {flag} {path}: {e.strerror or e} (cannot create a file in {d})") from None
        os.close(fd)
        os.unlink(probe)


def check_output_dir(path: str, flag: str) -> None:
    """Fails early (before a long run) when the folder ``path`` cannot be created or written."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"{flag} {path} exists and is not a directory")
    _check_writable_ancestor(os.path.abspath(path), path, flag, "create")


def _check_writable_ancestor(d: str, path: str, flag: str, verb: str) -> None:
    """The nearest existing ancestor of ``d`` (``d`` itself if it exists) is a writable directory."""
    while not os.path.exists(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    if not os.path.isdir(d):
        raise CliError(f"cannot {verb} {flag} {path}: {d} is not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        raise CliError(f"cannot write {flag} {path}: directory {d} is not writable")


def _user_error(e: BaseException) -> str | None:
    """The one-line message of an exception caused by the user's files, paths or disk (exit status 2), or None
    for anything else (a bug)."""
    from edgetorch.errors import (
        ArtifactIOError,
        DebugBufferConfigError,
        FormatError,
        InspectorError,
        MethodNotFoundError,
        RuntimeInputError,
    )

    if isinstance(e, (FormatError, ArtifactIOError, DebugBufferConfigError, InspectorError, MethodNotFoundError,
                      RuntimeInputError)):
        return str(e)
    if isinstance(e, OSError):  # disk full (errno 28), permission denied, ... while reading or writing a path
        where = e.filename or ""
        return f"{where + ': ' if where else ''}{e.strerror or e}"
    return None


def _fast_exit_allowed() -> bool:
    """True when this process is the ``edgetorch`` command itself (console script or ``python -m edgetorch``),
    not a Python program that called ``main()``; ``EDGETORCH_NO_FAST_EXIT=1`` turns it off."""
    if os.environ.get("EDGETORCH_NO_FAST_EXIT"):
        return False
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "edgetorch.__main__":
        return True
    return os.path.splitext(os.path.basename(sys.argv[0] or ""))[0] == "edgetorch"


def exit_now(code: int) -> int:
    """Ends the ``edgetorch`` process right away once everything is written: interpreter teardown after
    importing torch takes longer than a small model's run. Returns ``code`` when called in-process."""
    sys.stdout.flush()
    sys.stderr.flush()
    if _fast_exit_allowed():
        import logging

        logging.shutdown()
        os._exit(code)
    return code


def guarded(main: Callable[[argparse.Namespace], int], args: argparse.Namespace,
            failures: dict[type[BaseException], int] | None = None) -> int:
    """Runs ``main(args)``: a ``CliError`` prints ``error: ...`` and gives exit status 2, an exception listed in
    ``failures`` its status, a user error (a malformed or mismatched artifact, a bad path, a full disk: an
    ``OSError``) status 2, an interrupt 130, any other exception (a bug) one line saying so and status 3 (``-v``
    re-raises it, traceback and all); then ends the process through ``exit_now``."""
    try:
        code = main(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        code = 130
    except Exception as e:
        status = next((s for t, s in (failures or {}).items() if isinstance(e, t)), None)
        user = _user_error(e) if status is None else None
        if status is not None:
            print(f"error: {e}", file=sys.stderr)
            code = status
        elif user is not None:
            print(f"error: {user}", file=sys.stderr)
            code = EXIT_BAD_INPUT
        else:
            if getattr(args, "verbose", False):
                raise
            print(f"error: internal error ({type(e).__name__}: {e}); this is a bug in edgetorch: please report it "
                  "with the output of the same command run with -v", file=sys.stderr)
            code = EXIT_FAILED
    return exit_now(code)
