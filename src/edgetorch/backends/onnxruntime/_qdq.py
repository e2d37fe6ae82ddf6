"""Load-time rewrites of a delegate's ONNX model that let ONNX Runtime's QDQ fusions apply (the plain session
only; debug sessions keep the exported model, whose values are the edge program's).

PT2E programs quantize activations to int8. ORT's x86 integer kernels (QLinearConv, QLinearAdd, QGemm) take
uint8 activations with int8 weights; ORT converts int8 Q/DQ pairs itself (``QDQS8ToU8Transformer``) but only
where a ``QuantizeLinear`` has exactly one ``DequantizeLinear`` reader. A quantized value read twice (a residual
branch: the edge program has one dequantize per reader) stays int8 while its neighbours become uint8, and the
convolutions and adds around it, whose inputs and output no longer share one type, run in float between Q/DQ
nodes and NCHW<->NHWC transposes (ResNet-18 INT8: 20 of 20 convolutions left in float; MobileNetV2: 15 of 52).

``activations_to_uint8`` rewrites every activation ``QuantizeLinear`` whose readers are all
``DequantizeLinear`` nodes (and which is no graph output) to uint8 with its constant scalar int8 zero point
moved by +128, and those readers with it: ``q_u8 = q_s8 + 128`` and ``zp_u8 = zp_s8 + 128``, so every
dequantized value is bit for bit the same (the quantized int8 value itself is no longer computed, which is why
debug sessions do not use this model). Weights (``DequantizeLinear`` of an initializer) stay int8.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["activations_to_uint8", "scalar_constants"]


def scalar_constants(graph: Any) -> dict[str, np.ndarray]:
    """Every one-element initializer and ``Constant`` output of ``graph``, as a numpy array."""
    from onnx import numpy_helper

    out: dict[str, np.ndarray] = {}
    for t in graph.initializer:
        if int(np.prod(t.dims)) == 1:
            out[t.name] = numpy_helper.to_array(t)
    for n in graph.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            arr = numpy_helper.to_array(n.attribute[0].t)
            if arr.size == 1:
                out[n.output[0]] = arr
    return out


def _readers(graph: Any) -> dict[str, list[Any]]:
    uses: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            uses.setdefault(i, []).append(n)
    return uses


def _is_qdq(node: Any, op: str) -> bool:
    return node.op_type == op and node.domain in ("", "ai.onnx") and len(node.input) == 3


class _U8ZeroPoints:
    """uint8 initializers ``<name>__u8`` holding an int8 scalar zero point + 128, made once per name."""

    def __init__(self, graph: Any) -> None:
        self.consts = scalar_constants(graph)
        self.made: dict[str, Any] = {}

    def get(self, name: str) -> str | None:
        from onnx import numpy_helper

        a = self.consts.get(name)
        if a is None or a.dtype != np.int8:
            return None
        new = f"{name}__u8"
        if new not in self.made:
            shifted = (a.astype(np.int16) + 128).astype(np.uint8)
            self.made[new] = numpy_helper.from_array(shifted, new)
        return new


def activations_to_uint8(proto: Any) -> int:
    """Rewrites ``proto`` (an ``onnx.ModelProto``) in place; returns how many quantized values became uint8."""
    g = proto.graph
    uses = _readers(g)
    outputs = {o.name for o in g.output}
    zps = _U8ZeroPoints(g)
    changed: set[str] = set()
    for q in g.node:
        if not _is_qdq(q, "QuantizeLinear") or q.output[0] in outputs:
            continue
        dqs = uses.get(q.output[0], [])
        if not dqs or not all(_is_qdq(d, "DequantizeLinear") and d.input[0] == q.output[0] for d in dqs):
            continue
        names = [zps.get(q.input[2])] + [zps.get(d.input[2]) for d in dqs]
        if any(n is None for n in names):
            continue
        q.input[2] = names[0]
        for d, name in zip(dqs, names[1:]):
            d.input[2] = name
        changed.add(q.output[0])
    if changed:
        g.initializer.extend(zps.made.values())
        kept = [v for v in g.value_info if v.name not in changed]
        del g.value_info[:]
        g.value_info.extend(kept)
    return len(changed)
