"""Typed errors shared by every stage of edgetorch; each names the file, field, op or input at fault."""

from __future__ import annotations

__all__ = ["EdgeTorchError", "FormatError", "ProgramFormatError", "OperatorNotAllowedError", "ExportError",
           "MemoryPlanError", "UnsupportedOpError", "RuntimeInputError", "MethodNotFoundError", "KernelError",
           "ETDumpFormatError", "DebugBufferOverflowError", "ETRecordError", "ETRecordFormatError", "InspectorError",
           "ArtifactMismatchError", "ExportSessionError", "PipelineError", "ExportInputError", "UnsupportedModelError",
           "RecipeError", "UnsafeModelFileError", "ObserverEffectWarning", "ArtifactIOError", "ArtifactNotFoundError",
           "DebugBufferConfigError", "artifact_io_error"]


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


class OperatorNotAllowedError(ProgramFormatError):
    """A program names an operator the runtime does not run: one outside the allow-list
    (``edgetorch.formats.operators``) and not registered by the user, or called with a kind its schema does not
    fit; names the operator and the instruction."""


class ExportError(EdgeTorchError):
    """A model could not be turned into an edge program (unsupported op, dynamic shape, ...)."""


class MemoryPlanError(ExportError):
    """A memory plan places two tensors that are live at the same time in the same arena bytes."""


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


class ETDumpFormatError(FormatError):
    """An ETDump (.etdp) file, or the debug buffer it points into, is malformed, truncated or of an unknown
    version; ``field`` names the part at fault."""


class DebugBufferOverflowError(EdgeTorchError):
    """A fixed-size debug buffer cannot hold the intermediate outputs of a run; the message names the bytes
    needed. ``needed_bytes`` is the total size a buffer must have to hold this run too."""

    def __init__(self, message: str, *, needed_bytes: int = 0, capacity: int = 0) -> None:
        self.needed_bytes = needed_bytes
        self.capacity = capacity
        super().__init__(message)


class ETRecordError(EdgeTorchError, RuntimeError):
    """An ETRecord cannot be built or saved: a stage is missing, a field is already set, or a program holds
    something the ETRecord format cannot store."""


class ETRecordFormatError(FormatError):
    """An ETRecord file is malformed, unsafe or of an unsupported version; ``field`` names the zip entry."""


class InspectorError(EdgeTorchError, ValueError):
    """The Inspector cannot do what was asked with the artifacts it has (names what is missing)."""


class ArtifactMismatchError(InspectorError):
    """An ETDump and an ETRecord (or a debug buffer) come from different programs."""


class ExportSessionError(EdgeTorchError, RuntimeError):
    """An export session cannot do what was asked: a stage has not run, an artifact is missing, or a stage
    failed; the message says which stage and what to do."""


class PipelineError(ExportSessionError, ValueError):
    """The stages of an export pipeline are not a valid sequence for the given model (invalid transition,
    unregistered stage, a stage that cannot start a pipeline, or a stage incompatible with the input type)."""


class ExportInputError(ExportSessionError, ValueError):
    """The model, example inputs or dynamic shapes given to ``edgetorch.export.export`` are missing or
    inconsistent (e.g. a method without example inputs, a missing or malformed saved program file)."""


class UnsupportedModelError(ExportInputError, TypeError):
    """The model given to ``edgetorch.export.export`` is not of a supported type."""


class RecipeError(EdgeTorchError, ValueError):
    """An export recipe cannot be built: unknown backend or recipe type, or invalid recipe arguments."""


class UnsafeModelFileError(ExportInputError):
    """A saved ExportedProgram holds pickled data (which could run code when loaded) and was not loaded."""


class ObserverEffectWarning(UserWarning):
    """Exposing a delegate's intermediates changed its final outputs (the logged inside-delegate values are not
    exactly what a plain run computes)."""


class ArtifactIOError(EdgeTorchError, OSError):
    """An artifact path cannot be read or written (a directory, no permission, disk full); names the path."""


class ArtifactNotFoundError(ArtifactIOError, FileNotFoundError):
    """An artifact file does not exist; names the path."""


class DebugBufferConfigError(EdgeTorchError, ValueError):
    """``debug_buffer_size`` / ``debug_buffer_path`` given to ``load_program`` are not usable (a negative or
    absurd size, an unknown mode); names the argument."""


def artifact_io_error(e: OSError, what: str, path: str) -> ArtifactIOError:
    """The typed error for an ``OSError`` met while reading or writing the artifact ``what`` at ``path``."""
    if isinstance(e, FileNotFoundError):
        return ArtifactNotFoundError(f"{what} not found: {path}")
    if isinstance(e, IsADirectoryError):
        return ArtifactIOError(f"{what} {path} is a directory, not a file")
    if isinstance(e, PermissionError):
        return ArtifactIOError(f"{what} {path} cannot be accessed: permission denied")
    return ArtifactIOError(f"{what} {path}: {e.strerror or e}")
