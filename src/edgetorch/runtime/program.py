"""``Runtime`` and ``Program``: load a .pte (path, bytes or file), verify it, and hand out methods."""

from __future__ import annotations

import enum
import logging
import threading
from typing import Any

from edgetorch.errors import EdgeTorchError, MethodNotFoundError
from edgetorch.runtime.loader import LoadedFile, parse, read_data
from edgetorch.runtime.method import Method

log = logging.getLogger(__name__)


class Verification(enum.Enum):
    """How much of a program file is checked at load time."""

    Minimal = 0  # header, identifier and version
    InternalConsistency = 1  # also every index, offset and size against its bounds


class Program:
    """A loaded program; ``load_method(name)`` prepares a method for execution."""

    def __init__(self, loaded: LoadedFile, enable_etdump: bool = False, debug_buffer_size: Any = 0,
                 debug_buffer_path: str | None = None) -> None:
        self._loaded = loaded
        self._methods: dict[str, Method] = {}
        self._plans = {p.name: p for p in loaded.program.plans}
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

    def load_method(self, name: str) -> Method:
        if name not in self._plans:
            raise MethodNotFoundError(f"program has no method '{name}'; methods: {sorted(self._plans)}")
        m = self._methods.get(name)
        if m is None:
            if self._tracer is not None:
                m = self._tracer.load_method(name)
            else:
                m = Method(self, self._plans[name])
            self._methods[name] = m
        return m

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

    def load_program(self, data: Any, *, verification: Verification = Verification.InternalConsistency,
                     enable_etdump: bool = False, debug_buffer_size: int | str = 0,
                     debug_buffer_path: str | None = None) -> Program:
        """Loads a program from a path, bytes or binary file object.

        ``enable_etdump`` records a profile event per instruction; ``debug_buffer_size`` (bytes, or "auto" for
        the exact size one run needs) also records every intermediate output; ``debug_buffer_path`` streams
        intermediates to a file with no size limit.
        """
        if not isinstance(verification, Verification):
            raise TypeError(f"verification must be a Verification, got {verification!r}")
        buffer, path = read_data(data)
        from edgetorch.runtime.bundled import unwrap_bundled  # .bpte files embed a .pte
        buffer = unwrap_bundled(buffer, path)
        loaded = parse(buffer, path, verification == Verification.InternalConsistency)
        return Program(loaded, enable_etdump, debug_buffer_size, debug_buffer_path)
