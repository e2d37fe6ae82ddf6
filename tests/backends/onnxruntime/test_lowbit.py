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
        for node in (n for n in proto.graph.node if n.op_type == "MatMulNBits"):
            attrs = {a.name: a.i for a in node.attribute}
            assert attrs["bits"] == bits and attrs["accuracy_level"] == level
            b = inits[node.input[1]]
            assert b.dtype == np.uint8 and b.ndim == 3
            key = b.tobytes() if bits == 4 else (b.astype(np.int16) - 128).astype(np.int8).tobytes()
            assert key in lowered  # the program's packed weight, byte for byte
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
