"""torchao LLM recipes through ``edgetorch.export.export``: llama_tiny and tiny Hugging Face Llama/Qwen2 (random
weights, built from configs) exported as prefill + decode; the low-bit weights travel packed in the .pte (bytes
found as they are), the program is smaller than fp32, and generation equals torchao's own quantized eager model
within the kernels' documented tolerance."""

from __future__ import annotations

import copy

import pytest
import torch

from edgetorch.errors import RecipeError
from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, StageType, export
from edgetorch.export.lowbit import LowBitEmbedding, LowBitLinear
from edgetorch.models.generation import greedy_generate_with_logits
from edgetorch.models.llama import build_llama_tiny, example_prompt, llama_dynamic_shapes, llama_method_inputs
from edgetorch.runtime import Runtime

pytest.importorskip("torchao")

REL_TOL = 3e-2  # whole-model logits: the per-op tolerance (2e-2, tests/runtime/test_lowbit.py) over a few layers
NAMES = ("TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL", "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR",
         "TORCHAO_INT8_WEIGHT_ONLY", "TORCHAO_INT4_WEIGHT_ONLY")


def _torchao_eager(model, recipe):
    from torchao.quantization import quantize_

    q = copy.deepcopy(model)
    for c in recipe.quantization_recipe.ao_quantization_configs:
        quantize_(q, c.ao_base_config, c.filter_fn)
    return q


def _export_llama(model, recipe):
    inputs = llama_method_inputs(model.config)
    return export({"prefill": model, "decode": model}, {k: [v] for k, v in inputs.items()}, recipe,
                  dynamic_shapes=llama_dynamic_shapes(model.config))


def _generate(buffer, prompt, n=8):
    prog = Runtime.get().load_program(buffer)
    return greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                       prompt, n)


def _rel_err(got, want) -> float:
    return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got.step_logits, want.step_logits))


@pytest.mark.parametrize("enum", [PortableRecipeType, OrtRecipeType])
@pytest.mark.parametrize("name", NAMES)
def test_named_recipes_exist_on_both_backends(enum, name):
    recipe = ExportRecipe.get_recipe(enum[name])
    configs = recipe.quantization_recipe.ao_quantization_configs
    assert len(configs) == 1 and recipe.backend == enum.get_backend_name()
    config = configs[0].ao_base_config
    granularity = getattr(config, "weight_granularity", None) or config.granularity
    grouped = name.endswith(("PER_TENSOR", "INT4_WEIGHT_ONLY"))
    assert getattr(granularity, "group_size", None) == (32 if grouped else None)


def test_recipe_options_are_checked():
    grouped = PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR
    assert ExportRecipe.get_recipe(grouped, group_size=128).quantization_recipe.ao_quantization_configs[
        0].ao_base_config.weight_granularity.group_size == 128
    with pytest.raises(RecipeError, match="group_size"):
        ExportRecipe.get_recipe(grouped, group_size=48)
    with pytest.raises(RecipeError, match="no group_size"):
        ExportRecipe.get_recipe(PortableRecipeType.TORCHAO_INT8_WEIGHT_ONLY, group_size=32)
    with pytest.raises(RecipeError, match="embedding_bits"):
        ExportRecipe.get_recipe(grouped, embedding_bits=2)
    with pytest.raises(RecipeError, match="accepts only"):
        ExportRecipe.get_recipe(grouped, activation_observer="minmax")
    assert len(ExportRecipe.get_recipe(grouped, embedding_bits=8).quantization_recipe.ao_quantization_configs) == 2


@pytest.fixture(scope="module")
def llama():
    model = build_llama_tiny()
    fp32 = _export_llama(model, ExportRecipe.get_recipe(PortableRecipeType.FP32))
    return model, len(fp32.get_pte_buffer())


@pytest.mark.parametrize("name", NAMES)
def test_llama_recipe_runs_packed_and_matches_torchao(llama, name):
    model, fp32_bytes = llama
    recipe = ExportRecipe.get_recipe(PortableRecipeType[name])
    session = _export_llama(model, recipe)
    buf = session.get_pte_buffer()
    assert len(buf) < 0.6 * fp32_bytes
    # every linear became one low-bit op on packed weights, stored in the .pte byte for byte
    edge = session.get_edge_program_manager().exported_program("decode")
    ops = [str(n.target) for n in edge.graph.nodes if n.op == "call_function"]
    assert ops.count("edgetorch.linear_q4.default" if "INT4" in name else "edgetorch.linear_q8.default") == 15
    assert not any(op.startswith(("aten.mm", "aten.addmm", "torchao.", "quantized_decomposed.")) for op in ops)
    quantized = session.get_stage_artifacts()[StageType.SOURCE_TRANSFORM].data["decode"]
    lowered = [m for m in quantized.modules() if isinstance(m, LowBitLinear)]
    assert len(lowered) == 15
    for m in lowered:
        assert m.weight.numpy().tobytes() in buf
    prompt = example_prompt(model.config, 7)
    eager = _torchao_eager(model, recipe)
    eager.reset_cache()
    want = greedy_generate_with_logits(eager.prefill, eager.decode, prompt, 8)
    assert _rel_err(_generate(buf, prompt), want) <= REL_TOL


