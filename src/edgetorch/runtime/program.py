"""``Runtime`` and ``Program``: load a .pte (path, bytes or file), verify it, and hand out methods.

A ``Program`` also owns the state of its mutable buffers (a KV cache): one tensor per buffer name, shared by
every method that names it (a ``prefill`` and a ``decode`` method update the same cache), initialised from the
constant the compiler stored and restored by ``reset()``.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import warnings
from typing import Any

import torch

from edgetorch.errors import EdgeTorchError, MethodNotFoundError, ProgramFormatError
from edgetorch.formats import program as pf
from edgetorch.formats.dtypes import code_dtype
from edgetorch.runtime.loader import LoadedFile, parse, read_data
from edgetorch.runtime.method import Method

__all__ = ["Verification", "Program", "Runtime"]

log = logging.getLogger(__name__)


class Verification(enum.Enum):
    """How much of a program file is checked at load time."""

    Minimal = 0  # header, identifier and version
    InternalConsistency = 1  # also every index, offset, size, dtype code and expression against its bounds
    Full = 2  # also the SHA-256 content hash of the whole file (weights and delegate blobs included)


class Program:
    """A loaded program; ``load_method(name)`` prepares a method for execution."""

    def __init__(self, loaded: LoadedFile, enable_etdump: bool = False, debug_buffer_size: Any = 0,
                 debug_buffer_path: str | None = None, fold_constants: bool = True) -> None:
        self._loaded = loaded
        self._fold_constants = fold_constants
        self._methods: dict[str, Method] = {}
        self._plans = {p.name: p for p in loaded.program.plans}
        self._buffers: dict[str, tuple[torch.Tensor, pf.MutableBufferDef]] = {}
        self._folded: dict[tuple, list[torch.Tensor]] = {}  # constant-only results shared by methods (Method)
        self._state_lock = threading.RLock()  # serialises the calls of every method with mutable buffers
        self._tracer = None
        if enable_etdump or debug_buffer_size or debug_buffer_path:
            from edgetorch.runtime.tracing import ProgramTracer  # only paid for when asked
            self._tracer = ProgramTracer(self, debug_buffer_size=debug_buffer_size,
                                         debug_buffer_path=debug_buffer_path)

    @property
    def method_names(self) -> set[str]:
        return set(self._plans)

    @property
    def content_hash(self) -> str:
        """SHA-256 of the program file body (the ETRecord and ETDump carry the same value)."""
        return self._loaded.header.content_hash

    @property
    def path(self) -> str | None:
        return self._loaded.path

    def plan(self, name: str) -> pf.PlanDef:
        """The execution plan of method ``name`` as the file stores it."""
        if name not in self._plans:
            raise MethodNotFoundError(f"program has no method '{name}'; methods: {sorted(self._plans)}")
        return self._plans[name]

    def load_method(self, name: str) -> Method:
        """The method ``name``, built on first use; with ETDump enabled, the tracer observes it."""
        m = self._methods.get(name)
        if m is None:
            plan = self.plan(name)
            t0 = time.perf_counter_ns()
            m = Method(self, plan)
            t1 = time.perf_counter_ns()
            if self._tracer is not None:
                self._tracer.attach(m, (t0, t1))
            self._methods[name] = m
        return m

    # -- mutable buffers ----------------------------------------------------------------------------
    def _initial_value(self, mb: pf.MutableBufferDef) -> torch.Tensor:
        """Buffer ``mb``'s initial value: a fresh zero tensor (``MUTABLE_ZERO_INIT``) or a read-only view of its
        constant's bytes (callers copy it)."""
        loaded = self._loaded
        dtype = code_dtype(mb.scalar_type)
        numel = 1
        for s in mb.sizes:
            numel *= s
        if mb.constant_index == pf.MUTABLE_ZERO_INIT:
            try:
                return torch.zeros(mb.sizes, dtype=dtype)
            except (RuntimeError, MemoryError) as e:  # sizes are checked at load; the machine may still lack them
                raise ProgramFormatError(f"mutable buffer '{mb.name}' ({numel * dtype.itemsize} bytes of zeros) "
                                         f"cannot be allocated: {e}", field="mutable_buffers") from e
        off, size = loaded.program.constants[mb.constant_index]
        if numel * dtype.itemsize > size:
            raise ProgramFormatError(f"mutable buffer '{mb.name}' needs {numel * dtype.itemsize} bytes, its initial "
                                     f"value constant has {size}", field="mutable_buffers")
        raw = torch.frombuffer(loaded.buffer, dtype=torch.uint8, count=numel * dtype.itemsize,
                               offset=loaded.segment_base + off) if numel else torch.empty(0, dtype=torch.uint8)
        return raw.view(dtype).view(mb.sizes)

    def _mutable_buffer(self, mb: pf.MutableBufferDef, method: str) -> torch.Tensor:
        """The state tensor of buffer ``mb.name`` (created from its initial value on first use)."""
        held = self._buffers.get(mb.name)
        if held is not None:
            t, first = held
            if (first.scalar_type, tuple(first.sizes)) != (mb.scalar_type, tuple(mb.sizes)):
                raise ProgramFormatError(f"method '{method}' declares mutable buffer '{mb.name}' as "
                                         f"{code_dtype(mb.scalar_type)} {list(mb.sizes)}, another method as "
                                         f"{code_dtype(first.scalar_type)} {list(first.sizes)}",
                                         field=f"{method}.mutable_buffers")
            return t
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # frombuffer on a read-only buffer: copied right away
            t = self._initial_value(mb)
        if mb.constant_index != pf.MUTABLE_ZERO_INIT:
            t = t.clone()  # the constant's bytes are the file's (read-only): the state is a copy
        self._buffers[mb.name] = (t, mb)
        return t

    def reset_buffers(self, names: list[str] | None = None) -> None:
        """Restores the initial value of the named mutable buffers (all when ``names`` is None)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for name in (self._buffers if names is None else names):
                t, mb = self._buffers[name]
                if mb.constant_index == pf.MUTABLE_ZERO_INIT:
                    t.zero_()
                else:
                    t.copy_(self._initial_value(mb))

    def reset(self) -> None:
        """Restores every mutable buffer (e.g. empties the KV cache before a new prompt)."""
        self.reset_buffers(None)

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        """The current state of each mutable buffer (live tensors: copy before the next run)."""
        return {name: t for name, (t, _) in self._buffers.items()}

    def metadata(self, name: str):
        return self.load_method(name).metadata

    def write_etdump_result_to_file(self, etdump_path: str, debug_buffer_path: str | None = None) -> None:
        """Writes the ETDump (and the debug buffer, when intermediates were recorded) to files."""
        if self._tracer is None:
            raise EdgeTorchError("no ETDump was recorded: load the program with enable_etdump=True")
        self._tracer.write(etdump_path, debug_buffer_path)

    @property
    def tracer(self):
        return self._tracer


class Runtime:
    """Process-wide entry point: ``Runtime.get().load_program(...)``."""

    _instance: Runtime | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> Runtime:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    @property
    def operator_registry(self):
        """The operators this runtime runs (``runtime.registries.OperatorRegistry``: ``operator_names``,
        ``has_operator``)."""
        from edgetorch.runtime.registries import OperatorRegistry

        return OperatorRegistry()

    @property
    def backend_registry(self):
        """The delegate backends this runtime runs (``runtime.registries.BackendRegistry``:
        ``registered_backend_names``, ``is_available``)."""
        from edgetorch.runtime.registries import BackendRegistry

        return BackendRegistry()

    def load_program(self, data: Any, *, verification: Verification = Verification.InternalConsistency,
                     enable_etdump: bool = False, debug_buffer_size: int | str = 0,
                     debug_buffer_path: str | None = None, fold_constants: bool = True) -> Program:
        """Loads a program from a path, bytes or binary file object.

        ``enable_etdump`` records a profile event per instruction; ``debug_buffer_size`` (bytes, or "auto" for
        the exact size one run needs) also records every intermediate output; ``debug_buffer_path`` streams
        intermediates to a file with no size limit. ``fold_constants`` (default True): an instruction of
        constants only (a quantized program's dequantized int8 weight) runs once when its method loads and its
        result stays resident (see ``runtime.method``); False computes it every run and keeps only the int8
        bytes.
        """
        if not isinstance(verification, Verification):
            raise TypeError(f"verification must be a Verification, got {verification!r}")
        if not isinstance(fold_constants, bool):
            raise TypeError(f"fold_constants must be True or False, got {fold_constants!r}")
        buffer, path = read_data(data)
        from edgetorch.runtime.bundled import unwrap_bundled  # .bpte files embed a .pte
        buffer = unwrap_bundled(buffer, path)
        loaded = parse(buffer, path, verification != Verification.Minimal, verification == Verification.Full)
        return Program(loaded, enable_etdump, debug_buffer_size, debug_buffer_path, fold_constants)
