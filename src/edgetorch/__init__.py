"""edgetorch: put PyTorch models on devices and find out why their numbers drift.

Stages: ``edgetorch.exir`` (compiler), ``edgetorch.runtime`` (executes .pte programs),
``edgetorch.devtools`` (ETDump, ETRecord, Inspector), ``edgetorch.export`` (sessions and recipes).

This module is the application layer: it imports nothing heavy, and wires the layers that must not import each
other (``edgetorch._hooks``).
"""

from typing import Any

from edgetorch import _hooks, _quiet
from edgetorch._version import __version__

_quiet.install_default()  # third-party noise off the console (edgetorch._quiet; --verbose shows it)


def _etrecord_from_manager(manager: Any) -> Any:
    from edgetorch.devtools.etrecord import ETRecord

    return ETRecord.from_manager(manager)


_hooks.etrecord_builder = _etrecord_from_manager

__all__ = ["__version__"]
