"""The runtime's single-threaded copies agree with torch's for every layout and dtype they meet."""

from __future__ import annotations

import math

import pytest
import torch

from edgetorch.runtime._copy import PARALLEL_MIN_NUMEL, clone, copy_into


@pytest.mark.parametrize("shape", [(3, 5, 7), (40, 33, 29)], ids=["small", "memmove"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool,
                                   torch.complex64])
def test_copy_into_and_clone_match_torch(dtype, shape):
    assert (math.prod(shape) >= PARALLEL_MIN_NUMEL) == (shape[0] == 40)  # both paths are exercised
    g = torch.Generator().manual_seed(0)
    src = (torch.randn(*shape, generator=g) * 10).to(dtype)
    for s in (src, src.transpose(0, 2).contiguous().transpose(0, 2), src[:, 1:4], src.expand(*shape),
              src[:0]):
        dst = torch.zeros(s.shape, dtype=dtype)
        copy_into(dst, s)
        assert torch.equal(dst, s)
        c = clone(s)
        assert torch.equal(c, s) and c.is_contiguous() and (s.numel() == 0 or c.data_ptr() != s.data_ptr())
    if dtype.is_complex:
        conj = src.conj()  # a lazily conjugated view: a byte copy would drop the conjugation
        dst = torch.zeros(src.shape, dtype=dtype)
        copy_into(dst, conj)
        assert torch.equal(dst, conj.resolve_conj()) and torch.equal(clone(conj), conj.resolve_conj())


def test_copy_into_converts_dtypes_and_broadcasts_like_copy_():
    dst = torch.zeros(2, 3, dtype=torch.float64)
    copy_into(dst, torch.arange(3, dtype=torch.int32))
    assert torch.equal(dst, torch.arange(3, dtype=torch.float64).expand(2, 3))
    out = torch.zeros(2, 3)
    copy_into(out[:, :2], torch.ones(2, 2))  # a non-contiguous destination
    assert torch.equal(out, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))
