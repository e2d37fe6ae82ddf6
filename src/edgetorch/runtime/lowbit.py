"""Low-bit linear kernels: ``edgetorch::linear_q4`` and ``edgetorch::linear_q8`` (each with its ``.out`` variant).

The export side (``edgetorch.export.lowbit``) replaces every torchao-quantized Linear by one of these ops; the
program stores the weights packed and the runtime calls them here (this module imports only torch, so the runtime
never needs the compiler or torchao to run a low-bit program).

``linear_q4(x, weight, scales, bias, group_size, act_quant)``
    ``weight``: uint8 ``[N, K/2]``, two int4 values per byte: byte ``j`` of row ``n`` holds ``q[n, 2j] + 8`` in its
    low nibble and ``q[n, 2j+1] + 8`` in its high nibble (``q`` in [-8, 7], symmetric, no zero point; the layout
    of ONNX Runtime's ``MatMulNBits`` with its default zero point 8). ``scales``: ``[N, K/group_size]``,
    bfloat16 as the export stores them (the kernels compute with bf16 scales; float32 is accepted and rounded).
    The weight of element ``(n, k)`` is ``q[n, k] * scales[n, k // group_size]``.
``linear_q8(x, weight, scales, bias, act_quant)``
    ``weight``: int8 ``[N, K]``, ``scales``: float32 ``[N]`` (per output channel).

``act_quant=True`` first quantizes ``x`` per token to int8 (asymmetric, torchao's ``int8_asym_per_token``: the
same arithmetic as torchao's eager model, bit for bit) and dequantizes it: 8da4w.

Kernels (chosen by measurement on x86 AVX-512/AMX, docs/performance.md):

- int4, the native kernels (``edgetorch.runtime.native``, built on first use with the machine's C compiler): up
  to ``NATIVE_GEMV_ROWS`` rows (decode) a matrix-vector product straight from the program's packed bytes (8da4w
  with AVX-512 VNNI: the activations quantized per token in C, the same integers as torchao's, exact int32 sums per
  group; otherwise float32 arithmetic), so no unpacked copy of any weight exists; above (prefill) the weight is
  dequantized to bfloat16 in one pass per call and multiplied in one bfloat16 GEMM (AMX/oneDNN);
- int4 without a C compiler: the activations go to bfloat16, up to ``SMALL_M`` rows torch's
  ``_weight_int4pack_mm_for_cpu`` (its weight layout depends on the CPU, so the program's two-per-byte layout is
  converted once per weight on first use and cached: int4 in memory, never float), above it the same
  dequantize-and-GEMM in torch ops;
- int8: ``_weight_int8pack_mm`` straight on the program's bytes (no copy), bfloat16 GEMM above ``SMALL_M`` rows.

Tolerance: bfloat16 scales; in the GEMMs and torch's kernels also bfloat16 weights and outputs (8 significant bits),
fp32 accumulation; the result differs from
torchao's float32 eager arithmetic by about 2^-8 of the output's magnitude (``tests/runtime/test_lowbit.py``:
max abs error <= 2e-2 * max |y| on each layer).
"""

from __future__ import annotations

import functools
import math
import struct
import threading
import weakref
from collections.abc import Callable

import torch

from edgetorch.runtime import native

__all__ = ["OPERATORS", "SMALL_M", "fake_quant_per_token", "pack_int4", "quantize_per_token", "unpack_int4"]

#: rows up to which the int4 matrix-vector kernel is used (above: dequantize + GEMM); torch-only kernels
SMALL_M = 32
#: rows up to which the native matrix-vector kernels run (above: native dequantization + one bf16 GEMM): at 8 rows
#: the GEMV and the dequantize-and-GEMM cost about the same on a 2048 x 768 weight (docs/performance.md)
NATIVE_GEMV_ROWS = 4
_KERNEL_GROUPS = (256, 128, 64, 32)
_BF16 = torch.bfloat16
_SMALLEST_NORMAL = torch.finfo(torch.float32).smallest_normal
_F32 = struct.Struct("f")

_lib = torch.library.Library("edgetorch", "FRAGMENT")
_lib.define("linear_q4(Tensor x, Tensor weight, Tensor scales, Tensor? bias, int group_size, bool act_quant) "
            "-> Tensor")
