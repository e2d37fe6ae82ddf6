"""The ahead-of-time side of a backend: ``preprocess`` turns a partition into the blob its runtime loads."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from torch.export import ExportedProgram

from edgetorch.errors import ExportError
from edgetorch.exir.backend.partitioner import CompileSpec

__all__ = ["PreprocessResult", "BackendDetails", "register_backend_details", "get_backend_details"]


@dataclass
class PreprocessResult:
    """``processed_bytes``: the delegate blob; ``debug_handle_map``: backend op id (int or str) -> the edge debug
    handles that op computes, so runtime events inside the delegate can be traced to source ops;
    ``debug_buffer_bytes``: what one traced call logs in the debug buffer (None: nothing or unknown), added to the
    method's ``debug_buffer_bytes``, the one figure the tracer reserves (the backend's runtime side declares
    nothing). ``data_store_output``: the reference's named data stored outside the blob; edgetorch has no such
    store, so anything but None is refused (``ExportError``) when the partition is lowered."""

    processed_bytes: bytes
    debug_handle_map: dict[int | str, tuple[int, ...]] = field(default_factory=dict)
    data_store_output: dict | None = None
    debug_buffer_bytes: int | None = None


class BackendDetails(ABC):
    """Subclasses set ``backend_id`` and implement ``preprocess``; they register with ``register_backend_details``."""

    backend_id: str = ""

    @classmethod
    @abstractmethod
    def preprocess(cls, edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        ...


_BACKENDS: dict[str, type[BackendDetails]] = {}


def register_backend_details(backend: type[BackendDetails]) -> type[BackendDetails]:
    """Registers a backend's AOT side (usable as a class decorator)."""
    if not backend.backend_id:
        raise ValueError(f"{backend.__name__} has no backend_id")
    _BACKENDS[backend.backend_id] = backend
    return backend


def get_backend_details(backend_id: str) -> type[BackendDetails]:
    """The AOT side registered as ``backend_id``; if absent, ``edgetorch.backends.<backend_id>.preprocess`` (the
    backend's ahead-of-time module, by convention) is imported once, then the package itself. A backend's package
    ``__init__`` imports neither of its sides eagerly, so that its runtime side loads without the compiler."""
    for module in (f"edgetorch.backends.{backend_id}.preprocess", f"edgetorch.backends.{backend_id}"):
        if backend_id in _BACKENDS:
            break
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    if backend_id not in _BACKENDS:
        raise ExportError(f"no backend '{backend_id}' is registered for lowering; known: {sorted(_BACKENDS)}")
    return _BACKENDS[backend_id]
