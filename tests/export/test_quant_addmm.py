"""INT8 quantization of ``addmm`` with a constant weight (Hugging Face's ``Conv1D``: GPT-2's projections, weight of
shape ``(in, out)``): the weight is int8 (per column when per channel), the bias corrected as a linear's.

Checked independently: the corrected bias is recomputed here from the float weight, a per-column int8 quantization
written in the test and ``x @ (W_int8 - W)`` on the calibration inputs; an outlier planted in the weight makes the
per-tensor program's output, run by the portable runtime, far worse than the clean one's (the weight is quantized,
its scale ruined), as for a ``linear``.
"""

from __future__ import annotations

import torch
from torch import nn

from edgetorch.export import ExportRecipe, PortableRecipeType, StageType, export
from edgetorch.runtime import Runtime


class Conv1DNet(nn.Module):
    """Two GPT-2 ``Conv1D`` layers (``addmm(bias, x, W)``, ``W`` of shape ``(in, out)``) with a relu between."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = nn.Parameter(torch.randn(16, 32, generator=g) * 0.2)
        self.b1 = nn.Parameter(torch.randn(32, generator=g) * 0.1)
        self.w2 = nn.Parameter(torch.randn(32, 8, generator=g) * 0.2)
        self.b2 = nn.Parameter(torch.randn(8, generator=g) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(torch.addmm(self.b1, x.view(-1, 16), self.w1))
        return torch.addmm(self.b2, y, self.w2)


def _samples(n: int = 4, seed: int = 1) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 16, generator=g),) for _ in range(n)]


def _converted(session) -> torch.fx.GraphModule:  # noqa: ANN001
    return session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]


def _attr(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor:
    obj: object = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def test_addmm_weight_is_quantized_per_column_and_its_bias_corrected() -> None:
    model, samples = Conv1DNet().eval(), _samples()
    gm = _converted(export(model, samples, ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL)))
    addmms = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.addmm.default]
    assert len(addmms) == 2
    first = addmms[0]
    assert "dequantize_per_channel" in str(first.args[2].target)  # the weight: int8, dequantized per channel
    assert first.args[2].args[3] == 1  # ... along its output (column) axis
    w = model.w1.detach()
    amax = w.abs().amax(0).clamp_min(2.0 ** -12)
    w_q = torch.clamp(torch.round(w / (amax / 127.0)), -127, 127) * (amax / 127.0)
    with torch.no_grad():  # the first addmm reads the model input itself: its float input is the sample
        err = torch.stack([(x @ (w_q - w)).mean(0) for (x,) in samples]).mean(0)
    torch.testing.assert_close(_attr(gm, first.args[0]), model.b1.detach() - err, rtol=0, atol=1e-6)
    assert err.abs().max() > 1e-5  # a real correction


def _error(model: nn.Module, samples: list[tuple]) -> float:
    recipe = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_TENSOR)
    method = Runtime.get().load_program(export(model, samples, recipe).get_pte_buffer()).load_method("forward")
    with torch.no_grad():
        return max(((method.execute(*s)[0] - model(*s)).norm() / model(*s).norm()).item() for s in samples)


def test_an_outlier_in_an_addmm_weight_ruins_its_per_tensor_quantization() -> None:
    samples = _samples()
    clean = _error(Conv1DNet().eval(), samples)
    planted = Conv1DNet().eval()
    with torch.no_grad():
        planted.w2.view(-1)[0] = 60 * planted.w2.abs().max()
    assert 0 < clean < 0.05
    assert _error(planted, samples) > 5 * clean  # the weight is quantized: its scale is 60x too coarse
