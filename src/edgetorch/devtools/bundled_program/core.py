"""``BundledProgram``: a program plus test cases, validated against the program's methods."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from edgetorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
from edgetorch.devtools.bundled_program.errors import (
    BundledInputMismatchError,
    BundledMethodNotFoundError,
    BundledOutputMismatchError,
    BundledProgramError,
)
from edgetorch.formats import bundled_program as bpf
from edgetorch.formats import program as pf
from edgetorch.formats.dtypes import code_dtype

__all__ = ["BundledProgram"]


def _describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"a {v.dtype} tensor of shape {list(v.shape)}"
    return f"a {type(v).__name__} ({v!r})"


def _expect(spec: Any) -> str:
    if isinstance(spec, pf.TensorDef):
        return f"a {code_dtype(spec.scalar_type)} tensor of shape {list(spec.sizes)}"
    return f"a {type(spec).__name__}"


def _mismatch(v: Any, spec: Any) -> str | None:
    """Why ``v`` does not fit the plan value ``spec`` (None when it fits)."""
    if isinstance(spec, pf.TensorDef):
        if not isinstance(v, torch.Tensor):
            return "type"
        if v.dtype != code_dtype(spec.scalar_type):
            return "dtype"
        if list(v.shape) != list(spec.sizes):
            return "shape"
        return None
    if isinstance(v, torch.Tensor):
        return "type"
    if isinstance(spec, bool) or isinstance(v, bool):
        return None if isinstance(spec, bool) and isinstance(v, bool) else "type"
    if isinstance(spec, (int, float)):
        return None if type(v) is type(spec) else "type"
    return "type"  # a value kind the runtime does not take as input / give as output


def _value_to_def(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return bpf.tensor_from_torch(v)
    return v


class BundledProgram:
    """A program (.pte) with test cases for some of its methods.

    ``executorch_program`` is an ``ExecutorchProgramManager`` (or the bytes of a .pte); alternatively give
    ``pte_file_path``. Suites are sorted by method name and checked against the program: every suite names
    a method, every test case has as many inputs as the method with matching types, dtypes and shapes, and
    as many expected outputs (when given) with matching dtypes and shapes. Failures raise
    ``BundledProgramError`` subclasses naming the suite, test case and input/output.
    """

    def __init__(self, executorch_program: Any, method_test_suites: Sequence[MethodTestSuite],
                 pte_file_path: str | os.PathLike | None = None) -> None:
        if (executorch_program is None) == (pte_file_path is None):
            raise BundledProgramError("give exactly one of executorch_program and pte_file_path")
        self.executorch_program = executorch_program
        self.pte_file_path = None if pte_file_path is None else os.fspath(pte_file_path)
        self._buffer: Any = None
        self._program_def = self._load_program_def()
        suites = list(method_test_suites)
        for i, s in enumerate(suites):
            if not isinstance(s, MethodTestSuite):
                raise BundledProgramError(f"method test suite {i} is a {type(s).__name__}, not a MethodTestSuite")
        self.method_test_suites: list[MethodTestSuite] = sorted(suites, key=lambda s: s.method_name)
        self._validate()
        self._schema: bpf.BundleDef | None = None

    # -- the program -----------------------------------------------------------------------------------------
    def _load_program_def(self) -> pf.ProgramDef:
        src = self.executorch_program
        if src is not None and isinstance(getattr(src, "program", None), pf.ProgramDef):
            return src.program  # an ExecutorchProgramManager
        buf = self.program_buffer
        try:
            header = pf.read_header(memoryview(buf), self.pte_file_path or "program")
        except pf.ProgramFormatError as e:
            raise BundledProgramError(f"cannot bundle this program: {e}") from None
        off = header.flatbuffer_offset
        return pf.decode_flatbuffer(memoryview(buf)[off:off + header.flatbuffer_size])

    @property
    def program_buffer(self) -> bytes | memoryview:
        """The bytes of the .pte being bundled."""
        if self._buffer is None:
            src = self.executorch_program
            if src is None:
                try:
                    with open(self.pte_file_path, "rb") as f:
                        self._buffer = f.read()
                except FileNotFoundError:
                    raise BundledProgramError(f"program file not found: {self.pte_file_path}") from None
            elif isinstance(src, (bytes, bytearray, memoryview)):
                self._buffer = bpf.embedded_program(src)  # a .bpte's program is fine too
            elif hasattr(src, "buffer"):
                self._buffer = src.buffer
            else:
                raise BundledProgramError(f"executorch_program must be an ExecutorchProgramManager or the bytes of "
                                          f"a .pte, got {type(src).__name__}")
        return self._buffer

    @property
    def program(self) -> pf.ProgramDef:
        """The program's decoded flatbuffer (method signatures)."""
        return self._program_def

    # -- validation ------------------------------------------------------------------------------------------
    def _validate(self) -> None:
        plans = {p.name: p for p in self._program_def.plans}
        seen: set[str] = set()
        for s in self.method_test_suites:
            m = s.method_name
            if m in seen:
                raise BundledMethodNotFoundError(f"two method test suites name method '{m}'", method_name=m)
            seen.add(m)
            plan = plans.get(m)
            if plan is None:
                raise BundledMethodNotFoundError(f"method test suite '{m}': the program has no method '{m}' "
                                                 f"(methods: {sorted(plans)})", method_name=m)
            in_specs = [plan.values[v] for v in plan.inputs]
            out_specs = [plan.values[v] for v in plan.outputs]
            for i, tc in enumerate(s.test_cases):
                where = f"method test suite '{m}', test case {i}"
                if len(tc.inputs) != len(in_specs):
                    raise BundledInputMismatchError(
                        f"{where}: {len(tc.inputs)} input(s) given, method '{m}' takes {len(in_specs)} "
                        f"{plan.input_names}", method_name=m, test_case=i)
                for j, (v, spec) in enumerate(zip(tc.inputs, in_specs)):
                    why = _mismatch(v, spec)
                    if why:
                        name = plan.input_names[j] if j < len(plan.input_names) else str(j)
                        raise BundledInputMismatchError(
                            f"{where}: input {j} ('{name}') has the wrong {why}: {_describe(v)} given, method "
                            f"'{m}' takes {_expect(spec)}", method_name=m, test_case=i, index=j)
                if tc.expected_outputs is None:
                    continue
                if len(tc.expected_outputs) != len(out_specs):
                    raise BundledOutputMismatchError(
                        f"{where}: {len(tc.expected_outputs)} expected output(s) given, method '{m}' returns "
                        f"{len(out_specs)}", method_name=m, test_case=i)
                for j, (v, spec) in enumerate(zip(tc.expected_outputs, out_specs)):
                    why = _mismatch(v, spec)
                    if why:
                        raise BundledOutputMismatchError(
                            f"{where}: expected output {j} has the wrong {why}: {_describe(v)} given, method "
                            f"'{m}' returns {_expect(spec)}", method_name=m, test_case=i, index=j)

    # -- serialization ---------------------------------------------------------------------------------------
    def serialize_to_schema(self) -> bpf.BundleDef:
        """The file-format mirror (``edgetorch.formats.bundled_program.BundleDef``); built once."""
        if self._schema is None:
            suites = [bpf.TestSuiteDef(s.method_name, [
                bpf.TestCaseDef([_value_to_def(v) for v in tc.inputs],
                                None if tc.expected_outputs is None else
                                [_value_to_def(v) for v in tc.expected_outputs])
                for tc in s.test_cases]) for s in self.method_test_suites]
            self._schema = bpf.BundleDef(self.program_buffer, suites)
        return self._schema

    def to_bytes(self) -> bytes:
        """The .bpte file as bytes."""
        return bpf.serialize_bundle(self.serialize_to_schema())

    def save(self, path: str | os.PathLike) -> None:
        """Writes the .bpte atomically, streaming the program and tensor bytes (no whole-file copy)."""
        bpf.write_bundle(path, self.serialize_to_schema())

    def test_case(self, method_name: str, index: int) -> MethodTestCase:
        for s in self.method_test_suites:
            if s.method_name == method_name:
                if not 0 <= index < len(s.test_cases):
                    raise IndexError(f"method '{method_name}' has {len(s.test_cases)} test case(s), no index {index}")
                return s.test_cases[index]
        raise KeyError(f"no method test suite for '{method_name}'")

    def __repr__(self) -> str:
        suites = ", ".join(f"{s.method_name}: {len(s.test_cases)} case(s)" for s in self.method_test_suites)
        return f"BundledProgram({suites})"
