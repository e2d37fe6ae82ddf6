"""Scalar-type codes shared by every format (numbered like c10::ScalarType), their torch dtypes, and the
row-major strides the formats store tensors with."""

from __future__ import annotations

import torch

__all__ = ["DTYPE_TO_CODE", "CODE_TO_DTYPE", "PLAIN_CODE_TO_DTYPE", "MEMORY_FORMATS", "CODE_TO_MEMORY_FORMAT",
           "LAYOUTS", "CODE_TO_LAYOUT", "dtype_code", "code_dtype", "storage_nbytes", "contiguous_strides"]

DTYPE_TO_CODE: dict[torch.dtype, int] = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.complex32: 8, torch.complex64: 9, torch.complex128: 10,
    torch.bool: 11, torch.qint8: 12, torch.quint8: 13, torch.qint32: 14, torch.bfloat16: 15,
    torch.uint16: 27, torch.uint32: 28, torch.uint64: 29,
}
CODE_TO_DTYPE: dict[int, torch.dtype] = {v: k for k, v in DTYPE_TO_CODE.items()}
_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32}
# the codes whose bytes can be viewed as a tensor (torch.frombuffer crashes on quantized dtypes)
PLAIN_CODE_TO_DTYPE: dict[int, torch.dtype] = {c: d for c, d in CODE_TO_DTYPE.items() if d not in _QUANTIZED}

MEMORY_FORMATS: dict[torch.memory_format, int] = {
    torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2, torch.channels_last_3d: 3,
}
CODE_TO_MEMORY_FORMAT = {v: k for k, v in MEMORY_FORMATS.items()}
LAYOUTS: dict[torch.layout, int] = {torch.strided: 0, torch.sparse_coo: 1}
CODE_TO_LAYOUT = {v: k for k, v in LAYOUTS.items()}


def dtype_code(dtype: torch.dtype) -> int:
    try:
        return DTYPE_TO_CODE[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} has no scalar-type code in edgetorch formats") from None


def code_dtype(code: int) -> torch.dtype:
    try:
        return CODE_TO_DTYPE[code]
    except KeyError:
        raise ValueError(f"unknown scalar-type code {code}") from None


def storage_nbytes(sizes, strides, storage_offset: int, itemsize: int) -> int:
    """Bytes from the storage start to one past the last element (0 for empty tensors)."""
    if any(s == 0 for s in sizes):
        return 0
    last = storage_offset + sum((s - 1) * st for s, st in zip(sizes, strides))
    return (last + 1) * itemsize


def contiguous_strides(sizes: list[int] | tuple[int, ...]) -> list[int]:
    """Row-major element strides of a tensor of ``sizes`` (size-0/1 dimensions count as 1, as torch does)."""
    strides, acc = [0] * len(sizes), 1
    for i in range(len(sizes) - 1, -1, -1):
        strides[i] = acc
        acc *= max(sizes[i], 1)
    return strides
