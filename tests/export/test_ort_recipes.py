"""Export sessions with ``OrtRecipeType`` recipes: the program is delegated to ONNX Runtime, FP32 matches eager,
INT8 runs as ORT integer kernels and stays close to eager and to the fake-quantized reference, options reach the
partitioner, bad options are refused."""

from __future__ import annotations

import pytest
import torch

from edgetorch.errors import RecipeError
from edgetorch.exir.backend import CALL_DELEGATE, lowered_module_of
from edgetorch.export import ExportRecipe, OrtRecipeType, StageType, export, recipe_registry
from edgetorch.models import get_spec
from tests.conftest import max_rel_err

ORT = OrtRecipeType


def _model():
    spec = get_spec("small_cnn")
    return spec.build(), spec.example_inputs()["forward"]


def _samples(x: tuple, n: int, seed: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(x[0].shape, generator=g),) for _ in range(n)]


def _delegated(session) -> tuple[int, list[str]]:
    ep = session.get_executorch_program_manager().exported_program()
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    return (sum(n.target is CALL_DELEGATE for n in calls),
            [str(n.target) for n in calls if n.target is not CALL_DELEGATE and "getitem" not in str(n.target)])


def test_fp32_recipe_delegates_everything_and_matches_eager():
    model, x = _model()
    session = export(model, [x], ExportRecipe.get_recipe(ORT.FP32))
    n_calls, portable = _delegated(session)
    assert n_calls == 1 and portable == []
    info = session.get_delegation_info()
    assert info.num_delegated_subgraphs == 1 and info.num_non_delegated_nodes == 0
    with torch.no_grad():
        for sample in [x, *_samples(x, 2, 3)]:
            assert max_rel_err(session.run_method("forward", sample)[0], model(*sample)) <= 1e-4


@pytest.mark.parametrize("recipe_type", [ORT.INT8_STATIC_PER_CHANNEL, ORT.INT8_STATIC_PER_TENSOR],
                         ids=lambda t: t.name)
def test_int8_recipes_run_on_ort_close_to_eager(recipe_type):
    model, x = _model()
    session = export(model, [x, *_samples(x, 3, 1)], ExportRecipe.get_recipe(recipe_type))
    n_calls, portable = _delegated(session)
    assert n_calls >= 1 and portable == []
    lowered = [n for n in session.get_executorch_program_manager().exported_program().graph.nodes
               if n.op == "call_function" and n.target is CALL_DELEGATE]
    inner = {str(n.target) for c in lowered for n in lowered_module_of(c).original_module.graph.nodes}
    assert any("quantize_per_tensor" in t for t in inner)
    fake_quant = session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]
    with torch.no_grad():
        for sample in _samples(x, 3, 2):
            got, want = session.run_method("forward", sample)[0], model(*sample)
            cos = torch.nn.functional.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0)
            assert max_rel_err(got, want) <= 0.1 and cos.item() >= 0.995
            # ORT's integer kernels requantize differently from the Q/DQ reference, but not by much
            assert max_rel_err(got, fake_quant(*sample)) <= 0.1


def test_partitioner_options_pass_through_and_bad_options_are_refused():
    model, x = _model()
    session = export(model, [x], ExportRecipe.get_recipe(ORT.FP32, exclude_ops=["aten.relu.default"]))
    n_calls, portable = _delegated(session)
    assert n_calls >= 2 and portable and all("relu" in t for t in portable)
    with torch.no_grad():
        assert max_rel_err(session.run_method("forward", x)[0], model(*x)) <= 1e-4
    with pytest.raises(RecipeError, match="no_such_option"):
        ExportRecipe.get_recipe(ORT.FP32, no_such_option=1)
    with pytest.raises(RecipeError, match="activation_observer"):
        ExportRecipe.get_recipe(ORT.INT8_STATIC_PER_TENSOR, activation_observer="nope")
    assert "onnxruntime" in recipe_registry.list_backends()
    assert set(recipe_registry.get_supported_recipes("onnxruntime")) == set(ORT)
