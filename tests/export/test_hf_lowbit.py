"""Tiny Hugging Face LlamaForCausalLM and Qwen2ForCausalLM (random weights, built from configs by
``edgetorch.models.hf``) through the four torchao recipes on the portable backend and ONNX Runtime: every linear's
packed weights and scales in the .pte are torchao's own int data and scales, byte for byte (packed here with numpy:
two int4 values per byte, low nibble first, offset by 8; ORT's int8 offset by 128); the runtime's generation
(prefill + decode on the static cache) equals torchao's quantized eager model within the kernels' documented
tolerance (2e-2 relative per op, tests/runtime/test_lowbit.py; 3e-2 over the whole model's logits); and the float
program the recipe records in the ETRecord gives the per-token table the float model gives."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, StageType, export
from edgetorch.export.lowbit import LowBitLinear
from edgetorch.models.generation import greedy_generate_with_logits
from edgetorch.runtime import Runtime

pytest.importorskip("torchao")
pytest.importorskip("transformers")

REL_TOL = 3e-2
PROMPT, TOKENS = 6, 5
NAMES = ("TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL", "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR",
         "TORCHAO_INT8_WEIGHT_ONLY", "TORCHAO_INT4_WEIGHT_ONLY")


def _wrapper(family: str):
    from edgetorch.models import hf

    return hf.build_hf_llama_static() if family == "llama" else hf.build_hf_qwen2_static()


def _export(wrapper, recipe, etrecord: bool = False):
    from edgetorch.models import hf

    recipe.strict = True  # HF static caches need TorchDynamo (edgetorch.models.hf)
    vocab = wrapper.model.config.get_text_config().vocab_size
    inputs = hf.hf_method_inputs(vocab, 8)
    return export({"prefill": wrapper, "decode": wrapper}, {k: [v] for k, v in inputs.items()}, recipe,
                  dynamic_shapes=hf.hf_dynamic_shapes(wrapper.max_cache_len), generate_etrecord=etrecord)


def _torchao_eager(model, recipe):
    from torchao.quantization import quantize_

    q = copy.deepcopy(model)
    for c in recipe.quantization_recipe.ao_quantization_configs:
        quantize_(q, c.ao_base_config, c.filter_fn)
    return q


def _numpy_packed(qdata: torch.Tensor, bits: int) -> bytes:
    q = qdata.numpy().astype(np.int16)
    if bits == 8:
        return q.astype(np.int8).tobytes()
    u = (q + 8).astype(np.uint8)
    return (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8).tobytes()


def _prompt(wrapper):
    from edgetorch.models import hf

    vocab = wrapper.model.config.get_text_config().vocab_size
    return hf.hf_method_inputs(vocab, prompt_len=PROMPT, seed=7)["prefill"][0]


def _check(family: str, name: str, enum) -> None:
    wrapper = _wrapper(family)
    recipe = ExportRecipe.get_recipe(enum[name])
    session = _export(wrapper, recipe)
    buf = session.get_pte_buffer()
    bits = 4 if "INT4" in name else 8
    eager = _torchao_eager(wrapper.model, recipe)
    quantized = session.get_stage_artifacts()[StageType.SOURCE_TRANSFORM].data["decode"]
    lowered = {p: m for p, m in quantized.named_modules() if isinstance(m, LowBitLinear)}
    n_layers = wrapper.model.config.num_hidden_layers
    assert len(lowered) == 7 * n_layers + 1  # q, k, v, o, gate, up, down per layer, and the LM head
    for path, m in lowered.items():
        w = _torchao_weight(eager, path)
        assert _numpy_packed(w.qdata, bits) == m.weight.numpy().tobytes(), path  # packing is exact
        stored = m.weight.numpy().tobytes()
        if enum is OrtRecipeType and bits == 8:  # MatMulNBits' 8-bit B: q + 128 in uint8 (its zero point 128)
            stored = (w.qdata.numpy().astype(np.int16) + 128).astype(np.uint8).tobytes()
        assert stored in buf, path  # and travels in the .pte as it is (int4: MatMulNBits' own B layout too)
        if bits == 4:  # bf16 group scales (the kernels' own), exactly torchao's rounded; ORT's: the same as float16
            want = w.scale.detach().float().reshape(m.scales.shape).to(torch.bfloat16)
            assert m.scales.dtype == torch.bfloat16 and torch.equal(m.scales.view(torch.int16),
                                                                    want.view(torch.int16)), path
            held = want.float().to(torch.float16) if enum is OrtRecipeType else want
            assert torch.equal(held.float(), want.float()), path  # float16 holds each bf16 scale exactly
            scales = held.contiguous().view(torch.int16).numpy().tobytes()
        else:
            scales = w.scale.detach().to(torch.float32).contiguous().numpy().tobytes()
            assert scales == m.scales.numpy().tobytes(), path
        assert scales in buf, path
    prompt = _prompt(wrapper)
    prog = Runtime.get().load_program(buf)
    got = greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                      prompt, TOKENS)
    assert len(got.tokens) == TOKENS
    with torch.no_grad():  # torchao's model on the runtime's tokens, no cache: one row per generated token
        ids = torch.cat([prompt, torch.tensor([got.tokens[:-1]])], dim=1)
        want = eager(input_ids=ids, use_cache=False).logits[0, PROMPT - 1:]
    rows = torch.stack([s.reshape(-1, s.shape[-1])[-1] for s in got.step_logits])
    err = float((rows - want).abs().max() / want.abs().max())
    assert err <= REL_TOL, err


def _torchao_weight(eager, path: str):
    """torchao's quantized weight of the wrapper's module ``path`` (the wrapper holds the HF model as ``model``)."""
    return eager.get_submodule(path.removeprefix("model.")).weight


# A covering set (test time: each case is a strict export of two methods): on each backend each recipe once and
# each family twice, and the two backends' sets complement each other, so every (family, recipe) pair is quantized,
# packed and checked against torchao once. Qwen2's q/k/v biases reach both the int4 (act-quantized and
# weight-only) kernels here and the int8 one on ONNX Runtime; tests/runtime/test_lowbit.py checks every kernel's
# bias on its own.
PORTABLE_CASES = [("qwen2", NAMES[0]), ("llama", NAMES[1]), ("llama", NAMES[2]), ("qwen2", NAMES[3])]
ORT_CASES = [("llama", NAMES[0]), ("qwen2", NAMES[1]), ("qwen2", NAMES[2]), ("llama", NAMES[3])]


@pytest.mark.parametrize(("family", "name"), PORTABLE_CASES)
def test_hf_portable_packed_weights_and_logits_equal_torchao(family, name):
    _check(family, name, PortableRecipeType)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "name"), ORT_CASES)
def test_hf_onnxruntime_packed_weights_and_logits_equal_torchao(family, name):
    pytest.importorskip("onnxruntime")
    _check(family, name, OrtRecipeType)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hf_generation_debugged_against_the_recorded_float_program(family, tmp_path):
    """``generate_etrecord=True``: the float programs (strict export, as the static cache needs) are recorded and
    the per-token table without a float model equals the one with the HF float model."""
    from edgetorch.devtools import Inspector

    wrapper = _wrapper(family)
    session = _export(wrapper, ExportRecipe.get_recipe(
        PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR), etrecord=True)
    session.get_executorch_program_manager().save(str(tmp_path / "m.pte"))
    session.get_etrecord().save(str(tmp_path / "etrecord.bin"))
    prog = Runtime.get().load_program(str(tmp_path / "m.pte"), enable_etdump=True, debug_buffer_size="auto")
    greedy_generate_with_logits(prog.load_method("prefill").execute, prog.load_method("decode").execute,
                                _prompt(wrapper), 3)
    prog.write_etdump_result_to_file(str(tmp_path / "e.etdp"), str(tmp_path / "d.bin"))

    def table(model):
        insp = Inspector(etdump_path=tmp_path / "e.etdp", etrecord=tmp_path / "etrecord.bin",
                         debug_buffer_path=tmp_path / "d.bin")
        return insp.quantized_generation_table(model)

    got, want = table(None), table(copy.deepcopy(wrapper))
    assert len(got) == 3 * (7 * wrapper.model.config.num_hidden_layers + 1)
    assert got["sqnr_db"].notna().all()
    # o_proj's runtime input in the dynamic-length prefill (a transpose + reshape of dynamic sizes) is not
    # rebuilt, with a float model as without: no local SQNR there, every other row has one
    missing = got[got["local_sqnr_db"].isna()]
    assert set(missing["method"]) <= {"prefill"} and missing["layer"].str.endswith("o_proj").all()
    assert got["local_sqnr_db"].isna().tolist() == want["local_sqnr_db"].isna().tolist()
    for c in ("sqnr_db", "local_sqnr_db"):  # the FX-run program vs HF's eager kernels: float rounding only
        assert got[c].tolist() == pytest.approx(want[c].tolist(), abs=1e-5, nan_ok=True), c
    g, w = got.attrs["tokens"], want.attrs["tokens"]
    assert g["float_token"].tolist() == w["float_token"].tolist()
    assert g["logits_sqnr_db"].tolist() == pytest.approx(w["logits_sqnr_db"].tolist(), abs=1e-5)
