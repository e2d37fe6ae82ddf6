"""Direct kernels bound in place of autogen out variants give bitwise the results of the op the program names."""

from __future__ import annotations

import pytest
import torch

from edgetorch.runtime.ops import direct_kernel

aten = torch.ops.aten


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.stride() == b.stride()
            and bool((a.contiguous().view(torch.int32) == b.contiguous().view(torch.int32)).all()))


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_no_training_direct(affine: bool, channels_last: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 9, 7, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = (torch.randn(16, generator=g), torch.randn(16, generator=g)) if affine else (None, None)
    mean, var = torch.randn(16, generator=g), torch.rand(16, generator=g) + 0.5
    want = aten._native_batch_norm_legit_no_training.default(x, w, b, mean, var, 0.1, 1e-5)[0]
    out, s1, s2 = torch.empty_like(x), torch.empty(0), torch.empty(0)
    call = direct_kernel(aten._native_batch_norm_legit_no_training.out, [x, w, b, mean, var, 0.1, 1e-5],
                         {"out0": out, "out1": s1, "out2": s2})
    assert call is not None
    call()
    assert _bits_equal(out, want) and s1.numel() == 0 and s2.numel() == 0


@pytest.mark.parametrize("kernel,stride,padding,bias", [(1, 1, 0, True), (1, 1, 0, False), (3, 2, 1, True)])
@pytest.mark.parametrize("threads", [1, 2])
def test_convolution_direct(kernel: int, stride: int, padding: int, bias: bool, threads: int) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 24, 14, 14, generator=g)
    w = torch.randn(32, 24, kernel, kernel, generator=g)
    b = torch.randn(32, generator=g) if bias else None
    pos = [x, w, b, [stride, stride], [padding, padding], [1, 1], False, [0, 0], 1]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        want = aten.convolution.default(*pos)
        out = torch.empty_like(want)
        call = direct_kernel(aten.convolution.out, pos, {"out": out})
        assert call is not None
        out.fill_(float("nan"))
        call()
        assert _bits_equal(out, want)
        torch.set_num_threads(1 if threads != 1 else 2)  # the backend choice follows the thread count
        want = aten.convolution.default(*pos)
        out.fill_(float("nan"))
        call()
        assert _bits_equal(out, want)
    finally:
        torch.set_num_threads(before)


def test_convolution_not_direct_for_groups_and_transposed() -> None:
    x = torch.randn(1, 8, 6, 6)
    out = torch.empty(1, 8, 6, 6)
    grouped = [x, torch.randn(8, 1, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 8]
    assert direct_kernel(aten.convolution.out, grouped, {"out": out}) is None
    transposed = [x, torch.randn(8, 8, 1, 1), None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1]
    assert direct_kernel(aten.convolution.out, transposed, {"out": out}) is None
    assert direct_kernel(aten.add.out, [x, x, 1], {"out": out}) is None
