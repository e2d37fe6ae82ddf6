"""Resolves operator names stored in a program to callable ATen kernels."""

from __future__ import annotations

import functools
import importlib

import torch

from edgetorch.errors import ProgramFormatError

#: Operator namespaces registered by a Python module rather than by torch's C++ core. The module is imported
#: the first time an operator of that namespace is not found, so a process that only runs programs (and never
#: imported the quantization tool-chain) can still execute PT2E Q/DQ ops.
_LAZY_NAMESPACES: dict[str, str] = {
    "quantized_decomposed": "torch.ao.quantization.fx._decomposed",  # Q/DQ and choose_qparams (torch itself)
    "torchao": "torchao.quantization.quant_primitives",  # torchao's affine quantize/dequantize ops
}


def _lookup(ns: str, op: str, overload: str) -> torch._ops.OpOverload:
    packet = getattr(getattr(torch.ops, ns), op)
    return getattr(packet, overload or "default")


@functools.cache
def resolve_operator(name: str, overload: str) -> torch._ops.OpOverload:
    """``("aten::addmm", "out")`` -> ``torch.ops.aten.addmm.out``; unknown names raise ProgramFormatError."""
    ns, _, op = name.partition("::")
    if not ns or not op:
        raise ProgramFormatError(f"operator name '{name}' is not of the form namespace::name", field="operators")
    try:
        return _lookup(ns, op, overload)
    except (AttributeError, RuntimeError):
        pass
    module = _LAZY_NAMESPACES.get(ns)
    if module is not None:
        try:
            importlib.import_module(module)
            return _lookup(ns, op, overload)
        except (ImportError, AttributeError, RuntimeError):
            pass
    raise ProgramFormatError(
        f"operator {name}.{overload or 'default'} is not available in this runtime", field="operators")
