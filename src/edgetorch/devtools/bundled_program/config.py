"""Test cases of a bundled program: ``MethodTestCase`` (inputs and expected outputs) and ``MethodTestSuite``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch
import torch.utils._pytree as pytree

from edgetorch.devtools.bundled_program.errors import InvalidTestCaseError

ConfigValue = Union[torch.Tensor, int, bool, float]  # noqa: UP007 (a runtime alias)
MethodInputType = Sequence[ConfigValue]
MethodOutputType = Sequence[torch.Tensor]

__all__ = ["ConfigValue", "MethodInputType", "MethodOutputType", "MethodTestCase", "MethodTestSuite"]


def _leaves(tree: Any, what: str) -> list[ConfigValue]:
    leaves, _ = pytree.tree_flatten(tree, is_leaf=lambda x: x is None)
    out: list[ConfigValue] = []
    for i, v in enumerate(leaves):
        if isinstance(v, torch.Tensor):
            out.append(v.detach())
        elif isinstance(v, (bool, int, float)):
            out.append(v)
        elif v is None:
            raise InvalidTestCaseError(f"{what} {i} is None: test-case values must be tensors, ints, floats or bools",
                                       index=i)
        else:
            raise InvalidTestCaseError(f"{what} {i} is a {type(v).__name__}: test-case values must be tensors, ints, "
                                       "floats or bools", index=i)
    return out


class MethodTestCase:
    """One set of inputs for a method and, optionally, the outputs it must produce.

    ``inputs`` and ``expected_outputs`` may be nested (tuples, lists, dicts: anything torch's pytree
    flattens); they are stored flattened, in the method's flattened input / output order. Leaves must be
    tensors, ints, floats or bools. Without ``expected_outputs`` the case can only be run (profiling), not
    verified.
    """

    def __init__(self, inputs: Any, expected_outputs: Any = None) -> None:
        self.inputs: list[ConfigValue] = _leaves(inputs, "input")
        self.expected_outputs: list[ConfigValue] | None = (
            None if expected_outputs is None else _leaves(expected_outputs, "expected output"))

    def __repr__(self) -> str:
        def show(vs: list | None) -> str:
            if vs is None:
                return "None"
            return "[" + ", ".join(f"Tensor({v.dtype}, {list(v.shape)})" if isinstance(v, torch.Tensor)
                                   else repr(v) for v in vs) + "]"
        return f"MethodTestCase(inputs={show(self.inputs)}, expected_outputs={show(self.expected_outputs)})"


@dataclass
class MethodTestSuite:
    """The test cases of one method (``method_name`` must name a method of the program)."""

    method_name: str
    test_cases: Sequence[MethodTestCase]

    def __post_init__(self) -> None:
        if not isinstance(self.method_name, str) or not self.method_name:
            raise InvalidTestCaseError(f"method_name must be a non-empty string, got {self.method_name!r}")
        self.test_cases = list(self.test_cases)
        for i, tc in enumerate(self.test_cases):
            if not isinstance(tc, MethodTestCase):
                raise InvalidTestCaseError(f"method test suite '{self.method_name}': test case {i} is a "
                                           f"{type(tc).__name__}, not a MethodTestCase",
                                           method_name=self.method_name, test_case=i)
