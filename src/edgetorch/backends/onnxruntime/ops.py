"""Which edge ops the onnxruntime backend takes: a whitelist of core ATen ops that ``torch.onnx`` exports well
and ONNX Runtime's CPU provider runs, each with the tensor dtypes it accepts.

Every op listed here is exercised by ``tests/backends/onnxruntime/test_ops.py`` (lowered alone or in a small
graph and compared with eager PyTorch). ``squeeze.dims`` has no ONNX translation in torch 2.13; the backend
rewrites it before export (``REWRITTEN``). Sizes of dynamic shapes (``SYM_OPS``) travel with the partitions
that read them.
"""

from __future__ import annotations

import operator

import torch

from edgetorch.runtime import lowbit as _lowbit  # noqa: F401 - defines the edgetorch:: low-bit ops

__all__ = ["TENSOR_DTYPES", "FLOAT_OPS", "ANY_DTYPE_OPS", "REWRITTEN", "SYM_OPS", "NON_COMPUTE_OPS", "KEEP_WHOLE",
           "quantize_ops", "LOWBIT_OPS", "supported_ops", "op_name", "resolve_op"]

aten = torch.ops.aten

#: dtypes of tensors that may cross or live inside a partition
TENSOR_DTYPES = frozenset({torch.float32, torch.int64, torch.int32, torch.bool, torch.int8, torch.uint8})

#: ops whose data inputs must be float32 (ORT CPU kernels for them are float only)
FLOAT_OPS: frozenset = frozenset({
    aten.convolution.default, aten.addmm.default, aten.mm.default, aten.bmm.default,
    aten._native_batch_norm_legit_no_training.default, aten.native_layer_norm.default,
    aten.native_group_norm.default, aten.max_pool2d_with_indices.default, aten.avg_pool2d.default,
    aten._softmax.default, aten._log_softmax.default, aten.scaled_dot_product_attention.default,
    aten.gelu.default, aten.relu.default, aten.sigmoid.default, aten.tanh.default, aten.hardtanh.default,
    aten.leaky_relu.default, aten.exp.default, aten.log.default, aten.sqrt.default, aten.rsqrt.default,
    aten.reciprocal.default, aten.erf.default, aten.sin.default, aten.cos.default, aten.pow.Tensor_Scalar,
    aten.pow.Tensor_Tensor, aten.mean.dim, aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec,
    aten.floor.default, aten.ceil.default, aten.linear.default, aten.layer_norm.default,
})

#: ops that work on any dtype of ``TENSOR_DTYPES``
ANY_DTYPE_OPS: frozenset = frozenset({
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor, aten.mul.Scalar,
    aten.div.Tensor, aten.div.Scalar, aten.neg.default, aten.abs.default, aten.where.self,
    aten.maximum.default, aten.minimum.default, aten.clamp.default,
    aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.gt.Tensor, aten.gt.Scalar,
    aten.ge.Tensor, aten.ge.Scalar, aten.lt.Tensor, aten.lt.Scalar, aten.le.Tensor, aten.le.Scalar,
    aten.logical_and.default, aten.logical_or.default, aten.logical_not.default, aten.bitwise_not.default,
    aten.view.default, aten.permute.default, aten.expand.default, aten.cat.default,
    aten.slice.Tensor, aten.select.int, aten.squeeze.dims, aten.unsqueeze.default,
    aten.clone.default, aten.alias.default, aten._to_copy.default, aten.constant_pad_nd.default,
    aten.index_select.default, aten.embedding.default, aten.cumsum.default, aten.sum.dim_IntList,
    aten.amax.default, aten.amin.default, aten.argmax.default, aten.argmin.default,
    aten.split_with_sizes.default,
})

#: ops without a torch.onnx translation that the backend rewrites before export
REWRITTEN: frozenset = frozenset({aten.squeeze.dims})

#: ops computing a size (a SymInt of a dynamic shape) that ONNX translates (Shape/Gather and integer math); a
#: partition reading such a size gets its own copy of the computation (see ``OrtPartitioner``)
SYM_OPS: frozenset = frozenset({
    aten.sym_size.int, operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
    torch.sym_max, torch.sym_min,
})

#: view-like ops: a partition made only of these (plus getitem and sizes) is not worth a delegate call
NON_COMPUTE_OPS: frozenset = frozenset({
    aten.view.default, aten.permute.default, aten.expand.default,
    aten.slice.Tensor, aten.select.int, aten.squeeze.dims, aten.unsqueeze.default,
    aten.alias.default, aten.clone.default, operator.getitem,
}) | SYM_OPS

#: composite ops the partitioner can ask to keep whole (``OrtPartitioner(keep_whole=...)``)
KEEP_WHOLE = {
    "linear": aten.linear.default,
    "layer_norm": aten.layer_norm.default,
    "scaled_dot_product_attention": aten.scaled_dot_product_attention.default,
}


_QUANTIZE_OPS: frozenset = frozenset()


def quantize_ops() -> frozenset:
    """PT2E quantize/dequantize ops (``quantized_decomposed``), once torchao has registered them (looked up
    again until then: a partitioner used before the first quantized export must not hide them for good)."""
    global _QUANTIZE_OPS
    if _QUANTIZE_OPS:
        return _QUANTIZE_OPS
    ops = []
    ns = getattr(torch.ops, "quantized_decomposed", None)
    for name in ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel", "dequantize_per_channel"):
        packet = getattr(ns, name, None) if ns is not None else None
        for ov in ("default", "tensor"):
            try:
                ops.append(getattr(packet, ov))
            except (AttributeError, RuntimeError):
                pass
    if len({op.name().split("::")[1].split(".")[0] for op in ops}) == 4:  # all four registered
        _QUANTIZE_OPS = frozenset(ops)
    return frozenset(ops)


#: edgetorch's low-bit linears (``edgetorch.runtime.lowbit``), lowered to ``MatMulNBits`` (``_lowbit``)
LOWBIT_OPS: frozenset = frozenset({torch.ops.edgetorch.linear_q4.default, torch.ops.edgetorch.linear_q8.default})


def supported_ops() -> frozenset:
    """Every op the backend takes by default."""
    return FLOAT_OPS | ANY_DTYPE_OPS | quantize_ops() | LOWBIT_OPS


def op_name(target: object) -> str:
    """``aten.add.Tensor`` style name of an op."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def resolve_op(spec: object) -> torch._ops.OpOverload:
    """An OpOverload from an OpOverload, an OpOverloadPacket (its default overload) or a name such as
    ``"aten.add.Tensor"`` / ``"add.Tensor"`` / ``"relu"``."""
    if isinstance(spec, torch._ops.OpOverload):
        return spec
    if isinstance(spec, torch._ops.OpOverloadPacket):
        return spec.default
    if isinstance(spec, str):
        parts = spec.split(".")
        ns = "aten"
        if len(parts) >= 2 and hasattr(torch.ops, parts[0]) and parts[0] in ("aten", "quantized_decomposed"):
            ns, parts = parts[0], parts[1:]
        name, overload = parts[0], (parts[1] if len(parts) > 1 else "default")
        try:
            return getattr(getattr(getattr(torch.ops, ns), name), overload)
        except (AttributeError, RuntimeError):
            raise ValueError(f"unknown op '{spec}' (expected e.g. 'aten.add.Tensor' or 'relu')") from None
    raise TypeError(f"expected an op (OpOverload, packet or name), got {type(spec).__name__}")