_lib.define("linear_q4.out(Tensor x, Tensor weight, Tensor scales, Tensor? bias, int group_size, bool act_quant, "
            "*, Tensor(a!) out) -> Tensor(a!)")
_lib.define("linear_q8(Tensor x, Tensor weight, Tensor scales, Tensor? bias, bool act_quant) -> Tensor")
_lib.define("linear_q8.out(Tensor x, Tensor weight, Tensor scales, Tensor? bias, bool act_quant, "
            "*, Tensor(a!) out) -> Tensor(a!)")


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int values in [-8, 7] ``[N, K]`` (K even) -> uint8 ``[N, K/2]`` in the layout of ``linear_q4``."""
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    return (u[:, 0::2] | (u[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: int8 ``[N, K]`` in [-8, 7]."""
    lo = (packed & 15).to(torch.int8) - 8
    hi = (packed >> 4).to(torch.int8) - 8
    return torch.stack((lo, hi), dim=-1).reshape(packed.shape[0], -1)


def _f32(v: float) -> float:
    """``v`` rounded to the nearest float32 (a Python float)."""
    return _F32.unpack(_F32.pack(v))[0]


def _token_qparams(mn: float, mx: float) -> tuple[float, float, int]:
    """torchao's asymmetric int8 parameters of one token from its (float32) min and max: scale, 1 / scale and the
    zero point, each step rounded to float32 as torch's float32 tensors round it (an operation on doubles rounded
    once to float32 is the float32 operation: double has more than 2 * 24 + 2 bits)."""
    min_neg, max_pos = min(mn, 0.0), max(mx, 0.0)
    scale = max(_f32(_f32(max_pos - min_neg) / 255.0), _SMALLEST_NORMAL)
    zero_point = int(min(max(-128.0 - round(_f32(min_neg / scale)), -128.0), 127.0))
    return scale, _f32(1.0 / scale), zero_point


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
    """torchao's int8 asymmetric per-token quantization of ``x`` (float32 ``[M, K]``), the same arithmetic:
    returns ``q - zero_point`` (integers in [-255, 255], as float32) and the per-token scale (``[M, 1]``; a float
    for one token). ``clamp(round(x / s) + zp, -128, 127) - zp`` is computed as ``clamp(round(x / s), -128 - zp,
    127 - zp)``: the same integers."""
    if x.shape[0] == 1:
        lo, hi = (v.item() for v in torch.aminmax(x))
        if math.isfinite(lo) and math.isfinite(hi):  # else the tensor arithmetic below propagates NaN, as torchao
            scale, inv, zp = _token_qparams(lo, hi)
            t = torch.mul(x, inv)
            t.round_().clamp_(-128 - zp, 127 - zp)
            return t, scale
    mn, mx = torch.aminmax(x, dim=-1, keepdim=True)
    min_neg, max_pos = torch.clamp(mn, max=0.0), torch.clamp(mx, min=0.0)
    scale = torch.clamp((max_pos - min_neg) / 255.0, min=_SMALLEST_NORMAL)
    zero_point = torch.clamp(-128 - torch.round(min_neg / scale), -128, 127)
    t = torch.mul(x, 1.0 / scale)
    t.round_()
    return torch.clamp(t, -128 - zero_point, 127 - zero_point, out=t), scale


def fake_quant_per_token(x: torch.Tensor) -> torch.Tensor:
    """torchao's int8 asymmetric per-token quantize + dequantize of ``x`` (float32 ``[M, K]``), bit for bit."""
    centered, scale = quantize_per_token(x)
    return centered * scale


# -- per-weight caches of kernel layouts -------------------------------------------------------------------------
_CACHE: dict[tuple, tuple[weakref.ref, torch.Tensor, torch.Tensor, int]] = {}
_CACHE_LOCK = threading.Lock()


def _kernel_group(k: int, group_size: int) -> int:
    if group_size in _KERNEL_GROUPS:
        return group_size
    return next(g for g in _KERNEL_GROUPS if group_size % g == 0 and k % g == 0)


