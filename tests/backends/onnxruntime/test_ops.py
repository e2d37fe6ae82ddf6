"""Every op of the backend's whitelist, lowered alone (called directly as an ATen op) and compared with eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from edgetorch.backends.onnxruntime import OrtPartitioner
from edgetorch.backends.onnxruntime import ops as ort_ops
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.exir.backend import lowered_module_of
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import compute_nodes, delegate_calls, rel_err

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=g) + 0.5


def ints(*shape: int, hi: int = 10) -> torch.Tensor:
    return torch.randint(0, hi, shape, generator=g)


# op -> (fn over the inputs, inputs); each fn calls the op directly
CASES: dict[object, tuple[Callable, tuple]] = {
    aten.convolution.default: (
        lambda x, w, b: aten.convolution.default(x, w, b, [2, 1], [1, 0], [1, 1], False, [0, 0], 1),
        (r(1, 4, 9, 8), r(6, 4, 3, 3), r(6))),
    aten.addmm.default: (lambda b, x, w: aten.addmm.default(b, x, w), (r(5), r(3, 4), r(4, 5))),
    aten.mm.default: (lambda x, w: aten.mm.default(x, w), (r(3, 4), r(4, 5))),
    aten.bmm.default: (lambda x, w: aten.bmm.default(x, w), (r(2, 3, 4), r(2, 4, 5))),
    aten._native_batch_norm_legit_no_training.default: (
        lambda x, w, b, m, v: aten._native_batch_norm_legit_no_training.default(x, w, b, m, v, 0.1, 1e-5)[0],
        (r(2, 3, 4, 4), r(3), r(3), r(3), pos(3))),
    aten.native_layer_norm.default: (lambda x, w, b: aten.native_layer_norm.default(x, [8], w, b, 1e-5)[0],
                                     (r(2, 5, 8), r(8), r(8))),
    aten.native_group_norm.default: (lambda x, w, b: aten.native_group_norm.default(x, w, b, 2, 4, 9, 2, 1e-5)[0],
                                     (r(2, 4, 3, 3), r(4), r(4))),
    aten.max_pool2d_with_indices.default: (
        lambda x: aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])[0], (r(1, 3, 9, 9),)),
    aten.avg_pool2d.default: (lambda x: aten.avg_pool2d.default(x, [2, 2], [2, 2]), (r(1, 3, 8, 8),)),
    aten._softmax.default: (lambda x: aten._softmax.default(x, -1, False), (r(3, 7),)),
    aten._log_softmax.default: (lambda x: aten._log_softmax.default(x, 1, False), (r(3, 7),)),
    aten.scaled_dot_product_attention.default: (
        lambda q, k, v, m: aten.scaled_dot_product_attention.default(q, k, v, m), (r(1, 2, 5, 8), r(1, 2, 5, 8),
                                                                                 r(1, 2, 5, 8), r(1, 1, 5, 5))),
    aten.gelu.default: (lambda x: aten.gelu.default(x), (r(4, 6),)),
    aten.relu.default: (lambda x: aten.relu.default(x), (r(4, 6),)),
    aten.sigmoid.default: (lambda x: aten.sigmoid.default(x), (r(4, 6),)),
    aten.tanh.default: (lambda x: aten.tanh.default(x), (r(4, 6),)),
    aten.hardtanh.default: (lambda x: aten.hardtanh.default(x, 0.0, 6.0), (r(4, 6) * 5,)),
    aten.leaky_relu.default: (lambda x: aten.leaky_relu.default(x, 0.2), (r(4, 6),)),
    aten.exp.default: (lambda x: aten.exp.default(x), (r(4, 6),)),
    aten.log.default: (lambda x: aten.log.default(x), (pos(4, 6),)),
    aten.sqrt.default: (lambda x: aten.sqrt.default(x), (pos(4, 6),)),
    aten.rsqrt.default: (lambda x: aten.rsqrt.default(x), (pos(4, 6),)),
    aten.reciprocal.default: (lambda x: aten.reciprocal.default(x), (pos(4, 6),)),
    aten.erf.default: (lambda x: aten.erf.default(x), (r(4, 6),)),
    aten.sin.default: (lambda x: aten.sin.default(x), (r(4, 6),)),
    aten.cos.default: (lambda x: aten.cos.default(x), (r(4, 6),)),
    aten.floor.default: (lambda x: aten.floor.default(x), (r(4, 6) * 3,)),
    aten.ceil.default: (lambda x: aten.ceil.default(x), (r(4, 6) * 3,)),
    aten.pow.Tensor_Scalar: (lambda x: aten.pow.Tensor_Scalar(x, 3.0), (r(4, 6),)),
    aten.pow.Tensor_Tensor: (lambda x, y: aten.pow.Tensor_Tensor(x, y), (pos(4, 6), r(4, 6))),
    aten.mean.dim: (lambda x: aten.mean.dim(x, [-1, -2], True), (r(2, 3, 4, 5),)),
    aten.upsample_nearest2d.vec: (lambda x: aten.upsample_nearest2d.vec(x, [8, 6], None), (r(1, 2, 4, 3),)),
    aten.upsample_bilinear2d.vec: (lambda x: aten.upsample_bilinear2d.vec(x, [8, 6], False, None), (r(1, 2, 4, 3),)),
    aten.add.Tensor: (lambda x, y: aten.add.Tensor(x, y, alpha=2), (r(4, 6), r(6))),
    aten.add.Scalar: (lambda x: aten.add.Scalar(x, 1.5), (r(4, 6),)),
    aten.sub.Tensor: (lambda x, y: aten.sub.Tensor(x, y), (ints(4, 6), ints(4, 6))),
    aten.sub.Scalar: (lambda x: aten.sub.Scalar(x, 2), (r(4, 6),)),
    aten.mul.Tensor: (lambda x, y: aten.mul.Tensor(x, y), (ints(4, 6), ints(6))),
    aten.mul.Scalar: (lambda x: aten.mul.Scalar(x, 0.5), (r(4, 6),)),
    aten.div.Tensor: (lambda x, y: aten.div.Tensor(x, y), (r(4, 6), pos(4, 6))),
    aten.div.Scalar: (lambda x: aten.div.Scalar(x, 4.0), (r(4, 6),)),
    aten.neg.default: (lambda x: aten.neg.default(x), (ints(4, 6),)),
    aten.abs.default: (lambda x: aten.abs.default(x), (r(4, 6),)),
    aten.where.self: (lambda c, x, y: aten.where.self(c, x, y), (r(4, 6) > 0, r(4, 6), r(4, 6))),
    aten.maximum.default: (lambda x, y: aten.maximum.default(x, y), (r(4, 6), r(4, 6))),
    aten.minimum.default: (lambda x, y: aten.minimum.default(x, y), (r(4, 6), r(4, 6))),
    aten.clamp.default: (lambda x: aten.clamp.default(x, -0.5, 0.7), (r(4, 6),)),
    aten.eq.Tensor: (lambda x, y: aten.eq.Tensor(x, y), (ints(4, 6, hi=3), ints(4, 6, hi=3))),
    aten.eq.Scalar: (lambda x: aten.eq.Scalar(x, 2), (ints(4, 6, hi=3),)),
    aten.ne.Tensor: (lambda x, y: aten.ne.Tensor(x, y), (ints(4, 6, hi=3), ints(4, 6, hi=3))),
    aten.ne.Scalar: (lambda x: aten.ne.Scalar(x, 1), (ints(4, 6, hi=3),)),
    aten.gt.Tensor: (lambda x, y: aten.gt.Tensor(x, y), (r(4, 6), r(4, 6))),
    aten.gt.Scalar: (lambda x: aten.gt.Scalar(x, 0.1), (r(4, 6),)),
    aten.ge.Tensor: (lambda x, y: aten.ge.Tensor(x, y), (r(4, 6), r(4, 6))),
    aten.ge.Scalar: (lambda x: aten.ge.Scalar(x, 0.1), (r(4, 6),)),
    aten.lt.Tensor: (lambda x, y: aten.lt.Tensor(x, y), (r(4, 6), r(4, 6))),
    aten.lt.Scalar: (lambda x: aten.lt.Scalar(x, 0.1), (r(4, 6),)),
    aten.le.Tensor: (lambda x, y: aten.le.Tensor(x, y), (r(4, 6), r(4, 6))),
    aten.le.Scalar: (lambda x: aten.le.Scalar(x, 0.1), (r(4, 6),)),
    aten.logical_and.default: (lambda x, y: aten.logical_and.default(x, y), (r(4, 6) > 0, r(4, 6) > 0)),
    aten.logical_or.default: (lambda x, y: aten.logical_or.default(x, y), (r(4, 6) > 0, r(4, 6) > 0)),
    aten.logical_not.default: (lambda x: aten.logical_not.default(x), (r(4, 6) > 0,)),
    aten.bitwise_not.default: (lambda x: aten.bitwise_not.default(x), (r(4, 6) > 0,)),
    aten.view.default: (lambda x: aten.view.default(aten.relu.default(x), [6, 4]), (r(4, 6),)),
    aten.permute.default: (lambda x: aten.permute.default(aten.relu.default(x), [2, 0, 1]), (r(2, 3, 4),)),
    aten.expand.default: (lambda x: aten.expand.default(aten.relu.default(x), [3, 4, 6]), (r(4, 1),)),
    aten.cat.default: (lambda x, y: aten.cat.default([x, y], 1), (r(2, 3), r(2, 5))),
    aten.slice.Tensor: (lambda x: aten.slice.Tensor(aten.relu.default(x), 1, 1, 5, 2), (r(3, 7),)),
    aten.select.int: (lambda x: aten.select.int(aten.relu.default(x), 1, 2), (r(3, 7),)),
    aten.squeeze.dims: (lambda x: aten.squeeze.dims(aten.relu.default(x), [0, 2]), (r(1, 4, 1, 3),)),
    aten.unsqueeze.default: (lambda x: aten.unsqueeze.default(aten.relu.default(x), 1), (r(2, 4),)),
    aten.clone.default: (lambda x: aten.clone.default(aten.relu.default(x)), (r(2, 4),)),
    aten.alias.default: (lambda x: aten.alias.default(aten.relu.default(x)), (r(2, 4),)),
    aten._to_copy.default: (lambda x: aten._to_copy.default(x, dtype=torch.int64), (r(4, 6) * 10,)),
    aten.constant_pad_nd.default: (lambda x: aten.constant_pad_nd.default(x, [1, 2, 0, 1], 0.5), (r(2, 3, 4),)),
    aten.index_select.default: (lambda x, i: aten.index_select.default(x, 1, i), (r(3, 6), ints(4, hi=6))),
    aten.embedding.default: (lambda w, i: aten.embedding.default(w, i), (r(10, 4), ints(2, 5))),
    aten.cumsum.default: (lambda x: aten.cumsum.default(x, 1), (ints(3, 6),)),
    aten.sum.dim_IntList: (lambda x: aten.sum.dim_IntList(x, [1], True), (r(3, 6, 2),)),
    aten.amax.default: (lambda x: aten.amax.default(x, [1]), (r(3, 6),)),
    aten.amin.default: (lambda x: aten.amin.default(x, [0], True), (r(3, 6),)),
    aten.argmax.default: (lambda x: aten.argmax.default(x, 1), (r(3, 6),)),
    aten.argmin.default: (lambda x: aten.argmin.default(x, 0, True), (r(3, 6),)),
    aten.split_with_sizes.default: (lambda x: aten.split_with_sizes.default(aten.relu.default(x), [2, 4], 1)[1] * 2,
                                    (r(3, 6),)),
    aten.linear.default: (lambda x, w, b: aten.linear.default(x, w, b), (r(2, 3, 4), r(5, 4), r(5))),
    aten.layer_norm.default: (lambda x, w, b: aten.layer_norm.default(x, [6], w, b), (r(2, 3, 6), r(6), r(6))),
}
KEEP = {aten.linear.default: "linear", aten.layer_norm.default: "layer_norm"}


class _Op(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def test_every_whitelisted_op_has_a_case():
    missing = (ort_ops.FLOAT_OPS | ort_ops.ANY_DTYPE_OPS) - set(CASES)
    assert not missing, sorted(map(str, missing))


@pytest.mark.parametrize("op", list(CASES), ids=[ort_ops.op_name(o) for o in CASES])
def test_op_runs_on_ort_like_eager(op):
    fn, inputs = CASES[op]
    mod = _Op(fn)
    part = OrtPartitioner(keep_whole=[KEEP[op]] if op in KEEP else ())
    epm = to_edge_transform_and_lower(torch.export.export(mod, inputs), partitioner=[part])
    ep = epm.exported_program()
    call = delegate_calls(ep)
    assert call, f"{op} was not delegated: {part.rejected}"
    inner = {n.target for c in call for n in lowered_module_of(c).original_module.graph.nodes}
    assert op in inner, f"{op} is not in the delegated partition ({part.rejected})"
    assert op not in {n.target for n in compute_nodes(ep)}
    got = Runtime.get().load_program(epm.to_executorch().buffer).load_method("forward").execute_structured(*inputs)
    want = mod(*inputs)
    assert got.dtype == want.dtype
    if want.is_floating_point():
        assert rel_err(got, want) <= 1e-5
    else:
        assert torch.equal(got, want)
