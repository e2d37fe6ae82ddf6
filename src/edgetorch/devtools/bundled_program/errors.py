"""Errors of bundled programs; each names the method test suite, test case and input/output at fault."""

from __future__ import annotations

from edgetorch.errors import EdgeTorchError
from edgetorch.formats.bundled_program import BundledProgramFormatError

__all__ = ["BundledInputMismatchError", "BundledMethodNotFoundError", "BundledOutputMismatchError",
           "BundledProgramError", "BundledProgramFormatError", "InvalidTestCaseError"]


class BundledProgramError(EdgeTorchError, ValueError, AssertionError):
    """A bundled program cannot be built: its test cases do not fit the program. Also an ``AssertionError``:
    what the reference ExecuTorch raises for the same checks, so its users' ``except AssertionError`` still works.

    ``method_name``, ``test_case`` and ``index`` (input or output index) name the part at fault when known.
    """

    def __init__(self, message: str, *, method_name: str | None = None, test_case: int | None = None,
                 index: int | None = None) -> None:
        self.method_name = method_name
        self.test_case = test_case
        self.index = index
        super().__init__(message)


class InvalidTestCaseError(BundledProgramError, TypeError):
    """A test case holds a value that cannot be bundled (None, a string, ...)."""


class BundledMethodNotFoundError(BundledProgramError):
    """A method test suite names a method the program does not have (or two suites name the same method)."""


class BundledInputMismatchError(BundledProgramError):
    """A test case's inputs do not match the method: wrong count, type, dtype or shape."""


class BundledOutputMismatchError(BundledProgramError):
    """A test case's expected outputs do not match the method: wrong count, type, dtype or shape."""
