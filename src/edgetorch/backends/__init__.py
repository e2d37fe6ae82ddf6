"""Delegate backends. Each ``edgetorch.backends.X`` registers its ahead-of-time side (partitioner, ``preprocess``)
and ``edgetorch.backends.X.runtime`` registers the runtime side the program loader looks up by name."""

__all__: list[str] = []
