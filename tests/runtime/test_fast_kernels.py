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
    assert direct_kernel(aten.abs.out, [x], {"out": out}) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_relu_direct(dtype: torch.dtype) -> None:
    x = (torch.randn(64, 33) * 10).to(dtype)
    if dtype.is_floating_point:
        x[0, :3] = torch.tensor([float("nan"), -0.0, float("-inf")])
    want = aten.relu.default(x)
    for in_place in (False, True):
        src = x.clone()
        out = src if in_place else torch.empty_like(x)
        call = direct_kernel(aten.relu.out, [src], {"out": out})
        assert call is not None
        call()
        assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))


def _public_cases() -> dict:
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    m, b3 = torch.randn(5, 4, generator=g), torch.randn(2, 3, 5, generator=g)
    i = torch.randint(-3, 3, (3, 5), generator=g)
    return {
        aten.addmm.out: ([torch.randn(4), x, m], {"beta": 1, "alpha": 1}),
        aten.mm.out: ([x, m], {}), aten.bmm.out: ([b3, torch.randn(2, 5, 3, generator=g)], {}),
        aten.add.out: ([x, y], {"alpha": 2}), aten.sub.out: ([x, y], {"alpha": 1}), aten.mul.out: ([x, y], {}),
        aten.div.out: ([x, y], {}), aten.clamp_min.out: ([x, 0], {}), aten.clamp.out: ([x, -0.5, 0.5], {}),
        aten._softmax.out: ([x, 1, False], {}), aten._log_softmax.out: ([x, 0, False], {}),
        aten.gelu.out: ([x], {"approximate": "tanh"}), aten.silu.out: ([x], {}),
        aten.hardtanh.out: ([x, -1.0, 1.0], {}), aten.sigmoid.out: ([x], {}), aten.tanh.out: ([x], {}),
        aten.rsqrt.out: ([x.abs()], {}), aten.neg.out: ([x], {}), aten.exp.out: ([x], {}),
        aten.mean.out: ([x, [1], True], {"dtype": None}), aten.sum.IntList_out: ([x, [0], False], {"dtype": None}),
        aten.amax.out: ([x, [1], False], {}), aten.argmax.out: ([x, 1, False], {}),
        aten.cumsum.out: ([i, 1], {"dtype": torch.int64}), aten.gt.Scalar_out: ([x, 0.1], {}),
        aten.eq.Tensor_out: ([i, i.flip(0)], {}), aten.logical_or.out: ([x > 0, y > 0], {}),
        aten.bitwise_not.out: ([x > 0], {}), aten.where.self_out: ([x > 0, x, y], {}),
        aten.pow.Tensor_Scalar_out: ([x, 3.0], {}),
    }


def test_every_public_binding_matches_its_overload() -> None:
    from edgetorch.runtime.ops import _PUBLIC

    cases = _public_cases()
    assert set(cases) == set(_PUBLIC)
    for op, (pos, kw) in cases.items():
        want = op(*pos, **kw, out=torch.empty(0, dtype=_out_dtype(op, pos)))
        out = torch.empty(0, dtype=want.dtype)
        call = direct_kernel(op, pos, {**kw, "out": out})
        assert call is not None, op
        call()
        assert out.shape == want.shape and torch.equal(out.view(torch.uint8), want.view(torch.uint8)), op


def _out_dtype(op: torch._ops.OpOverload, pos: list) -> torch.dtype:
    name = op._schema.name
    if name in ("aten::argmax", "aten::cumsum"):
        return torch.int64
    if name in ("aten::gt", "aten::eq", "aten::logical_or", "aten::bitwise_not"):
        return torch.bool
    return torch.float32