def test_embedding_quantized_and_output_kept_float(llama):
    model, fp32_bytes = llama
    recipe = ExportRecipe.get_recipe(PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR,
                                     embedding_bits=4, quantize_output=False)
    from edgetorch.export.stages import PipelineArtifact, SourceTransformStage

    stage = SourceTransformStage(recipe.quantization_recipe)
    stage.run(PipelineArtifact({"decode": model}))
    q = stage.get_artifacts().data["decode"]
    assert isinstance(q.tok_embeddings, LowBitEmbedding) and q.tok_embeddings.weight.dtype == torch.uint8
    assert type(q.output) is torch.nn.Linear and q.output.weight.dtype == torch.float32
    session = _export_llama(model, recipe)
    prompt = example_prompt(model.config, 5)
    eager = _torchao_eager(model, recipe)
    eager.reset_cache()
    want = greedy_generate_with_logits(eager.prefill, eager.decode, prompt, 6)
    assert _rel_err(_generate(session.get_pte_buffer(), prompt, 6), want) <= REL_TOL


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hugging_face_causal_lm_through_the_8da4w_recipe(family):
    pytest.importorskip("transformers")
    from edgetorch.models import hf

    wrapper = hf.build_hf_llama_static() if family == "llama" else hf.build_hf_qwen2_static()
    recipe = ExportRecipe.get_recipe(PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR)
    recipe.strict = True  # HF static caches need TorchDynamo (edgetorch.models.hf)
    vocab = wrapper.model.config.get_text_config().vocab_size
    inputs = hf.hf_method_inputs(vocab, 8)
    session = export({"prefill": wrapper, "decode": wrapper}, {k: [v] for k, v in inputs.items()}, recipe,
                     dynamic_shapes=hf.hf_dynamic_shapes(wrapper.max_cache_len))
    edge = session.get_edge_program_manager().exported_program("decode")
    n_layers = wrapper.model.config.num_hidden_layers
    assert sum(str(n.target) == "edgetorch.linear_q4.default" for n in edge.graph.nodes) == 7 * n_layers + 1
    prompt = hf.hf_method_inputs(prompt_len=6, seed=7)["prefill"][0]
    got = _generate(session.get_pte_buffer(), prompt, 6)
    eager = _torchao_eager(wrapper.model, recipe)
    with torch.no_grad():
        ids = torch.cat([prompt, torch.tensor([got.tokens[:-1]])], dim=1)
        logits = eager(input_ids=ids, use_cache=False).logits[0, prompt.shape[1] - 1:]
    want = torch.stack([s.reshape(-1) for s in got.step_logits])
    err = float((want - logits).abs().max() / logits.abs().max())
    assert err <= REL_TOL


def test_a_fresh_runtime_process_runs_the_low_bit_program(llama, tmp_path):
    import subprocess
    import sys

    model, _ = llama
    session = _export_llama(model, ExportRecipe.get_recipe(PortableRecipeType.TORCHAO_INT4_WEIGHT_ONLY))
    path = tmp_path / "int4.pte"
    session.save_to_pte(str(path))
    inputs = llama_method_inputs(model.config)["decode"]
    want = session.run_method("decode", inputs)[0]
    torch.save(inputs, tmp_path / "inputs.pt")
    code = ("import sys, torch; from edgetorch.runtime import Runtime; "
            f"x = torch.load({str(tmp_path / 'inputs.pt')!r}); "
            f"y = Runtime.get().load_program({str(path)!r}).load_method('decode').execute(*x)[0]; "
            f"torch.save(y, {str(tmp_path / 'y.pt')!r}); "
            "print(sorted(m for m in sys.modules if m.startswith(('edgetorch.exir', 'edgetorch.export', 'torchao'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]"  # neither the compiler nor torchao: the kernels live in the runtime
    assert torch.equal(torch.load(tmp_path / "y.pt"), want)


def test_a_model_quantized_by_hand_with_torchao_is_lowered_too(llama):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    model, _ = llama
    by_hand = copy.deepcopy(model)
    quantize_(by_hand, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    session = _export_llama(by_hand, ExportRecipe.get_recipe(PortableRecipeType.FP32))
    ops = [str(n.target) for n in session.get_edge_program_manager().exported_program("decode").graph.nodes]
    assert ops.count("edgetorch.linear_q4.default") == 15 and "torchao.dequantize_affine.default" not in ops
    prompt = example_prompt(model.config, 7)
    by_hand.reset_cache()
    want = greedy_generate_with_logits(by_hand.prefill, by_hand.decode, prompt, 8)
    assert _rel_err(_generate(session.get_pte_buffer(), prompt), want) <= REL_TOL
