"""Bias correction of the INT8 recipes (``bias_correction=True``, the default of static quantization): each
quantized conv/linear's bias absorbs the mean output shift of its weight quantization on the calibration samples.

Checked against independent computations: the corrected bias is recomputed here from the float weight, a per-channel
int8 quantization written in the test and ``F.conv2d`` on the calibration inputs; the exported program, run by the
portable runtime on held-out inputs, is closer to eager float with the correction than without; the fake-quantized
simulation of the block fallback stays exact (an op kept float gets its own bias back).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

from edgetorch.errors import RecipeError
from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, StageType, export
from edgetorch.export.quantizer import (
    SymmetricInt8Quantizer,
    SymmetricQuantizationConfig,
    capture_float_program,
    convert_calibrated,
)
from edgetorch.runtime import Runtime
from edgetorch.workflows.quant_fallback import _FakeQuant, _flat_float, _is_q
from tests.quant_helpers import TinyConvNet, conv_samples

INT8 = PortableRecipeType.INT8_STATIC_PER_CHANNEL


def _held_out(n: int = 8) -> list[tuple]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(n)]


class _NoBiasConvNet(nn.Module):
    """conv (bias) -> relu -> conv (no bias) -> relu -> linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.head = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        y = torch.relu(self.conv2(y))
        return self.head(y.flatten(1))


def _resnet18() -> tuple[nn.Module, list[tuple], list[tuple]]:
    from edgetorch.models import get_spec

    g = torch.Generator().manual_seed(0)
    samples = [(torch.randn(1, 3, 224, 224, generator=g),) for _ in range(4)]
    return get_spec("resnet18").build().eval(), samples[:2], samples[2:]


def _converted(session) -> torch.fx.GraphModule:
    return session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]