def test_functional_fills_and_copies_write_the_slot_directly() -> None:
    from edgetorch.runtime.ops import direct_functional

    x = torch.randn(4, 6) * 100
    cases = [
        (aten._to_copy.default, [x], {"dtype": torch.int32}),
        (aten._to_copy.default, [x], {"dtype": torch.float16}),
        (aten._to_copy.default, [x.t()], {"dtype": torch.bfloat16, "memory_format": torch.contiguous_format}),
        (aten.full_like.default, [x, 0.1], {"dtype": torch.float16}),
        (aten.full_like.default, [x, -3], {"dtype": None}),
        (aten.scalar_tensor.default, [1e-3], {"dtype": torch.float64}),
        (aten.scalar_tensor.default, [7], {"dtype": torch.int64}),
    ]
    for op, pos, kw in cases:
        want = op(*pos, **kw)
        dst = torch.empty_like(want, memory_format=torch.contiguous_format)
        call = direct_functional(op, pos, kw, dst)
        assert call is not None, (op, kw)
        call()
        bits = [t.reshape(-1).contiguous().view(torch.uint8) for t in (dst, want)]
        assert dst.dtype == want.dtype and dst.shape == want.shape and torch.equal(*bits), (op, kw)
    assert direct_functional(aten._to_copy.default, [x], {"device": "meta"}, torch.empty(4, 6)) is None


@pytest.mark.parametrize("memory_format", [None, torch.contiguous_format, torch.channels_last])
def test_clone_direct(memory_format: torch.memory_format | None) -> None:
    x = torch.randn(2, 3, 4, 5)
    want = aten.clone.default(x, memory_format=memory_format)
    out = torch.empty_like(want)
    call = direct_kernel(aten.clone.out, [x], {"memory_format": memory_format, "out": out})
    assert call is not None
    call()
    assert out.stride() == want.stride() and torch.equal(out, want)
    same = x.clone()
    direct_kernel(aten.clone.out, [same], {"memory_format": None, "out": same})()  # in place: unchanged
    assert torch.equal(same, x)


@pytest.mark.parametrize("scale,zero_point,dtype,qmin,qmax", [(0.02, 0, torch.int8, -128, 127),
                                                               (0.0173, -7, torch.int8, -128, 127),
                                                               (0.5, 3, torch.uint8, 0, 255)])
def test_pt2e_quantize_and_dequantize_per_tensor_direct(scale: float, zero_point: int, dtype: torch.dtype,
                                                        qmin: int, qmax: int) -> None:
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    from edgetorch.runtime.ops import direct_functional

    qd = torch.ops.quantized_decomposed
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 5, 5, generator=g) * 3
    x.view(-1)[:8] = torch.tensor([0.5, 1.5, -0.5, -2.5, 1e9, -1e9, 0.0, -0.0]) * scale  # ties and clamping
    args = [x, scale, zero_point, qmin, qmax, dtype]
    want = qd.quantize_per_tensor.default(*args)
    q = torch.empty_like(want)
    call = direct_functional(qd.quantize_per_tensor.default, args, {}, q)
    assert call is not None
    call()
    assert torch.equal(q, want) and q.dtype == dtype
    want_f = qd.dequantize_per_tensor.default(want, scale, zero_point, qmin, qmax, dtype)
    f = torch.empty_like(want_f)
    call = direct_functional(qd.dequantize_per_tensor.default, [want, scale, zero_point, qmin, qmax, dtype], {}, f)
    assert call is not None
    call()
    assert _bits_equal(f, want_f)
    # what it does not cover falls back to the op itself
    assert direct_functional(qd.quantize_per_tensor.default, [x.double(), *args[1:]], {}, q) is None
    assert direct_functional(qd.dequantize_per_tensor.default, [want, scale, zero_point, qmin, qmax, dtype],
                             {"out_dtype": torch.bfloat16}, f) is None


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_into_its_own_buffer_runs_in_place(accumulate: bool) -> None:
    """A KV-cache update (``index_put.out`` whose ``out`` is its ``self``) runs as ``index_put_``: the same
    values, the same storage, and no whole-buffer clone."""
    g = torch.Generator().manual_seed(9)
    cache = torch.randn(1, 4, 16, 8, generator=g)
    values, slots = torch.randn(1, 4, 3, 8, generator=g), torch.tensor([2, 5, 11])
    want = aten.index_put.default(cache, [None, None, slots], values, accumulate)
    call = direct_kernel(aten.index_put.out, [cache, [None, None, slots], values, accumulate], {"out": cache})
    assert call is not None
    ptr = cache.data_ptr()
    call()
    assert _bits_equal(cache, want) and cache.data_ptr() == ptr
    other = torch.empty_like(cache)  # a different out: the op's own out variant (None: the caller binds it)
    assert direct_kernel(aten.index_put.out, [cache, [None, None, slots], values, accumulate], {"out": other}) is None
