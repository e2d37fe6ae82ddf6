"""``find_culprits`` on a float-reference table names the planted bad layer first, or on a clean model the layer
where the accumulated SQNR falls most (issue 24's planted-layer campaign, ``bench/bench_planted_int8.py``).

Two kinds of check: hand-built tables that reproduce what the campaign measured (ViT: a layer norm where the
accumulated SQNR falls 13 dB while its own quantization is normal, a head with a poor local SQNR where nothing
falls; GPT-2: the ``0.044715 * x**3`` term of GELU, quantized as an add's input, with a local SQNR of 14 dB but a
signal 50 dB below the value it joins), whose expected answers are computed here from the columns; and a real INT8
export of GPT-2's MLP (``Conv1D`` = ``addmm``, ``gelu_new``) with an outlier planted in its second projection.
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from torch import nn

from edgetorch.devtools.inspector.culprits import find_culprits


def _table(rows: list[tuple[str, float, float, float]]) -> pd.DataFrame:
    """(op, accumulated SQNR, local SQNR, mean square of the float value) per row, all quantized."""
    df = pd.DataFrame({
        "aot_ops": [[op] for op, *_ in rows], "sqnr_db": [a for _, a, _, _ in rows],
        "local_sqnr_db": [loc for _, _, loc, _ in rows], "quantized": [True] * len(rows),
        "aot_intermediate_output": [torch.full((4, 8), math.sqrt(sig)) for *_, sig in rows]})
    df.attrs["reference_graph"] = "float"
    return df


def _steepest(df: pd.DataFrame) -> int:
    """The row whose accumulated SQNR falls most from the previous row's (the first from the median local)."""
    prev = float(df["local_sqnr_db"].median())
    best, at = -math.inf, -1
    for i, a in zip(df.index, df["sqnr_db"]):
        if prev - a > best:
            best, at = prev - a, i
        prev = a
    return at


VIT = [("conv2d", 35.5, 35.5, 0.9), ("add", 34.3, 41.1, 0.8), ("layer_norm", 21.1, 42.6, 1.0),
       ("linear", 21.0, 40.8, 0.5), ("linear_1", 19.1, 41.0, 0.03), ("add_1", 30.1, 41.0, 0.9),
       ("layer_norm_1", 24.0, 42.5, 1.0), ("linear_2", 24.2, 40.5, 0.7), ("linear_3", 23.3, 41.2, 0.4),
       ("select", 20.0, 44.9, 1.0), ("head", 20.0, 21.7, 0.02)]


def test_clean_model_first_culprit_is_the_steepest_accumulated_drop() -> None:
    df = _table(VIT)
    culprits = find_culprits(df)
    assert culprits.index[0] == _steepest(df) == 2  # the layer norm: 34.3 -> 21.1 dB
    assert culprits.iloc[0]["sqnr_drop_db"] == df.at[1, "sqnr_db"] - df.at[2, "sqnr_db"]
    # the head's own quantization is poor (21.7 dB) but the accumulated SQNR does not fall there
    assert culprits.iloc[0]["aot_ops"] == ["layer_norm"] and 10 not in culprits.index[:1]


def test_planted_layer_is_named_before_a_steeper_drop_of_a_normal_layer() -> None:
    planted = list(VIT)
    planted[7] = ("linear_2", 15.1, 15.6, 1.4)  # the outlier: local 15.6 dB (typical 41), accumulated 24 -> 15
    planted[8:] = [(op, a - 8.0, loc, sig) for op, a, loc, sig in planted[8:]]
    df = _table(planted)
    culprits = find_culprits(df)
    assert culprits.iloc[0]["aot_ops"] == ["linear_2"]
    assert culprits.iloc[0]["local_excess_db"] > 20 and "worse than the table's typical" in culprits.iloc[0]["evidence"]
    assert culprits.iloc[1]["aot_ops"] == ["layer_norm"]  # then the steepest fall of a normal layer


GPT2 = [("view", 38.7, 42.5, 1.0), ("addmm", 35.1, 37.6, 1e-2), ("view_6", 35.1, 41.9, 7e-3),
        ("addmm_1", 33.0, 36.0, 3e-5), ("add_4", 38.2, 43.2, 8e-4), ("addmm_2", 34.5, 38.4, 1e-2),
        ("mul_1", 14.1, 14.2, 5e-8), ("add_5", 33.9, 42.4, 1e-2), ("tanh", 33.0, 41.2, 7e-3),
        ("view_10", 33.6, 41.4, 3e-3), ("addmm_3", 15.6, 15.8, 3e-4), ("add_7", 20.6, 36.7, 1e-3)]


def test_a_small_addend_with_a_poor_local_sqnr_is_not_the_planted_layer() -> None:
    df = _table(GPT2)
    culprits = find_culprits(df)
    assert culprits.iloc[0]["aot_ops"] == ["addmm_3"]  # the planted Conv1D, although mul_1's local SQNR is lower
    mul = df.index[[ops == ["mul_1"] for ops in df["aot_ops"]]][0]
    assert df.at[mul, "local_sqnr_db"] < culprits.iloc[0]["local_sqnr_db"]
    assert culprits.at[mul, "local_excess_db"] < 0  # 14 dB against a value 53 dB larger: 67 dB effective


class Gpt2Mlp(nn.Module):
    """GPT-2's MLP: Conv1D (``addmm``) -> ``gelu_new`` -> Conv1D, random weights."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = nn.Parameter(torch.randn(32, 64, generator=g) * 0.02)
        self.b1 = nn.Parameter(torch.zeros(64))
        self.w2 = nn.Parameter(torch.randn(64, 32, generator=g) * 0.02)
        self.b2 = nn.Parameter(torch.zeros(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.addmm(self.b1, x.view(-1, 32), self.w1)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return torch.addmm(self.b2, h, self.w2)


def test_planted_gpt2_conv1d_is_named_first_on_the_int8_program() -> None:
    from edgetorch.export import ExportRecipe, PortableRecipeType, export
    from edgetorch.workflows.quant_fallback import inspect_quantized

    g = torch.Generator().manual_seed(1)
    samples = [(torch.randn(8, 32, generator=g),) for _ in range(4)]
    model = Gpt2Mlp().eval()
    with torch.no_grad():
        model.w2.view(-1)[0] = 60 * model.w2.abs().max()  # its per-tensor int8 scale is 60x too coarse
    recipe = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_TENSOR)
    et = export(model, samples, recipe, generate_etrecord=True).get_executorch_program_manager()
    df = inspect_quantized(et, samples).table
    culprits = find_culprits(df)
    assert culprits.iloc[0]["aot_ops"] == ["addmm_1"]  # the second Conv1D (quantized: addmm is annotated)
    lowest = min((v, ops) for v, ops, q in zip(df["local_sqnr_db"], df["aot_ops"], df["quantized"])
                 if q and math.isfinite(v))
    assert lowest[1] != ["addmm_1"]  # GELU's x**3 term has the lowest local SQNR: not the answer
    # the Conv1D rows carry their weight's own error (addmm's weight is argument 2, (in, out)): the planted one's
    # per-tensor scale is 60x too coarse, so its weight SQNR is far below the clean Conv1D's
    w_sqnr = {ops[0]: v for ops, v in zip(df["aot_ops"], df["weight_sqnr_db"]) if ops[0] in ("addmm", "addmm_1")}
    assert all(v is not None and math.isfinite(v) for v in w_sqnr.values()) and len(w_sqnr) == 2, w_sqnr
    assert w_sqnr["addmm_1"] < w_sqnr["addmm"] - 20, w_sqnr
