"""Helpers the reference's users import from ``executorch.extension`` (its example scripts do): one-call export
to an edge program or a program manager (``export_util``). They sit above the compiler and use only its public
API."""

__all__: list[str] = []
