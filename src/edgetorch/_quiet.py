"""Third-party messages an edgetorch user cannot act on, kept off the console by default.

``import edgetorch`` (every edgetorch import runs it) installs the filters; the CLI's ``--verbose``, the
environment variable ``EDGETORCH_VERBOSE=1`` or ``edgetorch._quiet.set_quiet(False)`` removes them. Only the
messages listed in ``NOISE`` are dropped, on the loggers that emit them (torchao's optional CUDA/Triton kernels on a
CPU machine, torch's deprecation notes for torchao's pytree registrations, the ONNX exporter's torchvision ops),
plus torch's ``LeafSpec`` ``FutureWarning``; every other message of those libraries still shows. edgetorch's own
messages go through ``logging`` under the ``edgetorch`` logger (``edgetorch.<module>``).
"""

from __future__ import annotations

import logging
import os
import re
import warnings

#: logger name -> the messages of it that are dropped (regular expressions searched in the message)
NOISE: dict[str, tuple[str, ...]] = {
    "torchao": (r"^Failed to load .*torchao/_C",),
    "torchao.kernel.intmm": (r"Detected no triton",),
    "torch.utils._pytree": (r"register_constant\(\) on Enum subclasses is deprecated",),
    "torch.onnx._internal.exporter._registration": (r"torchvision is not installed",),
}
#: (category, message regex) of the Python warnings that are dropped
WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
)


class _Drop(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]) -> None:
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not self.pattern.search(record.getMessage())
        except Exception:  # a record whose arguments do not format: let its own logger report it
            return True


_installed: dict[str, _Drop] = {}


def set_quiet(quiet: bool = True) -> None:
    """Installs (``quiet``) or removes the filters of ``NOISE`` and ``WARNINGS``."""
    for name, patterns in NOISE.items():
        logger = logging.getLogger(name)
        old = _installed.pop(name, None)
        if old is not None:
            logger.removeFilter(old)
        if quiet:
            _installed[name] = f = _Drop(patterns)
            logger.addFilter(f)
    for category, message in WARNINGS:
        warnings.filters[:] = [f for f in warnings.filters
                               if not (f[0] == "ignore" and f[2] is category and f[1] is not None
                                       and f[1].pattern == message)]
        if quiet:
            warnings.filterwarnings("ignore", message=message, category=category)


def install_default() -> None:
    """What ``import edgetorch`` does: quiet unless ``EDGETORCH_VERBOSE`` is set to a non-empty value other
    than ``0``."""
    set_quiet(os.environ.get("EDGETORCH_VERBOSE", "") in ("", "0"))
