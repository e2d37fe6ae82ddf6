"""Slots the application layer (``edgetorch/__init__.py``) fills at import, so that a lower layer can call an
upper one without importing it.

``etrecord_builder(manager)``: builds the ETRecord of an ``ExecutorchProgramManager`` from the stage history
it kept (``edgetorch.devtools.etrecord.ETRecord.from_manager``); ``ExecutorchProgramManager.get_etrecord()``
calls it, so the compiler never imports the developer tools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

etrecord_builder: Callable[[Any], Any] | None = None
