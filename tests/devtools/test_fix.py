"""``find_fix``: the smallest fallback set found by re-exporting, its final error checked independently, the
search order's budget, delegate exclusions reaching the partitioner, and argument errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from edgetorch.errors import InspectorError
from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, export
from edgetorch.models import get_model
from edgetorch.runtime import Runtime
from edgetorch.workflows.fix import ACTIVATION, _merge_overlapping, _search_order, final_error, find_fix


def _samples(inputs: tuple, n: int = 3) -> list[tuple]:
    g = torch.Generator().manual_seed(5)
    return [tuple(inputs)] + [(torch.randn(inputs[0].shape, generator=g),) for _ in range(n - 1)]


def _run(pte: bytes, samples: list[tuple]) -> list[list[torch.Tensor]]:
    method = Runtime.get().load_program(pte).load_method("forward")
    return [method.execute(*s) for s in samples]


@pytest.mark.parametrize("threshold", [1, 2, 3, 5, 8, 13])
def test_search_order_finds_the_smallest_passing_prefix_in_few_steps(threshold):
    n = 13
    nxt = _search_order(n)
    done: dict[int, bool] = {}
    while (k := nxt(done)) is not None:
        assert k not in done and 1 <= k <= n
        done[k] = k >= threshold
    assert min(k for k, ok in done.items() if ok) == threshold
    assert len(done) <= 2 * math.ceil(math.log2(n)) + 1


def test_merge_overlapping_groups():
    assert _merge_overlapping([["a"], ["b"], ["a", "r"], ["c"]]) == [["a", "r"], ["b"], ["c"]]
    a, b, c = (ACTIVATION + n for n in "xyz")  # values: kept once, in their first group, never merged
    assert _merge_overlapping([[a, b], ["op"], [b, c], [b]]) == [[a, b], ["op"], [c]]


def test_final_error_against_numpy():
    a, b = torch.randn(7, generator=torch.Generator().manual_seed(0)), torch.randn(7)
    want = np.linalg.norm(b.double().numpy() - a.double().numpy()) / np.linalg.norm(a.double().numpy())
    assert final_error([a, a], [[b], [a]]) == pytest.approx(want, rel=1e-12)
    with pytest.raises(InspectorError, match="float elements"):
        final_error([a], [[b[:3]]])


def test_quantized_outlier_layer_is_kept_in_float_and_proven():
    model, inputs = get_model("mlp")
    with torch.no_grad():  # an outlier ruins fc2's per-tensor weight scale: the badly quantized layer
        model.fc2.weight.view(-1)[0] = 60 * model.fc2.weight.abs().max()
    samples = _samples(inputs)
    recipe = PortableRecipeType.INT8_STATIC_PER_TENSOR
    tol = 0.05
    lines: list[str] = []
    result = find_fix(model, samples, recipe, tol, progress=lines.append)
    assert result.mode == "quantization" and result.baseline.final_error > tol
    assert result.proven and 1 <= result.reexports <= 5
    assert "linear_1" in result.fix and not ({"linear", "linear_2"} & set(result.fix))  # fc2 = linear_1
    assert len(lines) == 2 + result.reexports  # baseline, candidates, one line per re-export
    # independent proof: export with the fix ourselves and compare with eager PyTorch in numpy
    ops = tuple(k for k in result.fix if not k.startswith(ACTIVATION))
    acts = tuple(k.removeprefix(ACTIVATION) for k in result.fix if k.startswith(ACTIVATION))
    session = export(model, samples, ExportRecipe.get_recipe(recipe, quant_exclude_nodes=ops,
                                                             quant_exclude_activations=acts))
    outs = _run(session.get_pte_buffer(), samples)
    with torch.no_grad():
        errs = []
        for s, o in zip(samples, outs):
            want = model(*s).double().numpy().ravel()
            errs.append(np.linalg.norm(o[0].double().numpy().ravel() - want) / np.linalg.norm(want))
    assert max(errs) <= tol
    assert max(errs) == pytest.approx(result.fix_step.final_error, rel=1e-6)
    frame = result.to_dataframe()
    assert list(frame["reexport"]) == list(range(len(frame)))
    assert (frame["size_bytes"] > 0).all() and (frame["latency_ms"] > 0).all()
    assert "proven" in result.summary()


def test_delegate_mode_keeps_ops_off_the_ort_delegate():
    """Float ORT program, a tolerance below ORT's own rounding: only running the matmuls on the portable kernels
    (ATen's, as the model) closes the gap; the fix's program has them outside the delegate."""
    model, inputs = get_model("mlp")
    samples = _samples(inputs, 2)
    cands = [["addmm"], ["addmm_1"], ["addmm_2"]]  # edge node names
    result = find_fix(model, samples, OrtRecipeType.FP32, 1e-30, candidates=cands)
    assert result.mode == "delegate"
    if result.baseline.within:  # this machine's ORT computes the MLP bit for bit as ATen: nothing to fix
        assert result.reexports == 0
        return
    assert result.proven and result.fix == ["addmm", "addmm_1", "addmm_2"] and result.reexports <= 5
    session = export(model, samples, ExportRecipe.get_recipe(OrtRecipeType.FP32, exclude_nodes=tuple(result.fix)))
    names = [i.name for i in Runtime.get().load_program(session.get_pte_buffer()).load_method("forward").instructions]
    assert sum(n.startswith("native_call_addmm") for n in names) == 3


def test_arguments_are_checked():
    model, inputs = get_model("mlp")
    with pytest.raises(InspectorError, match="tolerance"):
        find_fix(model, [inputs], PortableRecipeType.INT8_STATIC_PER_TENSOR, 0)
    with pytest.raises(InspectorError, match="max_reexports"):
        find_fix(model, [inputs], PortableRecipeType.INT8_STATIC_PER_TENSOR, 0.1, max_reexports=0)
    with pytest.raises(InspectorError, match="samples is empty"):
        find_fix(model, [], PortableRecipeType.INT8_STATIC_PER_TENSOR, 0.1)


def test_activation_outlier_is_fixed_by_keeping_activations_float_not_the_whole_mlp():
    """One channel of fc1's output shifted far beyond the others (fc2's bias cancels it: the same function) ruins
    the per-tensor scale of that activation: keeping values float is the small fix, the ops and weights stay INT8."""
    model, inputs = get_model("mlp")
    with torch.no_grad():
        d = 50 * float(torch.relu(model.fc1(inputs[0])).abs().max())
        model.fc1.bias[0] += d
        model.fc2.bias -= d * model.fc2.weight[:, 0]
    samples = _samples(inputs)
    recipe, tol = PortableRecipeType.INT8_STATIC_PER_TENSOR, 0.05
    result = find_fix(model, samples, recipe, tol)
    assert result.baseline.final_error > tol and result.proven and result.reexports <= 5
    acts = [k.removeprefix(ACTIVATION) for k in result.fix if k.startswith(ACTIVATION)]
    assert acts and len(acts) == len(result.fix)  # no op kept float: every weight stays INT8
    assert "relu" in acts  # the value with the outlier channel (fc1's output after its relu)
    assert result.fix_step.size_bytes <= 1.05 * result.baseline.size_bytes
    assert "activation(s)" in result.summary()
    # independent proof: the fix exported by hand, compared with eager PyTorch in numpy
    session = export(model, samples, ExportRecipe.get_recipe(recipe, quant_exclude_activations=tuple(acts)))
    outs = _run(session.get_pte_buffer(), samples)
    with torch.no_grad():
        errs = [np.linalg.norm(o[0].double().numpy().ravel() - model(*s).double().numpy().ravel())
                / np.linalg.norm(model(*s).double().numpy().ravel()) for s, o in zip(samples, outs)]
    assert max(errs) <= tol and max(errs) == pytest.approx(result.fix_step.final_error, rel=1e-6)
