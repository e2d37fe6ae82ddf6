"""Single-threaded tensor copies for the runtime's own data movement (inputs in, outputs out, debug values).

``torch`` copies of more than a few thousand elements run as an OpenMP parallel region, after which the
OpenMP worker threads spin-wait for a while. When the next thing to run is a delegate with its own thread
pool (ONNX Runtime), those spinning threads take the cores it needs: on 2 cores a ResNet-18 run fully
delegated to ORT took 1.19x ORT's own latency only because of the 600 KB input copy before it. A plain
``memmove`` (which releases the GIL) moves the same bytes at memory speed without waking any pool.
"""

from __future__ import annotations

import ctypes

import torch

_memmove = ctypes.memmove
#: torch's parallel grain (``at::internal::GRAIN_SIZE``): smaller copies never start a parallel region, and
#: torch's own copy is then the quickest call
PARALLEL_MIN_NUMEL = 32768


def _flat_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for tensors of one shape; a ``memmove`` when both are contiguous with one dtype."""
    if src.numel() < PARALLEL_MIN_NUMEL:
        dst.copy_(src)
    elif (src.dtype == dst.dtype and src.device.type == "cpu" and dst.device.type == "cpu" and src.shape == dst.shape
            and src.is_contiguous() and dst.is_contiguous() and not (src.is_conj() or src.is_neg())):
        n = _flat_bytes(src)
        if n:
            _memmove(dst.data_ptr(), src.data_ptr(), n)
    else:
        dst.copy_(src)


def clone(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` in fresh memory (``memmove`` when ``t`` is contiguous)."""
    if (t.numel() < PARALLEL_MIN_NUMEL or t.device.type != "cpu" or not t.is_contiguous() or t.is_conj()
            or t.is_neg()):
        return t.clone(memory_format=torch.contiguous_format)
    out = torch.empty(t.shape, dtype=t.dtype)
    n = _flat_bytes(t)
    if n:
        _memmove(out.data_ptr(), t.data_ptr(), n)
    return out
