"""Block fallback: a layer kept float with the activation quantizers only it needs (``exclude_activations``),
chosen on the fake-quantized model. Checked against independent computations: the exported program run by the
portable runtime (the simulated cosine must be what the re-exported program measures) and the converted PT2E
graph's structure and values."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from edgetorch.errors import RecipeError
from edgetorch.export import ExportRecipe, PortableRecipeType, export
from edgetorch.export.quantizer import SymmetricInt8Quantizer, SymmetricQuantizationConfig, capture_float_program
from edgetorch.runtime import Runtime
from edgetorch.workflows.quant_fallback import cosine_to_float, simulate_blocks
from tests.quant_helpers import TinyConvNet, conv_samples, node_values

INT8 = PortableRecipeType.INT8_STATIC_PER_CHANNEL


def _converted(model: nn.Module, samples: list[tuple], config: SymmetricQuantizationConfig) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(capture_float_program(model, samples[0]).module(), SymmetricInt8Quantizer(config))
    with torch.no_grad():
        for s in samples:
            prepared(*s)
    return convert_pt2e(prepared)


def test_exclude_activations_keeps_the_value_float() -> None:
    model, samples = TinyConvNet().eval(), conv_samples()
    gm = _converted(model, samples, SymmetricQuantizationConfig(exclude_activations=("relu",)))
    nodes = {n.name: n for n in gm.graph.nodes}
    assert not [u for u in nodes["relu"].users if "quantize" in str(u.target)]
    assert nodes["conv2d_1"].args[0] is nodes["relu"]  # conv2 reads the float value
    assert "dequantize_per_channel" in str(nodes["conv2d_1"].args[1].target)  # its weight stays int8
    # the value the second conv reads is the relu of the first conv's output, not rounded to an int8 grid
    base = _converted(model, samples, SymmetricQuantizationConfig())
    got = node_values(gm, samples[0][0])
    assert torch.equal(got["relu"], torch.relu(got["conv2d"]))
    (q,) = [u for u in next(n for n in base.graph.nodes if n.name == "relu").users if "quantize" in str(u.target)]
    steps = got["relu"] / float(q.args[1])
    assert (steps - steps.round()).abs().max() > 0.1  # off the int8 grid the default program rounds it to


def test_exclude_activations_is_a_recipe_option() -> None:
    with pytest.raises(RecipeError, match="quant_exclude_activations"):
        ExportRecipe.get_recipe(INT8, quant_exclude_activations="relu")
    recipe = ExportRecipe.get_recipe(INT8, exclude_activations=("relu",))
    assert recipe.quantization_recipe.quantizers[0].config.exclude_activations == ("relu",)


def test_a_block_keeps_the_op_and_the_values_only_it_quantizes() -> None:
    model, samples = TinyConvNet().eval(), conv_samples()
    quantizer = ExportRecipe.get_recipe(INT8).quantization_recipe.quantizers[0]
    chosen = simulate_blocks(model, samples, quantizer, steps=3)
    blocks = {b.layer: b for b, _ in chosen}
    if "conv2d_1" in blocks:  # conv2: its fused relu, its output and its input (read by conv2 alone) float
        assert blocks["conv2d_1"].nodes == ("conv2d_1", "relu_1")
        assert set(blocks["conv2d_1"].activations) == {"relu_1", "relu"}
    assert len(chosen) == 3 and all(b.nodes and b.activations for b, _ in chosen)


def test_simulated_cosine_is_what_the_exported_program_measures() -> None:
    model, samples = TinyConvNet().eval(), conv_samples()
    quantizer = ExportRecipe.get_recipe(INT8).quantization_recipe.quantizers[0]
    chosen = simulate_blocks(model, samples, quantizer, steps=2)
    nodes: list[str] = []
    acts: list[str] = []
    for block, simulated in chosen:
        nodes += block.nodes
        acts += block.activations
        recipe = ExportRecipe.get_recipe(INT8, quant_exclude_nodes=tuple(nodes), quant_exclude_activations=tuple(acts))
        pte = export(model, samples, recipe).get_pte_buffer()
        method = Runtime.get().load_program(pte).load_method("forward")
        measured = cosine_to_float(model, samples, [method.execute(*s) for s in samples])
        assert measured == pytest.approx(simulated, abs=1e-6)


def test_blocks_chosen_on_select_samples_report_their_cosine_on_them() -> None:
    """Calibrated on ``samples``, chosen (and scored) on ``select_samples``: the simulated cosine of each step is
    what the re-exported program (calibrated on ``samples`` again) measures on the selection samples."""
    model, samples = TinyConvNet().eval(), conv_samples()
    g = torch.Generator().manual_seed(11)
    select = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(6)]
    quantizer = ExportRecipe.get_recipe(INT8).quantization_recipe.quantizers[0]
    chosen = simulate_blocks(model, samples, quantizer, steps=2, select_samples=select)
    block, simulated = chosen[0]
    recipe = ExportRecipe.get_recipe(INT8, quant_exclude_nodes=block.nodes, quant_exclude_activations=block.activations)
    method = Runtime.get().load_program(export(model, samples, recipe).get_pte_buffer()).load_method("forward")
    assert cosine_to_float(model, select, [method.execute(*s) for s in select]) == pytest.approx(simulated, abs=1e-6)
    on_calibration = cosine_to_float(model, samples, [method.execute(*s) for s in samples])
    assert on_calibration != pytest.approx(simulated, abs=1e-6)  # scored on the selection samples, not these
