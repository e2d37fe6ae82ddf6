"""edgetorch's low-bit linears (``edgetorch::linear_q4`` / ``linear_q8``) in the ONNX model: ORT's ``MatMulNBits``.

The torch.onnx registry translates each op to a placeholder node (domain ``edgetorch.lowbit``) that keeps the
op's inputs and attributes; :func:`lower_lowbit_nodes` then rewrites it on the serialized model, where the weight
initializers' shapes are known, to ``com.microsoft.MatMulNBits``:

- int4: the program's packed bytes are ``MatMulNBits``'s ``B`` as they are (two values per byte, low nibble first,
  stored ``q + 8``: its default zero point 8), seen as ``[N, K / block, block / 2]``; scales ``[N, K / block]``;
- int8: ``B`` is ``q + 128`` in uint8 (the default zero point of 8 bits), one block per row;
- ``act_quant`` (8da4w): ``accuracy_level=4``, MLAS's int8-compute kernels (activations quantized to int8 per
  block of the weights' group, symmetric; torchao quantizes per token, asymmetric: the same ~2^-8 rounding at
  another place); weight-only: ``accuracy_level=0`` (float compute).

A bias becomes ``MatMulNBits``'s optional bias input. The scales (bfloat16 in the program) are stored float16 (exact)
and cast to float in the graph; ORT folds the cast at session creation (``ORT_ENABLE_BASIC`` and above), before
it prepacks: with ``ORT_DISABLE_ALL`` nothing folds, ``MatMulNBits`` sees non-constant scales and computes in
float whatever its ``accuracy_level``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgetorch.errors import ExportError

__all__ = ["DOMAIN", "lower_lowbit_nodes", "register_lowbit_ops"]

DOMAIN = "edgetorch.lowbit"
_MS = "com.microsoft"


def _register_schemas() -> None:
    """ONNX schemas of the placeholder ops (onnxscript builds only nodes whose schema it knows)."""
    from onnx import defs

    if defs.has("LinearQ4", DOMAIN):
        return
    param, attr = defs.OpSchema.FormalParameter, defs.OpSchema.Attribute
    optional = defs.OpSchema.FormalParameterOption.Optional
    types = [("T", ["tensor(float)"], "activations"), ("W", ["tensor(uint8)", "tensor(int8)"], "packed weights"),
             ("S", ["tensor(float)", "tensor(bfloat16)", "tensor(float16)"], "scales")]
    for name, attrs in (("LinearQ4", ("group_size", "act_quant")), ("LinearQ8", ("act_quant",))):
        defs.register_schema(defs.OpSchema(
            name, DOMAIN, 1,
            inputs=[param("x", "T"), param("weight", "W"), param("scales", "S"),
                    param("bias", "T", param_option=optional)],
            outputs=[param("y", "T")], type_constraints=types,
            attributes=[attr(a, defs.OpSchema.AttrType.INT, a) for a in attrs]))


def register_lowbit_ops(registry: Any) -> None:
    """Registers the placeholder translations of the low-bit ops in a torch.onnx ``ONNXRegistry``."""
    from onnxscript.values import Opset

    from edgetorch.runtime import lowbit  # noqa: F401 - defines the ops

    _register_schemas()
    ops = Opset(DOMAIN, 1)

    def linear_q4(x, weight, scales, bias=None, group_size: int = 32, act_quant: bool = False) -> Any:
        return ops.LinearQ4(x, weight, scales, bias, group_size=group_size, act_quant=int(act_quant))

    def linear_q8(x, weight, scales, bias=None, act_quant: bool = False) -> Any:
        return ops.LinearQ8(x, weight, scales, bias, act_quant=int(act_quant))

    registry.register_op(torch.ops.edgetorch.linear_q4.default, linear_q4)
    registry.register_op(torch.ops.edgetorch.linear_q8.default, linear_q8)


def _attr(node: Any, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


class _Weights:
    """Initializers of the model by name: external ones (arrays moved out of the model) and inline ones."""

    def __init__(self, graph: Any, external: list[tuple[str, np.ndarray]], float_dynamic: bool) -> None:
        self.graph = graph
        self.float_dynamic = float_dynamic
        # a partition with a dynamic dimension among its inputs (a prefill's length)
        self.dynamic = any(d.dim_param for v in graph.input for d in v.type.tensor_type.shape.dim)
        self.external = {name: i for i, (name, _) in enumerate(external)}
        self.list = external
        self.inits = {t.name: t for t in graph.initializer}

    def array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        if name in self.external:
            return self.list[self.external[name]][1]
        return numpy_helper.to_array(self.inits[name])

    def put(self, name: str, arr: np.ndarray) -> None:
        """Replaces initializer ``name`` by ``arr`` (shape and dtype), external if it was."""
        from onnx import helper, numpy_helper

        t = self.inits[name]
        if name in self.external:
            self.list[self.external[name]] = (name, arr)
            del t.dims[:]
            t.dims.extend(arr.shape)
            t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
            return
        t.CopyFrom(numpy_helper.from_array(arr, name))


def _new_name(graph: Any, base: str) -> str:
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def _scales_input(weights: _Weights, s_name: str, scales: np.ndarray) -> tuple[str, Any | None]:
    """The float scales input of a ``MatMulNBits`` (which wants them in the activations' type) and the ``Cast``
    node making it: the model stores them as float16 (each bf16 scale exactly, when all are normal float16
    numbers), ORT's constant folding turns the ``Cast`` into a float initializer before ``MatMulNBits`` prepacks
    it (same kernels, same bits: tests/backends/onnxruntime/test_lowbit.py). Scales float16 cannot hold exactly
    stay float32 (no Cast)."""
    from onnx import TensorProto, helper, numpy_helper

    f32 = scales.astype(np.float32)
    with np.errstate(over="ignore", under="ignore"):
        f16 = f32.astype(np.float16)
    exact = bool(np.array_equal(f16.astype(np.float32), f32)) and not bool(
        np.any((f16 != 0) & (np.abs(f16) < np.finfo(np.float16).tiny)))
    name = _new_name(weights.graph, s_name + "__nbits")
    if not exact:
        weights.graph.initializer.append(numpy_helper.from_array(f32, name))
        return name, None
    stored = _new_name(weights.graph, s_name + "__f16")
    weights.graph.initializer.append(numpy_helper.from_array(f16, stored))
    return name, helper.make_node("Cast", [stored], [name], name=name + "_cast", to=TensorProto.FLOAT)


def _matmul_nbits(node: Any, weights: _Weights) -> tuple[Any, Any | None]:
    from onnx import helper

    x, w_name, s_name = node.input[0], node.input[1], node.input[2]
    bias = node.input[3] if len(node.input) > 3 else ""
    w = weights.array(w_name)
    scales = weights.array(s_name)
    n = w.shape[0]
    if node.op_type == "LinearQ4":
        k = w.shape[1] * 2
        block = _attr(node, "group_size", 32)
        bits, packed = 4, w.reshape(n, k // block, block // 2)
    else:
        k = w.shape[1]
        block = k
        bits, packed = 8, (w.astype(np.int16) + 128).astype(np.uint8).reshape(n, 1, k)
    weights.put(w_name, np.ascontiguousarray(packed))  # the weight's one reader is this node
    s_flat, cast = _scales_input(weights, s_name, np.ascontiguousarray(scales.reshape(n, -1)))
    level = 4 if _attr(node, "act_quant", 0) and not (weights.float_dynamic and weights.dynamic) else 0
    inputs = [x, w_name, s_flat] + (["", "", bias] if bias else [])
    return helper.make_node("MatMulNBits", inputs, list(node.output), name=node.name, domain=_MS, K=k, N=n,
                            bits=bits, block_size=block, accuracy_level=level), cast


def lower_lowbit_nodes(proto: Any, external: list[tuple[str, np.ndarray]], dynamic_compute: str = "int8") -> int:
    """Rewrites every placeholder node of ``proto`` (a ``ModelProto``) to ``MatMulNBits``; ``external`` (name,
    array) pairs are updated in place for weights kept outside the model. ``dynamic_compute="float"``: an 8da4w
    linear whose rows are a dynamic dimension (a prefill) computes in float (``accuracy_level=0``, activations
    not quantized: MLAS's int8 path is slower there, llama_100m prefill 539 -> 430 ms). Returns how many were
    rewritten."""
    from onnx import helper

    graph = proto.graph
    found = [i for i, n in enumerate(graph.node) if n.domain == DOMAIN]
    if not found:
        return 0
    if dynamic_compute not in ("int8", "float"):
        raise ExportError(f"onnxruntime: compile spec lowbit_dynamic_compute must be 'int8' or 'float', got "
                          f"{dynamic_compute!r}")
    weights = _Weights(graph, external, dynamic_compute == "float")
    casts = []
    for i in found:
        new, cast = _matmul_nbits(graph.node[i], weights)
        graph.node[i].CopyFrom(new)
        if cast is not None:
            casts.append(cast)
    if casts:  # inputs are initializers only: first in the (topologically sorted) node list
        nodes = casts + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
        external[:] = [(name, arr) for name, arr in external if name in used]
    for imp in list(proto.opset_import):
        if imp.domain == DOMAIN:
            proto.opset_import.remove(imp)
    if not any(o.domain == _MS for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(_MS, 1))
    return len(found)