def _ops(gm: torch.fx.GraphModule, target: object) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def _attr(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor:
    obj: object = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def _int8_per_channel(w: torch.Tensor) -> torch.Tensor:
    """Symmetric per-output-channel int8 in [-127, 127], dequantized (written here, independent of torchao)."""
    amax = w.abs().reshape(w.shape[0], -1).amax(1).clamp_min(2.0 ** -12)
    scale = (amax / 127.0).reshape(-1, *[1] * (w.dim() - 1))
    return torch.clamp(torch.round(w / scale), -127, 127) * scale


def test_first_conv_bias_is_corrected_by_the_mean_weight_error() -> None:
    model, samples = TinyConvNet().eval(), conv_samples()
    plain = _converted(export(model, samples, ExportRecipe.get_recipe(INT8, bias_correction=False)))
    corrected = _converted(export(model, samples, ExportRecipe.get_recipe(INT8)))
    conv_plain, conv_corr = _ops(plain, torch.ops.aten.conv2d.default)[0], _ops(corrected,
                                                                                 torch.ops.aten.conv2d.default)[0]
    assert torch.equal(_attr(plain, conv_plain.args[2]), model.conv1.bias.detach())  # off: the float bias
    w = model.conv1.weight.detach()
    with torch.no_grad():  # the first conv reads the model input itself: its float input is the sample
        err = torch.stack([F.conv2d(x, _int8_per_channel(w) - w, None, 1, 1).mean(dim=(0, 2, 3))
                           for (x,) in samples]).mean(0)
    torch.testing.assert_close(_attr(corrected, conv_corr.args[2]), model.conv1.bias.detach() - err,
                               rtol=0, atol=1e-6)
    assert err.abs().max() > 1e-5  # a real correction, not a no-op


def _mse_to_float(model: nn.Module, samples: list[tuple], held_out: list[tuple], **options: object) -> float:
    pte = export(model, samples, ExportRecipe.get_recipe(INT8, **options)).get_pte_buffer()
    method = Runtime.get().load_program(pte).load_method("forward")
    with torch.no_grad():
        errs = [(method.execute(*s)[0] - model(*s)).pow(2).mean().item() for s in held_out]
    return sum(errs) / len(errs)


@pytest.mark.parametrize("case", ["tiny", "resnet18"])
def test_bias_correction_lowers_the_int8_error_on_held_out_inputs(case: str) -> None:
    """On the exported programs run by the portable runtime, against eager float on inputs the calibration did
    not see: TinyConvNet's MSE drops by 13 %, the zoo ResNet-18's (random weights, folded batch norms) by about
    half."""
    model, samples, held_out = (TinyConvNet().eval(), conv_samples(), _held_out()) if case == "tiny" else _resnet18()
    off = _mse_to_float(model, samples, held_out, bias_correction=False)
    on = _mse_to_float(model, samples, held_out)
    assert on < (0.95 if case == "tiny" else 0.75) * off, (on, off)


def test_a_conv_without_bias_gets_one() -> None:
    model, samples = _NoBiasConvNet().eval(), conv_samples()
    gm = _converted(export(model, samples, ExportRecipe.get_recipe(INT8)))
    conv2 = _ops(gm, torch.ops.aten.conv2d.default)[1]
    assert model.conv2.bias is None and isinstance(conv2.args[2], torch.fx.Node)
    assert _attr(gm, conv2.args[2]).shape == (16,)


def test_excluded_ops_and_dynamic_recipes_are_not_corrected() -> None:
    model, samples = TinyConvNet().eval(), conv_samples()
    gm = _converted(export(model, samples, ExportRecipe.get_recipe(INT8, exclude_nodes=("conv2d",))))
    conv1 = _ops(gm, torch.ops.aten.conv2d.default)[0]
    assert torch.equal(_attr(gm, conv1.args[2]), model.conv1.bias.detach())  # float weight: float bias
    dyn = _converted(export(model, samples, ExportRecipe.get_recipe(PortableRecipeType.INT8_DYNAMIC_PER_CHANNEL)))
    conv1 = _ops(dyn, torch.ops.aten.conv2d.default)[0]
    assert torch.equal(_attr(dyn, conv1.args[2]), model.conv1.bias.detach())


def test_bias_correction_option_is_checked_and_reaches_both_backends() -> None:
    with pytest.raises(RecipeError, match="bias_correction"):
        ExportRecipe.get_recipe(INT8, bias_correction="yes")
    for recipe_type in (INT8, OrtRecipeType.INT8_STATIC_PER_CHANNEL):
        recipe = ExportRecipe.get_recipe(recipe_type, bias_correction=False)
        assert recipe.quantization_recipe.quantizers[0].config.bias_correction is False
        assert ExportRecipe.get_recipe(recipe_type).quantization_recipe.quantizers[0].config.bias_correction


def test_fake_quant_simulation_restores_the_bias_of_an_op_kept_float() -> None:
    """Taking the weight quantizer of ``conv2d_1`` out of the simulated module must give exactly what the recipe
    that excludes that op computes (float weight, float bias, the other corrections unchanged)."""
    model, samples = TinyConvNet().eval(), conv_samples()
    quantizer = SymmetricInt8Quantizer(SymmetricQuantizationConfig())
    prepared = prepare_pt2e(capture_float_program(model, samples[0]).module(), quantizer)
    with torch.no_grad():
        for s in samples:
            prepared(*s)
        refs = [_flat_float(model(*s)) for s in samples]
    gm = convert_calibrated(prepared, quantizer, samples, fold_quantize=False)
    sim = _FakeQuant(gm, samples, refs)
    (conv2,) = [n for n in gm.graph.nodes if n.name == "conv2d_1"]
    weight_q = conv2.args[1].args[0]
    assert _is_q(weight_q)
    simulated = sim.cosine({weight_q})
    excluded = _converted(export(model, samples, ExportRecipe.get_recipe(INT8, exclude_nodes=("conv2d_1",))))
    with torch.no_grad():
        cos = [F.cosine_similarity(_flat_float(excluded(*s)), r, dim=0).item() for s, r in zip(samples, refs)]
    assert simulated == pytest.approx(sum(cos) / len(cos), abs=1e-6)
    assert sim.cosine(set()) != pytest.approx(simulated, abs=1e-7)  # and the bias is back after the call
    assert conv2.args[2].name.startswith("_bias_corrected")
