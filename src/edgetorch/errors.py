"""Typed errors shared by every stage of edgetorch; each names the file, field, op or input at fault."""

from __future__ import annotations


class EdgeTorchError(Exception):
    """Base class of every error edgetorch raises on purpose."""


class FormatError(EdgeTorchError, ValueError):
    """An artifact file (.pte, .etdp, ETRecord, .bpte) is malformed; ``field`` names the part at fault."""

    def __init__(self, message: str, *, field: str = "", path: str | None = None) -> None:
        self.message = message
        self.field = field
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__(f"{where}{message}")


class ProgramFormatError(FormatError):
    """A .pte program file is malformed or of an unsupported version."""


class ExportError(EdgeTorchError):
    """A model could not be turned into an edge program (unsupported op, dynamic shape, ...)."""


class UnsupportedOpError(ExportError):
    """The edge graph holds an op the runtime cannot execute; names the node, op and source line."""


class RuntimeInputError(EdgeTorchError, ValueError):
    """Inputs given to ``Method.execute`` do not match the method's signature."""


class MethodNotFoundError(EdgeTorchError, KeyError):
    """The program has no method of the requested name."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class KernelError(EdgeTorchError, RuntimeError):
    """A kernel failed while executing; names the instruction, op and source line."""
