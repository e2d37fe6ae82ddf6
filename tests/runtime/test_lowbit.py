"""The low-bit linear kernels (``edgetorch::linear_q4`` / ``linear_q8``): packing round-trips, the activation
quantization is torchao's bit for bit, and each op equals torchao's eager quantized linear within the documented
tolerance on each of its paths: the native kernels (``edgetorch.runtime.native``: matrix-vector up to
``NATIVE_GEMV_ROWS`` rows, dequantize + GEMM above) and the torch-only ones used without a C compiler
(matrix-vector up to ``SMALL_M`` rows). The native kernels' own arithmetic is checked in test_native_kernels.py."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from edgetorch.runtime import lowbit, native

torchao = pytest.importorskip("torchao")
from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_  # noqa: E402
from torchao.quantization.granularity import PerAxis, PerGroup  # noqa: E402

#: documented tolerance of the kernels (bf16 operands, fp32 accumulation), relative to the output's magnitude
REL_TOL = 2e-2


@pytest.fixture(params=["native", "torch"])
def kernel_path(request, monkeypatch):
    """Run a test on the native kernels (skipped where they cannot be built) and on the torch-only ones."""
    if request.param == "native":
        if native.kernels() is None:
            pytest.skip(f"native kernels unavailable: {native.status()}")
    else:
        monkeypatch.setattr(native, "kernels", lambda: None)
    return request.param


def test_int4_packing_round_trips_and_is_two_per_byte():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (48, 96), generator=g, dtype=torch.int8)
    packed = lowbit.pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (48, 48)
    assert torch.equal(lowbit.unpack_int4(packed), q)
    assert int(packed[0, 0]) == (int(q[0, 0]) + 8) | ((int(q[0, 1]) + 8) << 4)


def test_activation_quantization_is_torchaos_bit_for_bit():
    from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import (
        _apply_int8_act_asym_per_token_quant_dequant,
    )

    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 64, generator=g) * torch.linspace(0.01, 30, 5).unsqueeze(1)
    x[2] = x[2].abs()  # a token with no negative value (zero point at the bottom)
    assert torch.equal(lowbit.fake_quant_per_token(x), _apply_int8_act_asym_per_token_quant_dequant(x))
    many = torch.randn(300, 64, generator=g) * torch.logspace(-4, 3, 300).unsqueeze(1)
    many[::7] = many[::7].abs()
    many[::11] = -many[::11].abs()
    for row in torch.cat([x, many]).split(1):  # one token (decode): the scalar path
        assert torch.equal(lowbit.fake_quant_per_token(row), _apply_int8_act_asym_per_token_quant_dequant(row))


def _quantized(config, in_features=256, out_features=96):
    lin = torch.nn.Linear(in_features, out_features, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(2)) * 0.05)
    q = copy.deepcopy(lin)
    quantize_(q, config)
    return q


def _lowered(q):
    from edgetorch.export.lowbit import lower_lowbit_modules

    holder = torch.nn.Sequential(copy.deepcopy(q))
    report = lower_lowbit_modules(holder)
    assert report.lowered == ["0"], report.skipped
    return holder[0]


CONFIGS = {
    "8da4w_g32": Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
    "8da4w_per_channel": Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                               weight_granularity=PerAxis(0)),
    "int4_weight_only_g64": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(64)),
    "int8_weight_only": IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
}


@pytest.mark.parametrize("rows", [1, 7, lowbit.SMALL_M + 9], ids=["decode", "few", "prefill"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_op_matches_torchao_eager_within_tolerance(name, rows, kernel_path):
    q = _quantized(CONFIGS[name])
    low = _lowered(q)
    x = torch.randn(1, rows, 256, generator=torch.Generator().manual_seed(rows))
    with torch.no_grad():
        want, got = q(x), low(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= REL_TOL, f"{name}: relative error {err:.4f}"
    # the low-bit op is not a float copy of torchao's: its weight stays packed
    assert low.weight.dtype == (torch.int8 if name == "int8_weight_only" else torch.uint8)


@pytest.mark.parametrize("bits", [4, 8])
def test_out_variant_writes_the_functional_result(bits, kernel_path):
    config = CONFIGS["8da4w_g32" if bits == 4 else "int8_weight_only"]
    low = _lowered(_quantized(config))
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(5))
    out = torch.full((3, 96), float("nan"))
    if bits == 4:
        want = torch.ops.edgetorch.linear_q4(x, low.weight, low.scales, low.bias, low.group_size, low.act_quant)
        torch.ops.edgetorch.linear_q4.out(x, low.weight, low.scales, low.bias, low.group_size, low.act_quant,
                                          out=out)
        from edgetorch.runtime.ops import direct_kernel  # the runtime's call, bound past the dispatcher

        direct_out = torch.full((3, 96), float("nan"))
        call = direct_kernel(torch.ops.edgetorch.linear_q4.out, [x, low.weight, low.scales, low.bias,
                                                                 low.group_size, low.act_quant], {"out": direct_out})
        assert call is not None
        call()
        assert torch.equal(direct_out, want)
    else:
        s = low.scales
        want = torch.ops.edgetorch.linear_q8(x, low.weight, s, low.bias, low.act_quant)
        torch.ops.edgetorch.linear_q8.out(x, low.weight, s, low.bias, low.act_quant, out=out)
    assert torch.equal(out, want)


def test_int4_kernel_layout_is_made_once_per_weight(monkeypatch):
    monkeypatch.setattr(native, "kernels", lambda: None)  # the torch-only path (the native one caches nothing)
    low = _lowered(_quantized(CONFIGS["8da4w_g32"]))
    x = torch.randn(1, 256)
    low(x)
    first = lowbit._cpu_int4(low.weight, low.scales, low.group_size)[0]
    low(x)
    assert lowbit._cpu_int4(low.weight, low.scales, low.group_size)[0] is first
    assert first.dtype == torch.uint8 and first.numel() == low.weight.numel()  # int4 in memory, never float


def test_chunked_conversion_to_the_cpu_layout_gives_the_whole_weights_bytes():
    g = torch.Generator().manual_seed(3)
    n, k = 4 * lowbit._CHUNK_ROWS + 64, 96
    weight = lowbit.pack_int4(torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8))
    whole = torch.stack((weight & 15, weight >> 4), dim=-1).reshape(n, k).to(torch.int32)
    assert torch.equal(lowbit._convert_rows(weight, n, k),
                       torch.ops.aten._convert_weight_to_int4pack_for_cpu(whole, 1))


def test_prefill_dequantization_is_the_weights_in_bf16(kernel_path):
    g = torch.Generator().manual_seed(4)
    q = torch.randint(-8, 8, (64, 128), generator=g, dtype=torch.int8)
    scales = torch.rand(64, 4, generator=g)
    want = (q.float().view(64, 4, 32) * scales.to(torch.bfloat16).float().unsqueeze(-1)).view(64, 128)
    assert torch.equal(lowbit._dequant_bf16(lowbit.pack_int4(q), scales, 32), want.to(torch.bfloat16))


def test_a_wide_prefill_in_row_chunks_matches_the_whole_weight(monkeypatch, kernel_path):
    g = torch.Generator().manual_seed(6)
    weight = lowbit.pack_int4(torch.randint(-8, 8, (1024, 64), generator=g, dtype=torch.int8))
    scales = torch.rand(1024, 2, generator=g) * 0.1
    xb = torch.randn(40, 64, generator=g).to(torch.bfloat16)
    whole = lowbit._dequant_mm(xb, weight, scales, 32)
    monkeypatch.setattr(lowbit, "_CHUNKED_ABOVE", 256)
    monkeypatch.setattr(lowbit, "_DEQUANT_ROWS", 192)  # a last chunk shorter than the others
    chunked = lowbit._dequant_mm(xb, weight, scales, 32)
    assert chunked.shape == whole.shape == (40, 1024)
    torch.testing.assert_close(chunked.float(), whole.float(), rtol=1e-2, atol=1e-2)


def test_prefills_of_weights_of_other_shapes_reuse_the_scratch_buffers_without_mixing_them(monkeypatch,
                                                                                           kernel_path):
    """The dequantization writes into per-thread buffers reused by every call: a smaller weight after a larger
    one (and back) must give exactly the GEMM of its own bf16 weight, and the buffers stay one per kind."""
    monkeypatch.setattr(lowbit, "_SCRATCH", threading.local())  # this thread's buffers start empty
    g = torch.Generator().manual_seed(8)
    cases = []
    for n, k in ((256, 128), (64, 64), (256, 128), (96, 192)):
        q = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
        scales = torch.rand(n, k // 32, generator=g) * 0.1
        xb = torch.randint(-255, 256, (48, k), generator=g).to(torch.bfloat16)
        w = (q.float().view(n, k // 32, 32) * scales.to(torch.bfloat16).float().unsqueeze(-1)).view(n, k)
        cases.append((xb, lowbit.pack_int4(q), scales, torch.mm(xb, w.to(torch.bfloat16).t())))
    for xb, packed, scales, want in cases + cases[::-1]:
        assert torch.equal(lowbit._dequant_mm(xb, packed, scales, 32), want)
    assert lowbit._SCRATCH.bf16.numel() == 256 * 128
    if kernel_path == "torch":
        assert lowbit._SCRATCH.nibbles.numel() == 256 * 64
