"""Lowers torchao-quantized Linear and Embedding modules to edgetorch's packed low-bit form.

torchao's ``quantize_`` leaves ``IntxUnpackedToInt8Tensor`` weights (int4 values stored one per int8 byte, a
float scale per group); exported as they are, each linear becomes a dequantize of its whole weight into float
plus a float matmul (the decomposed ``choose_qparams`` / ``quantize_affine`` / ``dequantize_affine`` ops around
an ``mm``), and the program stores the int4 values one per byte. :func:`lower_lowbit_modules` replaces such a
module by one that holds the weights packed (int4 two per byte with bfloat16 group scales, int8 as is with
float32 channel scales) and calls a single low-bit op
(``edgetorch::linear_q4`` / ``linear_q8``, defined in ``edgetorch.runtime.lowbit`` with the kernels the
runtime runs); an embedding gathers its packed rows and dequantizes only those (standard ATen ops).

A weight this cannot represent exactly (a non-zero zero point, a group size the kernels lack, int8 in groups)
is left to torchao's decomposed form; :func:`lower_lowbit_modules` reports what it did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from edgetorch.runtime import lowbit  # the op definitions (registers edgetorch::linear_q4 / linear_q8)

__all__ = ["LowBitEmbedding", "LowBitLinear", "LoweringReport", "lower_lowbit_modules"]

log = logging.getLogger(__name__)
_KERNEL_GROUPS = (32, 64, 128, 256)


@dataclass
class LoweringReport:
    """What :func:`lower_lowbit_modules` did: module paths lowered, and those left decomposed (with why)."""

    lowered: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class LowBitLinear(nn.Module):
    """``y = x @ dequant(weight).T + bias`` on a packed weight (see ``edgetorch.runtime.lowbit``)."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, bits: int,
                 group_size: int, act_quant: bool) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales if bits == 4 else scales.reshape(-1))  # int8: one per channel
        self.register_buffer("bias", bias)
        self.bits, self.group_size, self.act_quant = bits, group_size, act_quant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits == 4:
            return torch.ops.edgetorch.linear_q4(x, self.weight, self.scales, self.bias, self.group_size,
                                                 self.act_quant)
        return torch.ops.edgetorch.linear_q8(x, self.weight, self.scales, self.bias, self.act_quant)

    def extra_repr(self) -> str:
        k = self.weight.shape[1] * (2 if self.bits == 4 else 1)
        return (f"in_features={k}, out_features={self.weight.shape[0]}, "
                f"bits={self.bits}, group_size={self.group_size}, act_quant={self.act_quant}")


class LowBitEmbedding(nn.Module):
    """An embedding whose table is packed; a lookup dequantizes only the rows it gathers (torchao's arithmetic)."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.bits, self.group_size = bits, group_size

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        rows = nn.functional.embedding(indices, self.weight)
        scales = nn.functional.embedding(indices, self.scales)
        if self.bits == 4:
            q = torch.stack((rows & 15, rows >> 4), dim=-1).to(torch.float32) - 8.0
        else:
            q = rows.to(torch.float32)
        groups = scales.shape[-1]
        q = q.reshape(*indices.shape, groups, -1) * scales.unsqueeze(-1)
        return q.reshape(*indices.shape, -1)


def _quantized_weight(module: nn.Module) -> object | None:
    from torchao.quantization import IntxUnpackedToInt8Tensor

    w = getattr(module, "weight", None)
    return w if isinstance(w, IntxUnpackedToInt8Tensor) else None


def _why_not(w: object, is_linear: bool) -> str | None:
    """Why the torchao weight ``w`` cannot be packed exactly (None when it can)."""
    bits = {torch.int4: 4, torch.int8: 8}.get(w.target_dtype)
    if bits is None:
        return f"weights of {w.target_dtype} (only int4 and int8 are packed)"
    if w.zero_point is not None and bool(torch.any(w.zero_point != 0)):
        return "asymmetric weights (non-zero zero points)"
    k = w.qdata.shape[-1]
    group = w.block_size[-1]
    if w.qdata.dim() != 2 or w.block_size[0] != 1:
        return f"block size {tuple(w.block_size)} (one row per block expected)"
    if bits == 8 and is_linear and group != k:
        return "int8 weights in groups (the int8 kernel takes one scale per output channel)"
    if bits == 4 and k % 2:
        return f"an odd input width {k}"
    if bits == 4 and is_linear and group not in _KERNEL_GROUPS and not (group == k and k % 32 == 0):
        return f"group size {group} (the int4 kernel takes groups of {_KERNEL_GROUPS} or whole rows of 32k)"
    act = w.activation_quantization
    if act is not None and getattr(act, "value", act) != "int8_asym_per_token":
        return f"activation quantization {act}"
    return None


def _packed(w: object) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    bits = 4 if w.target_dtype == torch.int4 else 8
    qdata = w.qdata.detach()
    weight = lowbit.pack_int4(qdata) if bits == 4 else qdata.to(torch.int8).contiguous()
    scales = w.scale.detach().to(torch.float32).reshape(qdata.shape[0], -1).contiguous()
    return weight, scales, bits, w.block_size[-1]


def _linear_scales(scales: torch.Tensor, bits: int) -> torch.Tensor:
    """The scales a linear stores: int4 groups in bfloat16 (the kernels compute with bf16 scales anyway, so the
    program holds exactly what they use, half the bytes; XNNPACK's 8da4w stores bf16 scales too), int8 channels
    in float32 (one per row: a few KiB)."""
    return scales.to(torch.bfloat16) if bits == 4 else scales


def _lowered(module: nn.Module) -> nn.Module | str:
    w = _quantized_weight(module)
    is_linear = isinstance(module, nn.Linear)
    why = _why_not(w, is_linear)
    if why is not None:
        return why
    weight, scales, bits, group = _packed(w)
    if not is_linear:
        return LowBitEmbedding(weight, scales, bits, group)
    act_quant = w.activation_quantization is not None
    bias = module.bias.detach().clone() if module.bias is not None else None
    return LowBitLinear(weight, _linear_scales(scales, bits), bias, bits, group, act_quant)


def lower_lowbit_modules(model: nn.Module) -> LoweringReport:
    """Replaces, in place, every Linear / Embedding of ``model`` whose weight torchao quantized by its packed
    low-bit module; returns the paths lowered and those kept decomposed (and why)."""
    report = LoweringReport()
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, (nn.Linear, nn.Embedding)) and _quantized_weight(m) is not None]
    for name, module in targets:
        new = _lowered(module)
        if isinstance(new, str):
            report.skipped[name] = new
            continue
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
        report.lowered.append(name)
    if report.skipped:
        log.info("low-bit lowering kept %d module(s) decomposed: %s", len(report.skipped), report.skipped)
    return report
