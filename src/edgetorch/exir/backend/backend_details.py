"""The ahead-of-time side of a backend: ``preprocess`` turns a partition into the blob its runtime loads."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch.export import ExportedProgram

from edgetorch.errors import ExportError
from edgetorch.exir.backend.partitioner import CompileSpec

__all__ = ["PreprocessResult", "BackendDetails", "NamedDataStore", "NamedDataConflictError", "named_data_of",
           "register_backend_details", "get_backend_details"]

#: the alignment of every named-data entry in the program's segment area (a requested one must divide it)
NAMED_DATA_ALIGNMENT = 64


class NamedDataConflictError(ExportError):
    """Two pieces of named data were stored under one key with different bytes."""


def _as_bytes(data: Any, key: str) -> bytes:
    if hasattr(data, "tobytes") and not isinstance(data, (bytes, bytearray, memoryview)):
        return data.tobytes()  # numpy array (C order)
    try:
        return bytes(memoryview(data).cast("B")) if isinstance(data, memoryview) else bytes(data)
    except TypeError:
        raise ExportError(f"named data '{key}': {type(data).__name__} is not bytes-like") from None


class NamedDataStore:
    """Data a backend stores outside its blob, by key (the reference's ``NamedDataStore``): the program keeps
    one copy of each key across every method and delegate, 64-byte aligned; the backend's runtime side reads it
    with the ``named_data`` lookup it gets at ``init``. The same key with the same bytes is stored once; the same
    key with other bytes raises ``NamedDataConflictError``."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def add_named_data(self, key: str, data: Any, alignment: int | None = None) -> None:
        if not isinstance(key, str) or not key:
            raise ExportError(f"named data key must be a non-empty string, got {key!r}")
        if alignment is not None and (alignment <= 0 or NAMED_DATA_ALIGNMENT % alignment):
            raise ExportError(f"named data '{key}': alignment {alignment} does not divide the program's "
                              f"{NAMED_DATA_ALIGNMENT}-byte segment alignment")
        raw = _as_bytes(data, key)
        old = self.data.get(key)
        if old is not None and old != raw:
            raise NamedDataConflictError(f"named data '{key}' is stored twice with different bytes "
                                         f"({len(old)} and {len(raw)} bytes): keys must name one content")
        self.data[key] = raw

    def merge(self, other: Mapping[str, bytes]) -> None:
        for k, v in other.items():
            self.add_named_data(k, v)


def named_data_of(output: Any, backend_id: str) -> dict[str, bytes]:
    """The ``{key: bytes}`` of a ``PreprocessResult.data_store_output``: a ``NamedDataStore``, a mapping of key to
    bytes-like, or an object shaped as the reference's ``NamedDataStoreOutput`` (``pte_data``: key -> entry with
    ``buffer_index``; ``buffers``: entries with ``buffer``). Anything else raises ``ExportError``."""
    store = NamedDataStore()
    if isinstance(output, NamedDataStore):
        items = output.data.items()
    elif isinstance(output, Mapping):
        items = output.items()
    elif hasattr(output, "pte_data") and hasattr(output, "buffers"):
        if getattr(output, "external_data", None):
            raise ExportError(f"backend '{backend_id}': data_store_output.external_data (a separate .ptd file) is "
                              "not supported: edgetorch keeps named data in the program")
        try:
            items = [(k, output.buffers[e.buffer_index].buffer) for k, e in output.pte_data.items()]
        except (AttributeError, IndexError, TypeError) as e:
            raise ExportError(f"backend '{backend_id}': malformed data_store_output ({e})") from None
    else:
        raise ExportError(f"backend '{backend_id}': data_store_output is a {type(output).__name__}; expected a "
                          "NamedDataStore or a mapping of key to bytes")
    for k, v in items:
        store.add_named_data(k, v)
    return store.data


@dataclass
class PreprocessResult:
    """``processed_bytes``: the delegate blob; ``debug_handle_map``: backend op id (int or str) -> the edge debug
    handles that op computes, so runtime events inside the delegate can be traced to source ops;
    ``debug_buffer_bytes``: what one traced call logs in the debug buffer (None: nothing or unknown), added to the
    method's ``debug_buffer_bytes``, the one figure the tracer reserves (the backend's runtime side declares
    nothing). ``data_store_output``: named data stored outside the blob (``NamedDataStore``, or a mapping of key
    to bytes; see ``named_data_of``): the program stores each key once across methods and delegates, and the
    backend's runtime side reads it by key (``named_data`` at ``init``)."""

    processed_bytes: bytes
    debug_handle_map: dict[int | str, tuple[int, ...]] = field(default_factory=dict)
    data_store_output: NamedDataStore | Mapping[str, Any] | Any | None = None
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
