"""Quantization exclusions of the INT8 recipes: the ops named by module path, node name or op stay float.

Checked against independent computations: the excluded layer's output in the converted PT2E graph equals the
float layer run eagerly on the same input (bit for bit: same ATen kernel, float weights), the other layers read
dequantized int8 weights, and the .pte's output equals the converted graph's output (portable) or stays close to
the float model (ORT).
"""

from __future__ import annotations

import pytest
import torch
from torch.fx import GraphModule

from edgetorch.errors import RecipeError
from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, StageType, export
from edgetorch.export.quantizer import SymmetricQuantizationConfig
from tests.quant_helpers import TinyConvNet, conv_samples, node_values


def _converted(session) -> GraphModule:
    return session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]


def _weight_is_dequantized(node: torch.fx.Node) -> bool:
    w = node.args[1]
    return isinstance(w, torch.fx.Node) and w.op == "call_function" and "dequantize" in str(w.target)


def _ops(gm: GraphModule, target: object) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


@pytest.mark.parametrize("option", [{"exclude_module_paths": ("conv1",)}, {"exclude_nodes": ("conv2d",)},
                                    {"quant_exclude_module_paths": ("conv1",)}])
def test_excluded_first_layer_equals_the_float_layer(option: dict) -> None:
    model, samples = TinyConvNet().eval(), conv_samples()
    recipe = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL, **option)
    session = export(model, samples, recipe)
    gm = _converted(session)
    conv1, conv2 = _ops(gm, torch.ops.aten.conv2d.default)
    assert not _weight_is_dequantized(conv1) and _weight_is_dequantized(conv2)
    assert _weight_is_dequantized(_ops(gm, torch.ops.aten.linear.default)[0])
    x = samples[0][0]
    values = node_values(gm, x)
    with torch.no_grad():
        assert torch.equal(values[conv1.name], model.conv1(x))
        assert torch.equal(values[conv1.args[0].name], x)  # its input is not quantized either
    (out,) = session.run_method("forward", (x,))
    torch.testing.assert_close(out, gm(x), rtol=0, atol=1e-5)


def test_excluded_last_layer_runs_float_on_the_runtime() -> None:
    model, samples = TinyConvNet().eval(), conv_samples()
    recipe = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_TENSOR, exclude_ops=("linear",))
    session = export(model, samples, recipe)
    gm = _converted(session)
    (head,) = _ops(gm, torch.ops.aten.linear.default)
    assert not _weight_is_dequantized(head)
    assert not any("quantize" in str(u.target) for u in head.users)  # its output is not quantized
    x = samples[1][0]
    flat = node_values(gm, x)[head.args[0].name]
    (out,) = session.run_method("forward", (x,))
    with torch.no_grad():
        want = model.head(flat)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)


def test_unexcluded_export_quantizes_every_layer() -> None:
    recipe = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL)
    session = export(TinyConvNet().eval(), conv_samples(), recipe)
    gm = _converted(session)
    weighted = _ops(gm, torch.ops.aten.conv2d.default) + _ops(gm, torch.ops.aten.linear.default)
    assert len(weighted) == 3 and all(_weight_is_dequantized(n) for n in weighted)


def test_ort_int8_recipe_keeps_excluded_layer_float() -> None:
    pytest.importorskip("onnxruntime")
    model, samples = TinyConvNet().eval(), conv_samples()
    recipe = ExportRecipe.get_recipe(OrtRecipeType.INT8_STATIC_PER_CHANNEL, quant_exclude_module_paths=("head",))
    session = export(model, samples, recipe)
    gm = _converted(session)
    (head,) = _ops(gm, torch.ops.aten.linear.default)
    assert not _weight_is_dequantized(head)
    assert all(_weight_is_dequantized(n) for n in _ops(gm, torch.ops.aten.conv2d.default))
    assert session.get_delegation_info().num_delegated_subgraphs >= 1
    x = samples[0][0]
    (out,) = session.run_method("forward", (x,))
    with torch.no_grad():
        want = model(x)
    cos = torch.nn.functional.cosine_similarity(out.flatten().double(), want.flatten().double(), dim=0).item()
    assert cos > 0.99


def test_dynamic_recipe_honours_exclusions() -> None:
    session = export(TinyConvNet().eval(), conv_samples(2), ExportRecipe.get_recipe(
        PortableRecipeType.INT8_DYNAMIC_PER_CHANNEL, exclude_module_paths=("conv",)))
    gm = _converted(session)
    assert not any(_weight_is_dequantized(n) for n in _ops(gm, torch.ops.aten.conv2d.default))
    assert _weight_is_dequantized(_ops(gm, torch.ops.aten.linear.default)[0])


def test_config_resolves_op_names() -> None:
    cfg = SymmetricQuantizationConfig(exclude_ops=("aten.linear.default", "conv2d", torch.ops.aten.add))
    assert cfg.exclude_ops == (torch.ops.aten.linear.default, torch.ops.aten.conv2d.default,
                               torch.ops.aten.add.default)


@pytest.mark.parametrize(("recipe_type", "kwargs", "needle"), [
    (PortableRecipeType.INT8_STATIC_PER_CHANNEL, {"exclude_ops": ("no_such_op",)}, "quant_exclude_ops"),
    (PortableRecipeType.INT8_STATIC_PER_CHANNEL, {"quant_exclude_nodes": "conv2d"}, "quant_exclude_nodes"),
    (PortableRecipeType.INT8_STATIC_PER_CHANNEL, {"exclude_nodes": (), "quant_exclude_nodes": ()}, "not both"),
    (PortableRecipeType.INT8_STATIC_PER_CHANNEL, {"quant_exclude_module_paths": ("",)},
     "quant_exclude_module_paths"),
    (PortableRecipeType.FP32, {"exclude_nodes": ("x",)}, "FP32"),
    (OrtRecipeType.FP32, {"quant_exclude_nodes": ("x",)}, "quant_exclude_nodes"),
])
def test_bad_exclusions_raise_recipe_error(recipe_type, kwargs: dict, needle: str) -> None:  # noqa: ANN001
    with pytest.raises(RecipeError, match=needle):
        ExportRecipe.get_recipe(recipe_type, **kwargs)
