"""Registry of delegate backends the runtime can execute; backends register a ``BackendRuntime``.

A backend named ``X`` is looked up in the registry, and if absent its module
``edgetorch.backends.X.runtime`` is imported once (it registers itself on import).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from edgetorch.errors import EdgeTorchError


class BackendRuntime(Protocol):
    name: str

    def init(self, processed: memoryview, compile_specs: dict[str, bytes]) -> Any:
        """Prepares a delegate blob; returns a handle passed to ``execute``."""

    def execute(self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                tracer: Any = None) -> None:
        """Runs the delegate, writing its results into ``outputs`` (planned tensors). ``tracer``: the method's
        observer (None without one); the backend may call the ``runtime.observer.DelegateEvents`` it has."""


def observe_delegate(backend: BackendRuntime, handle: Any, observer: Any) -> None:
    """Tells ``backend`` that ``observer`` (None: no observer any more) will watch the runs of ``handle``.

    Optional for a backend (``observe(handle, observer)``): it is called when the observer is attached to the
    method holding the delegate, before any run with it, so that a backend can prepare at load what traced runs
    need (the onnxruntime backend builds the session that exposes its intermediate values) instead of paying for
    it in the first traced run."""
    hook = getattr(backend, "observe", None)
    if hook is not None:
        hook(handle, observer)


_REGISTRY: dict[str, BackendRuntime] = {}


class BackendNotFoundError(EdgeTorchError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register_backend(backend: BackendRuntime) -> None:
    _REGISTRY[backend.name] = backend


def get_backend(name: str) -> BackendRuntime:
    if name not in _REGISTRY:
        try:
            importlib.import_module(f"edgetorch.backends.{name}.runtime")
        except ImportError:
            pass
    if name not in _REGISTRY:
        raise BackendNotFoundError(f"backend '{name}' is not registered in this runtime; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]
