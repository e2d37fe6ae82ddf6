"""The edgetorch runtime: loads .pte programs and executes their methods. Never imports the compiler."""

from edgetorch.runtime import lowbit as _lowbit  # noqa: F401 - defines the edgetorch:: low-bit ops programs call
from edgetorch.runtime.method import Method, MethodMeta, TensorInfo
from edgetorch.runtime.program import Program, Runtime, Verification

__all__ = ["Method", "MethodMeta", "Program", "Runtime", "TensorInfo", "Verification"]
