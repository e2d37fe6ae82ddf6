"""What the PT2E quantizer annotates and how a quantized op finds its float op: the facts that both the export
side (``edgetorch.export.quantizer``, which annotates) and the developer tools (the float reference of the
Inspector, the ETRecord's float graphs) read, kept below both.

- ``ANNOTATED_OPS``: every ATen op the quantizer may annotate (so an exclusion can keep it float);
  ``WEIGHTED_OPS`` (conv/linear: ``op(x, weight, ...)``), ``MATMUL_WEIGHTED_OPS`` (``addmm(bias, x, weight)``
  with a ``(in, out)`` weight: Hugging Face's ``Conv1D`` in GPT-2) and ``FUSED_ACTIVATION_OPS``
  (``relu``/``hardtanh`` fused into the weighted op before them: only the activation's output is quantized);
  ``data_arg(node)`` / ``weight_arg(node)`` / ``weight_channel_axis(node)``: where a weighted op reads its data
  and its weight, and the weight's output-channel axis.
- ``float_handle(node)``: the PT2E numeric debug handle (``meta["custom"]["numeric_debug_handle"]``, torchao's
  key) a node of a quantized program keeps from the float op it comes from;
  ``float_handles_as_debug_handles(ep)`` turns those into edgetorch debug handles on a float program.
- ``module_paths(node)``: the ``nn_module_stack`` paths of a node (what ``exclude_module_paths`` matches).

Pure data and graph reads: this module imports neither torchao nor the export session.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from edgetorch.exir.debug_handles import set_debug_handle

__all__ = ["ANNOTATED_OPS", "CUSTOM_KEY", "FUSED_ACTIVATION_OPS", "MATMUL_WEIGHTED_OPS", "NUMERIC_DEBUG_HANDLE_KEY",
           "WEIGHTED_OPS", "ADD_OPS", "POOL_OPS", "data_arg", "float_handle", "float_handles_as_debug_handles",
           "module_paths", "weight_arg", "weight_channel_axis"]

#: torchao's ``meta`` keys of the PT2E numeric debug handle (``torchao.quantization.pt2e.CUSTOM_KEY`` /
#: ``NUMERIC_DEBUG_HANDLE_KEY``; tests/export/test_quant_annotations.py checks they still agree)
CUSTOM_KEY = "custom"
NUMERIC_DEBUG_HANDLE_KEY = "numeric_debug_handle"

aten = torch.ops.aten
#: conv/linear: annotated with their weight (and fused with an activation after them)
WEIGHTED_OPS = frozenset({aten.conv1d.default, aten.conv2d.default, aten.linear.default})
#: matrix products with a weight: ``addmm(bias, x, weight)``, ``weight`` of shape ``(in, out)`` (Hugging Face's
#: ``Conv1D``: GPT-2's attention and MLP projections); annotated when ``weight`` is a constant (``get_attr``)
MATMUL_WEIGHTED_OPS = frozenset({aten.addmm.default})
#: activations fused into the conv/linear before them
FUSED_ACTIVATION_OPS = frozenset({aten.relu.default, aten.relu_.default, aten.hardtanh.default,
                                  aten.hardtanh_.default})
#: adds (static modes: both inputs and the output quantized)
ADD_OPS = frozenset({aten.add.Tensor, aten.add_.Tensor})
#: pools (static modes: the output shares the input's parameters)
POOL_OPS = frozenset({aten.max_pool2d.default, aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default})
#: every op the quantizer may annotate (and an exclusion can therefore keep float)
ANNOTATED_OPS = WEIGHTED_OPS | MATMUL_WEIGHTED_OPS | FUSED_ACTIVATION_OPS | ADD_OPS | POOL_OPS


def data_arg(node: Node) -> int:
    """The argument index of the data input of a weighted op (``addmm``: 1, conv/linear: 0)."""
    return 1 if node.target in MATMUL_WEIGHTED_OPS else 0


def weight_arg(node: Node) -> int | None:
    """The argument index of the weight of a weighted op (``addmm``: 2, conv/linear: 1), None for other ops."""
    if node.target in MATMUL_WEIGHTED_OPS:
        return 2
    return 1 if node.target in WEIGHTED_OPS else None


def weight_channel_axis(node: Node) -> int:
    """The output-channel axis of a weighted op's weight (``addmm``'s ``(in, out)`` weight: 1, else 0)."""
    return 1 if node.target in MATMUL_WEIGHTED_OPS else 0


def module_paths(node: Node) -> list[str]:
    """The module paths of ``node``'s ``nn_module_stack`` (outermost first), e.g. ``["", "layer1.0.conv1"]``."""
    out = []
    for v in (node.meta.get("nn_module_stack") or {}).values():
        path = v[0] if isinstance(v, (list, tuple)) and v else v
        if isinstance(path, str):
            out.append(path)
    return out


def float_handle(node: Node) -> int | None:
    """The PT2E numeric debug handle of ``node`` (the float op it comes from), if any."""
    custom = node.meta.get(CUSTOM_KEY)
    h = custom.get(NUMERIC_DEBUG_HANDLE_KEY) if isinstance(custom, dict) else None
    return h if isinstance(h, int) and not isinstance(h, bool) else None


def float_handles_as_debug_handles(ep: ExportedProgram) -> int:
    """Gives every op node of a float program captured by ``edgetorch.export.quantizer.capture_float_program``
    its numeric debug handle as edgetorch debug handle (a fresh ``meta["custom"]`` dict: graphs taken from the
    program before keep theirs); returns how many nodes carry one."""
    n_set = 0
    for n in ep.graph.nodes:
        h = float_handle(n) if n.op == "call_function" else None
        if h is not None:
            set_debug_handle(n, h)
            n_set += 1
    return n_set
