"""Re-exports the format errors so format modules depend on one small module."""

from edgetorch.errors import FormatError, ProgramFormatError

__all__ = ["FormatError", "ProgramFormatError"]
