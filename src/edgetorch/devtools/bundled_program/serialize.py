"""``BundledProgram`` <-> .bpte bytes (the file format is ``edgetorch.formats.bundled_program``)."""

from __future__ import annotations

import os
from typing import Any

from edgetorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
from edgetorch.devtools.bundled_program.core import BundledProgram
from edgetorch.formats import bundled_program as bpf

__all__ = ["deserialize_from_flatbuffer_to_bundled_program", "load_bundled_program",
           "serialize_from_bundled_program_to_flatbuffer"]


def serialize_from_bundled_program_to_flatbuffer(bundled_program: BundledProgram) -> bytes:
    """The .bpte file for ``bundled_program`` as bytes (use ``BundledProgram.save(path)`` to stream a big one
    to disk without building the bytes)."""
    if not isinstance(bundled_program, BundledProgram):
        raise TypeError(f"expected a BundledProgram, got {type(bundled_program).__name__}")
    return bundled_program.to_bytes()


def _value(v: Any) -> Any:
    return bpf.tensor_to_torch(v, copy=True) if isinstance(v, bpf.TensorData) else v


def deserialize_from_flatbuffer_to_bundled_program(flatbuffer: bytes | bytearray | memoryview,
                                                   path: str | None = None) -> Any:
    """Parses a .bpte into a ``BundledProgram`` (tensors are copies; the program is kept as .pte bytes).

    Corrupt or foreign data raises ``BundledProgramFormatError``; test cases that do not fit the embedded
    program raise the same errors as the constructor. A bundled program the reference ExecuTorch wrote
    (detected by content) gives an ``ExecutorchBundledProgram`` (its suites, and its program as bytes)."""
    from edgetorch.formats import bundled_program_executorch as xbp

    if not bpf.is_bundled_program(flatbuffer) and xbp.is_executorch_bundle(flatbuffer):
        from edgetorch.devtools.bundled_program.executorch import read_executorch_bundled_program

        return read_executorch_bundled_program(flatbuffer, path)
    bundle = bpf.read_bundle(flatbuffer, path)
    suites = [MethodTestSuite(s.method_name, [
        MethodTestCase([_value(v) for v in tc.inputs],
                       None if tc.expected_outputs is None else [_value(v) for v in tc.expected_outputs])
        for tc in s.test_cases]) for s in bundle.suites]
    return BundledProgram(bytes(bundle.program), suites)


def load_bundled_program(path: str | os.PathLike) -> Any:
    """Reads a .bpte file into a ``BundledProgram`` (an ``ExecutorchBundledProgram`` for the reference's)."""
    p = os.fspath(path)
    with open(p, "rb") as f:
        data = f.read()
    return deserialize_from_flatbuffer_to_bundled_program(data, p)
