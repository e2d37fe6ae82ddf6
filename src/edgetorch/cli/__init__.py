"""The ``edgetorch`` command line: ``demo``, ``run`` (program / bundled program runner) and ``inspect``."""

__all__: list[str] = []
