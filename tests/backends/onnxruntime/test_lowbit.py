"""edgetorch's low-bit linears in the ORT delegate: each becomes ``com.microsoft.MatMulNBits`` on the program's
packed int4 bytes (int8: uint8 + 128), int8 compute (``accuracy_level=4``) for 8da4w; generation through the
``OrtRecipeType.TORCHAO_*`` recipes equals torchao's quantized eager model within tolerance."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch

from edgetorch.backends.onnxruntime import _blob
from edgetorch.exir.backend import lowered_module_of
from edgetorch.export import ExportRecipe, OrtRecipeType, StageType, export
from edgetorch.export.lowbit import LowBitLinear
from edgetorch.models.generation import greedy_generate_with_logits
from edgetorch.models.llama import build_llama_tiny, example_prompt, llama_dynamic_shapes, llama_method_inputs
from edgetorch.runtime import Runtime

from ._util import delegate_calls

pytest.importorskip("torchao")

REL_TOL = 3e-2


def _session(model, name, **options):
    inputs = llama_method_inputs(model.config)
    return export({"prefill": model, "decode": model}, {k: [v] for k, v in inputs.items()},
                  ExportRecipe.get_recipe(OrtRecipeType[name], **options),
                  dynamic_shapes=llama_dynamic_shapes(model.config))


def _onnx_models(session, method):
    ep = session.get_edge_program_manager().exported_program(method)
    out = []
    for call in delegate_calls(ep):
        lm = lowered_module_of(call)
        u = _blob.unpack(lm.processed_bytes, named_data=lm.named_data)  # weights: the program's named data
        out.append((onnx.ModelProto.FromString(bytes(u.model)), dict(u.initializers)))
    return out


def _check_scales(proto, inits, node, module) -> None:
    """int4: the model stores the module's bf16 scales as float16 (exactly) and casts them to float; int8's
    float32 channel scales go in as they are unless float16 holds them exactly."""
    want = module.scales.float().reshape(module.weight.shape[0], -1).numpy()
    cast = next((n for n in proto.graph.node if n.op_type == "Cast" and n.output[0] == node.input[2]), None)
    if module.bits == 4:
        assert module.scales.dtype == torch.bfloat16 and cast is not None
    name = node.input[2] if cast is None else cast.input[0]
    stored = inits.get(name)  # external (the program's named data when large) or inline
    if stored is None:
        stored = onnx.numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == name))
    assert stored.dtype == (np.float32 if cast is None else np.float16)
    assert np.array_equal(stored.astype(np.float32), want)


def test_float16_scales_cast_in_the_graph_fold_before_prepacking(tmp_path):
    """ORT folds the Cast of the float16 scales at session creation: MatMulNBits gets a float initializer and
    prepacks it, the same bits as float scales stored as such (unfolded, it computes otherwise)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    n, k, block = 64, 128, 32
    rng = np.random.default_rng(0)
    w = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    s16 = (rng.random((n, k // block)) * 0.01 + 1e-3).astype(np.float16)

    def session(cast: bool, path=None):
        inits = [numpy_helper.from_array(w, "w")]
        nodes = [helper.make_node("Cast", ["s16"], ["s"], to=TensorProto.FLOAT)] if cast else []
        inits.append(numpy_helper.from_array(s16 if cast else s16.astype(np.float32), "s16" if cast else "s"))
        nodes.append(helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=k, N=n,
                                      bits=4, block_size=block, accuracy_level=4))
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)], ir_version=10)
        so = ort.SessionOptions()
        if path is not None:
            so.optimized_model_filepath = str(path)
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

    folded, plain = session(True, tmp_path / "opt.onnx"), session(False)
    assert [nd.op_type for nd in onnx.load(str(tmp_path / "opt.onnx")).graph.node] == ["MatMulNBits"]
    for rows in (1, 5):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        assert np.array_equal(folded.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])


@pytest.fixture(scope="module")
def model():
    return build_llama_tiny()


@pytest.mark.parametrize("name,bits,level", [("TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR", 4, 4),
                                             ("TORCHAO_INT4_WEIGHT_ONLY", 4, 0),
                                             ("TORCHAO_INT8_WEIGHT_ONLY", 8, 0)])
def test_low_bit_linears_become_matmulnbits_on_the_packed_bytes(model, name, bits, level):
    session = _session(model, name)
    edge = session.get_edge_program_manager().exported_program("decode")
    assert not any(str(n.target).startswith("edgetorch.linear_q") for n in edge.graph.nodes)  # all delegated
    lowered = {m.weight.numpy().tobytes(): m for m in
               session.get_stage_artifacts()[StageType.SOURCE_TRANSFORM].data["decode"].modules()
               if isinstance(m, LowBitLinear)}
    found = 0
    for proto, inits in _onnx_models(session, "decode"):
        assert not any(n.domain == "edgetorch.lowbit" for n in proto.graph.node)
        assert not any(n.metadata_props for n in proto.graph.node)  # compiler-only metadata dropped (size)
        for node in (n for n in proto.graph.node if n.op_type == "MatMulNBits"):
            attrs = {a.name: a.i for a in node.attribute}
            assert attrs["bits"] == bits and attrs["accuracy_level"] == level
            b = inits[node.input[1]]
            assert b.dtype == np.uint8 and b.ndim == 3
            key = b.tobytes() if bits == 4 else (b.astype(np.int16) - 128).astype(np.int8).tobytes()
            assert key in lowered  # the program's packed weight, byte for byte
            _check_scales(proto, inits, node, lowered[key])
            found += 1
    assert found == 15


@pytest.mark.parametrize("name", ["TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL", "TORCHAO_INT4_WEIGHT_ONLY"])
def test_ort_generation_matches_torchao_eager(model, name):
    from torchao.quantization import quantize_

    session = _session(model, name)
    prompt = example_prompt(model.config, 7)
    prog = Runtime.get().load_program(session.get_pte_buffer())
    got = greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                      prompt, 8)
    eager = copy.deepcopy(model)
    for c in ExportRecipe.get_recipe(OrtRecipeType[name]).quantization_recipe.ao_quantization_configs:
        quantize_(eager, c.ao_base_config, c.filter_fn)
    eager.reset_cache()
    want = greedy_generate_with_logits(eager.prefill, eager.decode, prompt, 8)
    err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got.step_logits, want.step_logits))
    assert err <= REL_TOL
    assert torch.isfinite(torch.stack([s.reshape(-1) for s in got.step_logits])).all()


def test_prefill_may_compute_in_float_while_decode_stays_int8(model):
    session = _session(model, "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR",
                       compile_specs={"lowbit_dynamic_compute": b"float"})
    levels = {}
    for method in ("prefill", "decode"):
        levels[method] = {a.i for proto, _ in _onnx_models(session, method) for n in proto.graph.node
                          if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {"prefill": {0}, "decode": {4}}
