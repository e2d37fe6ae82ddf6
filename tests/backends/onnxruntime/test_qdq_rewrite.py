"""The plain session's model (``_qdq.activations_to_uint8``): int8 activations of a PT2E program become uint8
with their zero points moved by 128 (checked structurally on the model the delegate builds its session from),
every dequantized value stays exactly what it was, and debug sessions keep the exported int8 values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

from edgetorch.backends.onnxruntime import _blob, _qdq
from edgetorch.backends.onnxruntime.runtime import OrtDelegate, set_runtime_options
from edgetorch.exir.backend import lowered_module_of
from edgetorch.export import ExportRecipe, OrtRecipeType, export
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import delegate_calls


class _Residual(torch.nn.Module):
    """conv -> relu6 -> conv, plus a residual add: the quantized input is read by two dequantize nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.b = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.hardtanh(self.a(x), 0.0, 6.0)) + x


def _qdq_model(zp: int, readers: int, output_q: bool = False) -> onnx.ModelProto:
    """x -> Q(int8 zp) -> ``readers`` x DQ -> Add ... (a hand-built graph: the rewrite alone)."""
    nodes = [oh.make_node("Constant", [], ["zp"], value=nh.from_array(np.array(zp, np.int8))),
             oh.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"])]
    outs = []
    for i in range(readers):
        nodes.append(oh.make_node("DequantizeLinear", ["q", "s", "zp"], [f"d{i}"]))
        outs.append(f"d{i}")
    while len(outs) > 1:
        nodes.append(oh.make_node("Add", outs[:2], [f"{outs[0]}_{outs[1]}"]))
        outs = [f"{outs[0]}_{outs[1]}"] + outs[2:]
    graph_outputs = [oh.make_tensor_value_info(outs[0], TensorProto.FLOAT, [2, 8])]
    if output_q:
        graph_outputs.append(oh.make_tensor_value_info("q", TensorProto.INT8, [2, 8]))
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])], graph_outputs,
                      [nh.from_array(np.array(0.05, np.float32), "s")])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)


def _run(proto: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _zero_point_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of the zero point of every activation Q/DQ node (by node output)."""
    inits = {t.name: t.data_type for t in proto.graph.initializer}
    consts = {n.output[0]: n.attribute[0].t.data_type for n in proto.graph.node if n.op_type == "Constant"}
    return {n.output[0]: inits.get(n.input[2], consts.get(n.input[2])) for n in proto.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) == 3
            and n.input[0] not in inits}


@pytest.mark.parametrize("zp", [-128, -3, 0, 127])
@pytest.mark.parametrize("readers", [1, 2])
def test_uint8_activations_dequantize_exactly_as_int8(zp: int, readers: int) -> None:
    proto = _qdq_model(zp, readers)
    x = np.random.default_rng(0).uniform(-12, 12, (2, 8)).astype(np.float32)
    want = _run(proto, x)
    assert _qdq.activations_to_uint8(proto) == 1
    assert set(_zero_point_types(proto).values()) == {TensorProto.UINT8}
    zps = {t.name: nh.to_array(t) for t in proto.graph.initializer if t.data_type == TensorProto.UINT8}
    assert [int(v) for v in zps.values()] == [zp + 128]
    np.testing.assert_array_equal(_run(proto, x)[0], want[0])


def test_a_quantized_graph_output_stays_int8() -> None:
    proto = _qdq_model(3, 2, output_q=True)
    assert _qdq.activations_to_uint8(proto) == 0
    assert set(_zero_point_types(proto).values()) == {TensorProto.INT8}


@pytest.fixture(scope="module")
def int8_program() -> tuple[torch.nn.Module, list[tuple], bytes, bytes]:
    """The model, its calibration samples, the .pte buffer of its ORT INT8 recipe and its one delegate's blob."""
    torch.manual_seed(0)
    model = _Residual().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 4, 8, 8, generator=g),) for _ in range(4)]
    session = export(model, calib, ExportRecipe.get_recipe(OrtRecipeType.INT8_STATIC_PER_CHANNEL))
    calls = delegate_calls(session.get_edge_program_manager().exported_program())
    assert len(calls) == 1
    return model, calib, session.get_pte_buffer(), bytes(lowered_module_of(calls[0]).processed_bytes)


def test_the_plain_session_model_has_uint8_activations_and_int8_weights(int8_program) -> None:
    blob = int8_program[3]
    d = OrtDelegate(blob)
    exported = onnx.ModelProto.FromString(bytes(_blob.unpack(blob).model))
    plain = onnx.ModelProto.FromString(d._plain_bytes)
    assert set(_zero_point_types(exported).values()) == {TensorProto.INT8}
    assert set(_zero_point_types(plain).values()) == {TensorProto.UINT8}
    # weights: DequantizeLinear of int8 initializers (external ones are not in the proto), unchanged
    weights = [n for n in plain.graph.node if n.op_type == "DequantizeLinear"
               and n.output[0] not in _zero_point_types(plain)]
    assert weights
    # same nodes, same names (profile events and debug ids are ORT node / value names)
    assert [n.name for n in plain.graph.node] == [n.name for n in exported.graph.node]


def test_debug_sessions_keep_the_exported_int8_values(int8_program) -> None:
    d = OrtDelegate(int8_program[3])
    sess = d.debug_session()
    types = {o.name: o.type for o in sess.get_outputs()}
    quantized = [n for n in d.intermediates if "quantize_per_tensor" in n and "dequantize" not in n]
    assert quantized and all(types[n] == "tensor(int8)" for n in quantized)


def test_int8_program_outputs_match_the_unoptimized_run(int8_program) -> None:
    model, calib, buf, _ = int8_program
    fast = Runtime.get().load_program(buf).load_method("forward")
    set_runtime_options(graph_optimization_level="ORT_DISABLE_ALL")
    try:
        slow = Runtime.get().load_program(buf).load_method("forward")
    finally:
        set_runtime_options(graph_optimization_level=None)
    with torch.no_grad():
        for (x,) in calib:
            a, b = fast.execute(x)[0], slow.execute(x)[0]
            want = model(x)
            # integer kernels requantize with their own rounding: within a few quantization steps of Q/DQ
            assert (a - b).abs().max().item() <= 0.1 * max(b.abs().max().item(), 1.0)
            assert torch.nn.functional.cosine_similarity(a.flatten(), want.flatten(), dim=0).item() > 0.99
