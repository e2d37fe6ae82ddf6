"""A bundled program written by the reference ExecuTorch (.bpte, "BP08"; the format is read by
``edgetorch.formats.bundled_program_executorch``): its test suites as ``MethodTestSuite``s and its embedded
reference program as bytes. ``load_bundled_program`` returns one for such a file, so its inputs and expected
outputs can feed an ETRecord (``update_representative_inputs`` / ``update_reference_outputs``) or the Inspector."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgetorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
from edgetorch.formats import bundled_program_executorch as xbp
from edgetorch.formats.bundled_program import TensorData

__all__ = ["ExecutorchBundledProgram", "read_executorch_bundled_program"]


@dataclass
class ExecutorchBundledProgram:
    """Test suites (sorted by method name) and the reference's .pte bytes (``program``), which edgetorch's
    runtime does not run; ``version`` is the file's schema version."""

    program: bytes
    method_test_suites: list[MethodTestSuite]
    version: int

    @property
    def executorch_program(self) -> bytes:
        return self.program


def _value(v: Any) -> Any:
    return xbp.tensor_value(v) if isinstance(v, TensorData) else v


def read_executorch_bundled_program(data: Any, path: str | None = None) -> ExecutorchBundledProgram:
    """Parses a reference .bpte (``BundledProgramFormatError`` naming the field when it is malformed)."""
    bundle = xbp.read_executorch_bundle(data, path)
    suites = [MethodTestSuite(s.method_name, [
        MethodTestCase([_value(v) for v in tc.inputs],
                       None if tc.expected_outputs is None else [_value(v) for v in tc.expected_outputs])
        for tc in s.test_cases]) for s in bundle.suites]
    return ExecutorchBundledProgram(bytes(bundle.program), sorted(suites, key=lambda s: s.method_name),
                                    bundle.version)
