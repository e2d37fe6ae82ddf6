"""edgetorch: put PyTorch models on devices and find out why their numbers drift.

Stages: ``edgetorch.exir`` (compiler), ``edgetorch.runtime`` (executes .pte programs),
``edgetorch.devtools`` (ETDump, ETRecord, Inspector), ``edgetorch.export`` (sessions and recipes).
"""

__version__ = "0.1.0"
