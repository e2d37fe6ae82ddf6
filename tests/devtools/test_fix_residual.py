"""``find_fix`` on a plant whose error travels the residual stream (issue 24): an outlier in the weight of a
pre-norm residual network's embedding makes the float model itself carry an outlier channel down the stream, so
keeping the planted layer float (its ops and the values it reads and writes) is not enough; the fix keeps the
values the stream passes through float as well, and is proven here by an independent re-export and run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgetorch.export import ExportRecipe, PortableRecipeType, export
from edgetorch.runtime import Runtime
from edgetorch.workflows.fix import ACTIVATION, final_error, find_fix

RECIPE = PortableRecipeType.INT8_STATIC_PER_TENSOR


class ResidualNet(nn.Module):
    """embed -> 2 x (x + fc2(relu(fc1(layer_norm(x))))) -> layer_norm -> head, as a ViT's encoder."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(16, 32)
        self.norms = nn.ModuleList(nn.LayerNorm(32) for _ in range(3))
        self.fc1 = nn.ModuleList(nn.Linear(32, 64) for _ in range(2))
        self.fc2 = nn.ModuleList(nn.Linear(64, 32) for _ in range(2))
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for norm, fc1, fc2 in zip(self.norms, self.fc1, self.fc2):
            x = x + fc2(torch.relu(fc1(norm(x))))
        return self.head(self.norms[2](x))


def _samples(n: int = 4) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g),) for _ in range(n)]


def _error(model: nn.Module, samples: list[tuple], **options: object) -> float:
    pte = export(model, samples, ExportRecipe.get_recipe(RECIPE, **options)).get_pte_buffer()
    method = Runtime.get().load_program(pte).load_method("forward")
    with torch.no_grad():
        return final_error([model(*s) for s in samples], [method.execute(*s) for s in samples])


@pytest.mark.slow  # 5 exports and runs (about 15 s on an idle core)
def test_a_plant_carried_by_the_residual_stream_is_fixed_and_proven() -> None:
    samples = _samples()
    tolerance = 2 * _error(ResidualNet().eval(), samples)
    model = ResidualNet().eval()
    with torch.no_grad():
        model.embed.weight.view(-1)[0] = 60 * model.embed.weight.abs().max()
    # the planted layer alone kept float (its op, its input and output values) does not bring the output back
    assert _error(model, samples, quant_exclude_nodes=("linear",), quant_exclude_activations=("x", "linear")) \
        > tolerance
    result = find_fix(model, samples, RECIPE, tolerance, max_reexports=3, progress=lambda msg: None)
    assert result.baseline.final_error > tolerance and result.proven, result.summary()
    kept = [k.removeprefix(ACTIVATION) for k in result.fix if k.startswith(ACTIVATION)]
    assert any(k.startswith("add") for k in kept)  # the residual stream's values
    ops = tuple(k for k in result.fix if not k.startswith(ACTIVATION))
    assert _error(model, samples, quant_exclude_nodes=ops, quant_exclude_activations=tuple(kept)) <= tolerance
