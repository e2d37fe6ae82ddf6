"""Progress inside long library steps (lowering a partition, converting it to ONNX, planning memory).

A step announces itself with ``progress.note("partition 2/3: ONNX export")``. The message is logged at INFO on the
``edgetorch.progress`` logger (``-v`` / ``logging`` show it) and passed to the listeners installed with
``with progress.listening(callback):`` (the CLI draws it beside its current step). Listeners are per thread;
a listener that raises is dropped, never the step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["LOGGER_NAME", "listening", "note"]

LOGGER_NAME = "edgetorch.progress"
log = logging.getLogger(LOGGER_NAME)
_local = threading.local()


def _listeners() -> list[Callable[[str], None]]:
    found = getattr(_local, "listeners", None)
    if found is None:
        found = _local.listeners = []
    return found


def note(message: str) -> None:
    """Announces the sub-step now starting."""
    log.info("%s", message)
    for listener in list(_listeners()):
        try:
            listener(message)
        except Exception:  # progress must never break the work it reports on
            _listeners().remove(listener)


@contextmanager
def listening(callback: Callable[[str], None]) -> Iterator[None]:
    """Calls ``callback(message)`` for each ``note`` of this thread inside the block."""
    listeners = _listeners()
    listeners.append(callback)
    try:
        yield
    finally:
        if callback in listeners:
            listeners.remove(callback)