def _cpu_int4(weight: torch.Tensor, scales: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``weight`` in torch's CPU int4 layout and its bf16 ``[K/g, N, 2]`` scales-and-zeros, made once per weight."""
    key = (weight.data_ptr(), tuple(weight.shape), scales.data_ptr(), group_size)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is not None:  # alive: the same constant bytes (shared by methods)
        return hit[1], hit[2], hit[3]
    n, k = weight.shape[0], weight.shape[1] * 2
    g = _kernel_group(k, group_size)
    packed = _convert_rows(weight, n, k)
    per_group = scales.repeat_interleave(group_size // g, dim=1) if g != group_size else scales
    sz = torch.stack((per_group.t(), torch.zeros_like(per_group.t())), dim=-1).to(_BF16).contiguous()
    with _CACHE_LOCK:
        _CACHE[key] = (weakref.ref(weight), packed, sz, g)
    weakref.finalize(weight, _CACHE.pop, key, None)
    return packed, sz, g


#: rows converted at a time: torch's CPU layout packs blocks of 64 rows independently (tests/runtime/test_lowbit),
#: so converting in chunks gives the same bytes with a few MiB of temporaries instead of 10 bytes per weight
_CHUNK_ROWS = 256


def _convert_rows(weight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    step = _CHUNK_ROWS if n % 64 == 0 else n
    parts = []
    for r in range(0, n, step):
        w = weight[r:r + step]
        u = torch.stack((w & 15, w >> 4), dim=-1).reshape(w.shape[0], k).to(torch.int32)
        parts.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _dequant_bf16(weight: torch.Tensor, scales: torch.Tensor, group_size: int,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """The weight in bf16, ``(u - 8) * scale``: each nibble converted straight into its strided place of the bf16
    result (no uint8 interleave: ``torch.stack`` was the largest single cost of a prefill), then one ``sub_`` and
    one ``mul_`` in place (the same bits as converting, subtracting and scaling in turn)."""
    n, k = weight.shape[0], weight.shape[1] * 2
    kernels = native.kernels()
    if kernels is not None and group_size % 2 == 0 and weight.is_contiguous():
        w = torch.empty(n, k, dtype=_BF16) if out is None else out.view(n, k)
        s16 = scales.to(_BF16).contiguous()
        kernels.dequant_bf16(weight.data_ptr(), s16.data_ptr(), n, k, group_size, w.data_ptr(),
                             torch.get_num_threads())
        return w
    w = torch.empty(n, k // 2, 2, dtype=_BF16) if out is None else out.view(n, k // 2, 2)
    torch.bitwise_and(weight, 15, out=_nibble_scratch(weight))
    w[..., 0].copy_(_nibble_scratch(weight))
    torch.bitwise_right_shift(weight, 4, out=_nibble_scratch(weight))
    w[..., 1].copy_(_nibble_scratch(weight))
    g = w.view(n, k // group_size, group_size)
    g.sub_(8).mul_(scales.to(_BF16).unsqueeze(-1))
    return w.view(n, k)


_SCRATCH = threading.local()


def _scratch(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A per-thread buffer reused by every call (a prefill dequantizes ~85 weights: a fresh multi-MiB tensor per
    call pays its page faults each time). Only ever alive within one kernel call."""
    numel = 1
    for d in shape:
        numel *= d
    buf = getattr(_SCRATCH, name, None)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype)
        setattr(_SCRATCH, name, buf)
    return buf[:numel].view(shape)


def _nibble_scratch(weight: torch.Tensor) -> torch.Tensor:
    return _scratch("nibbles", tuple(weight.shape), torch.uint8)


#: output rows above which a prefill dequantizes and multiplies ``_DEQUANT_ROWS`` rows at a time (the bf16 copy
#: of an LM head, 32000 x 768, is 47 MiB: in pieces it stays in cache; measured 1.5-2x faster on llama_100m's)
_CHUNKED_ABOVE, _DEQUANT_ROWS = 4096, 512


def _dequant_mm(xb: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    n = weight.shape[0]
    k = weight.shape[1] * 2
    if n <= _CHUNKED_ABOVE:
        w = _dequant_bf16(weight, scales, group_size, _scratch("bf16", (n, k), _BF16))
        return torch.mm(xb, w.t())
    y = torch.empty(xb.shape[0], n)  # float32, row-major: a transposed result cost a strided copy of it all
    for r in range(0, n, _DEQUANT_ROWS):
        rows = min(_DEQUANT_ROWS, n - r)
        w = _dequant_bf16(weight[r:r + rows], scales[r:r + rows], group_size, _scratch("bf16", (rows, k), _BF16))
        y[:, r:r + rows].copy_(torch.mm(xb, w.t()))
    return y


def _check_q4(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, group_size: int) -> None:
    """Refuse arguments whose shapes disagree (the native kernels trust them), naming the argument."""
    if weight.dtype != torch.uint8 or weight.dim() != 2:
        raise ValueError(f"linear_q4: weight must be uint8 [N, K/2], got {weight.dtype} {list(weight.shape)}")
    n, k = weight.shape[0], weight.shape[1] * 2
    if group_size <= 0 or k % group_size:
        raise ValueError(f"linear_q4: group_size {group_size} does not divide K = {k}")
    if scales.dim() != 2 or tuple(scales.shape) != (n, k // group_size):
        raise ValueError(f"linear_q4: scales must be [{n}, {k // group_size}], got {list(scales.shape)}")
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(f"linear_q4: x's last dimension must be K = {k}, got {list(x.shape)}")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes of two contiguous tensors overlap (planned slots share one arena)."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _native_q4(kernels: native.NativeKernels, x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
               group_size: int, act_quant: bool,
               out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | float | None] | None:
    """The GEMM result and the per-token scale still to apply, from the native kernels; ``None`` where they do
    not apply (an odd group, a NaN or infinity in 8-bit activations: the torch path propagates those). A
    matrix-vector product writes straight into ``out`` when it is a contiguous float32 tensor of the result's
    size (the runtime's planned slot)."""
    n, k = weight.shape[0], weight.shape[1] * 2
    if group_size % 2 or not weight.is_contiguous() or n == 0 or k == 0:
        return None
    x2 = x.reshape(-1, k).float().contiguous()
    rows, threads = x2.shape[0], torch.get_num_threads()
    if rows > NATIVE_GEMV_ROWS:
        if not act_quant:
            return _dequant_mm(x2.to(_BF16), weight, scales, group_size), None
        centered, token_scale = torch.empty(rows, k, dtype=_BF16), torch.empty(rows, 1)
        if kernels.quantize_rows_bf16(x2.data_ptr(), rows, k, centered.data_ptr(), token_scale.data_ptr(), threads):
            return None
        return _dequant_mm(centered, weight, scales, group_size), token_scale
    s16 = scales.to(_BF16).contiguous()  # the program's own tensor when it is bf16 already (no copy)
    direct = (out is not None and out.dtype == torch.float32 and out.is_contiguous() and out.numel() == rows * n
              and not _overlap(out, x))
    y = out.view(rows, n) if direct else torch.empty(rows, n)
    if act_quant and kernels.has_vnni and k % 128 == 0 and group_size % 32 == 0:
        if kernels.q8q4_linear(x2.data_ptr(), rows, k, weight.data_ptr(), s16.data_ptr(), n, group_size,
                               y.data_ptr(), threads):
            return None  # a NaN or infinity: the torch path propagates it (nothing was written)
        return y, None
    token_scale = None
    if act_quant:
        x2, token_scale = quantize_per_token(x2)
        x2 = x2.contiguous()
    kernels.gemv_f32(x2.data_ptr(), rows, weight.data_ptr(), s16.data_ptr(), n, k, group_size, y.data_ptr(), threads)
    return y, token_scale


def _prepare(x: torch.Tensor, k: int, act_quant: bool) -> tuple[torch.Tensor, torch.Tensor | float | None]:
    """The bf16 GEMM operand and the per-token scale to apply after the GEMM (8da4w: the operand is the exact
    integer ``q - zero_point``, which bf16 holds exactly, so only the weights' side is rounded)."""
    x2 = x.reshape(-1, k)
    if not act_quant:
        return x2.to(_BF16), None
    centered, scale = quantize_per_token(x2.float())
    return centered.to(_BF16), scale


def _finish(y: torch.Tensor, x: torch.Tensor, token_scale: torch.Tensor | float | None, bias: torch.Tensor | None,
            out: torch.Tensor | None) -> torch.Tensor:
    shape = (*x.shape[:-1], y.shape[-1])
    if out is None and y.dtype == x.dtype and y.is_contiguous():
        out = y.view(shape)  # a fresh result of the kernel: scaled in place, no copy
    elif out is None:
        out = torch.empty(shape, dtype=x.dtype)
        out.copy_(y.view(shape))
    elif y.data_ptr() != out.data_ptr():  # else the kernel wrote into ``out`` itself
        out.copy_(y.view(shape))
    if isinstance(token_scale, float):
        out.mul_(token_scale)
    elif token_scale is not None:
        out.mul_(token_scale.view(*shape[:-1], 1))
    if bias is not None:
        out.add_(bias)
    return out


def _q4(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, group_size: int,
        act_quant: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    _check_q4(x, weight, scales, group_size)
    kernels = native.kernels()
    done = None if kernels is None else _native_q4(kernels, x, weight, scales, group_size, act_quant, out)
    if done is not None:
        y, token_scale = done
        if out is not None and token_scale is None and y.data_ptr() == out.data_ptr():  # written in place
            return out if bias is None else out.add_(bias)
        return _finish(y, x, token_scale, bias, out)
    xb, token_scale = _prepare(x, weight.shape[1] * 2, act_quant)
    if xb.shape[0] <= SMALL_M:
        packed, sz, g = _cpu_int4(weight, scales, group_size)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, g, sz)
    else:
        y = _dequant_mm(xb, weight, scales, group_size)
    return _finish(y, x, token_scale, bias, out)


def _q8(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, act_quant: bool,
        out: torch.Tensor | None = None) -> torch.Tensor:
    xb, token_scale = _prepare(x, weight.shape[1], act_quant)
    if xb.shape[0] <= SMALL_M:
        y = torch.ops.aten._weight_int8pack_mm(xb, weight, scales.to(_BF16))
    else:
        y = torch.mm(xb, weight.to(_BF16).mul_(scales.to(_BF16).unsqueeze(-1)).t())
    return _finish(y, x, token_scale, bias, out)


@torch.library.impl(_lib, "linear_q4", "CompositeExplicitAutograd")
def _linear_q4(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
               group_size: int, act_quant: bool) -> torch.Tensor:
    return _q4(x, weight, scales, bias, group_size, act_quant)


@torch.library.impl(_lib, "linear_q4.out", "CompositeExplicitAutograd")
def _linear_q4_out(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                   group_size: int, act_quant: bool, *, out: torch.Tensor) -> torch.Tensor:
    return _q4(x, weight, scales, bias, group_size, act_quant, out)


@torch.library.impl(_lib, "linear_q8", "CompositeExplicitAutograd")
def _linear_q8(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
               act_quant: bool) -> torch.Tensor:
    return _q8(x, weight, scales, bias, act_quant)


@torch.library.impl(_lib, "linear_q8.out", "CompositeExplicitAutograd")
def _linear_q8_out(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                   act_quant: bool, *, out: torch.Tensor) -> torch.Tensor:
    return _q8(x, weight, scales, bias, act_quant, out)


@torch.library.register_fake("edgetorch::linear_q4", lib=_lib)
def _linear_q4_fake(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                    group_size: int, act_quant: bool) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("edgetorch::linear_q8", lib=_lib)
def _linear_q8_fake(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                    act_quant: bool) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


#: the overloads a program may call (registered with the runtime's operator allow-list when it has one)
OPERATORS = (torch.ops.edgetorch.linear_q4.default, torch.ops.edgetorch.linear_q4.out,
             torch.ops.edgetorch.linear_q8.default, torch.ops.edgetorch.linear_q8.out)


def _direct_q4_out(pos: list, kw: dict) -> Callable[[], torch.Tensor] | None:
    """The runtime's call of ``linear_q4.out``, bound to the kernel itself (not through the dispatcher: 8 us of
    each call's 31 on a decode step)."""
    if len(pos) != 6 or set(kw) != {"out"}:
        return None
    return functools.partial(_q4, *pos, kw["out"])


def _register_with_runtime() -> None:
    from edgetorch.runtime import ops

    for op in OPERATORS:
        ops.register_operator(op)
    ops.register_direct_kernel(torch.ops.edgetorch.linear_q4.out, _direct_q4_out)


_register_with_runtime()
