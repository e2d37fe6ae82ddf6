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

__all__ = ["BackendRuntime", "observe_delegate", "BackendNotFoundError", "register_backend", "get_backend"]


class BackendRuntime(Protocol):
    """The runtime side of a delegate backend: what a ``DELEGATE_CALL`` instruction runs (the backend contract,
    docs/architecture.md).

    **Where it lives, what it may import.** ``edgetorch/backends/<name>/runtime.py`` defines it and calls
    ``register_backend`` at import; ``get_backend(name)`` imports that module on first use. It and everything it
    imports (even inside functions) may use ``edgetorch.errors``/bottom modules, ``edgetorch.formats``,
    ``edgetorch.runtime`` and the backend's own helper modules, never the compiler (``edgetorch.exir``), the
    export session, the models, the developer tools or the CLI, nor AOT-only packages (torchao, transformers,
    onnxscript, ``torch.onnx``), nor its own ahead-of-time modules (``preprocess``, ``partitioner``, ``ops``).
    The package ``__init__`` of ``backends/<name>`` imports neither side eagerly (a lazy ``__getattr__`` may hand
    out the partitioner). ``tests/test_architecture.py`` checks the imports statically and
    ``tests/test_backend_contract.py`` runs a program of every backend in a fresh process.

    **Lifecycle.** ``init`` once per delegate when a method loads; optional ``observe(handle, observer)`` when an
    observer attaches to or detaches from (None) the method, before any run with it
    (``observe_delegate``); ``execute`` per run of the instruction, on the calling thread.

    **What a delegate logs.** With an observer, ``execute`` gets it as ``tracer`` and may call, looked up with
    ``getattr`` (an observer need not have them) and only while its ``DELEGATE_CALL`` runs, the
    ``runtime.observer.DelegateEvents``: ``log_delegate_profile(id, start_ns, end_ns, metadata)``,
    ``log_delegate_output(id, value, snapshot=)`` and ``delegate_output_buffer(shape, dtype)``. ``id`` (the
    delegate debug id: an int >= 0 or a non-empty str) of an output is a key of the ``debug_handle_map`` its
    ``PreprocessResult`` declared, which is how the Inspector finds the edge ops (``HandleGroup`` of kind
    ``in_delegate``) a value belongs to; a profile event may use an engine's own name, and an id outside the map
    (the onnxruntime backend's ``"observer_effect"``) is kept but maps to no op.

    **Debug bytes.** What one traced call logs is declared once, ahead of time, in
    ``PreprocessResult.debug_buffer_bytes`` (``formats.alignment.debug_bytes`` of its tensors' sizes); emission
    adds it to the method's ``debug_buffer_bytes`` (``formats.program.run_debug_bytes``) and the tracer reserves
    that figure, read from the plan: the runtime side declares nothing. Logging more than was declared overflows
    a fixed debug buffer with a ``DebugBufferOverflowError``.
    """

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
