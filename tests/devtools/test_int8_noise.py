"""The noise model knows integer kernels: clean INT8 programs (portable and ONNX Runtime, per tensor and per
channel) compared against their own fake-quant graph name no culprit (a requantization one step of the value's
grid away, and the observer effect of the debug session's own Q/DQ fusion, are noise), while a planted fault (an
INT8 weight perturbed by several steps inside the .pte) is still named first, at an op that reads that weight.
The planted weights, their readers and the steps are read from this machine's program, never assumed."""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import pytest
import torch

from edgetorch.devtools.inspector.noise import quant_step, step_floor
from edgetorch.export import ExportRecipe
from edgetorch.export import export as session_export
from edgetorch.export.recipes_onnxruntime import OrtRecipeType
from edgetorch.export.recipes_portable import PortableRecipeType
from edgetorch.models import get_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_culprits", os.path.join(ROOT, "bench", "bench_culprits.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_culprits"] = mod
    spec.loader.exec_module(mod)
    return mod


B = _bench()
RECIPES = {"ort_pt": OrtRecipeType.INT8_STATIC_PER_TENSOR, "ort_pc": OrtRecipeType.INT8_STATIC_PER_CHANNEL,
           "portable_pt": PortableRecipeType.INT8_STATIC_PER_TENSOR}


def _program(family: str, recipe: str):
    model, inputs = get_model(family)
    g = torch.Generator().manual_seed(0)
    samples = [inputs] + [tuple(torch.randn(t.shape, generator=g) if t.is_floating_point() else t for t in inputs)
                          for _ in range(3)]
    et = session_export(model, samples, ExportRecipe.get_recipe(RECIPES[recipe]),
                        generate_etrecord=True).get_executorch_program_manager()
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    return types.SimpleNamespace(inputs=inputs, record=rec, pte=bytes(et.buffer), et=et)


def _int8_weights(prog) -> list[tuple[torch.Tensor, set[str]]]:
    """(int8 weight, the names of the reference ops that read it: its dequantize and that one's users) of every
    INT8 weight (a ``get_attr`` of the reference graph) whose bytes occur once in the .pte."""
    gm = prog.record.reference_graph("forward")
    out = []
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        obj = gm
        for part in str(n.target).split("."):
            obj = getattr(obj, part, None)
        if not isinstance(obj, torch.Tensor) or obj.dtype != torch.int8 or obj.dim() < 2:
            continue
        if B._find_once(prog.pte, obj) is None:
            continue
        out.append((obj.detach().contiguous(), {u.name for u in n.users} | {x.name for u in n.users for x in u.users}))
    return out


def _perturb(prog, w: torch.Tensor, steps: int) -> bytes:
    data = bytearray(prog.pte)
    at = B._find_once(prog.pte, w)
    new = w.clone().reshape(-1)
    new[::3] = (new[::3].to(torch.int16) + steps).clamp(-127, 127).to(torch.int8)
    data[at:at + w.numel()] = new.numpy().tobytes()
    B._reseal_ort_blobs(data)
    return bytes(data)


def dequantize_per_tensor(*args):  # a stand-in target: the noise model reads the op's name and its scale
    raise NotImplementedError


def test_quant_step_and_step_floor_against_hand_computation():
    x = torch.fx.symbolic_trace(torch.nn.Identity()).graph  # a graph to hang nodes on
    a = x.create_node("call_function", dequantize_per_tensor, (None, 0.05, 0, -127, 127, torch.int8))
    assert quant_step(a) == 0.05
    ref = torch.tensor([1.0, 2.0, 2.0])
    extra, _ = step_floor(0.05, ref, ref)
    assert extra == pytest.approx(0.05 * 3 ** 0.5 / 3.0)
    assert step_floor(1.0, torch.tensor([3, 4], dtype=torch.int8), torch.tensor([4, 4], dtype=torch.int8))[1]
    assert not step_floor(1.0, torch.tensor([3, 4], dtype=torch.int8), torch.tensor([5, 4], dtype=torch.int8))[1]


@pytest.mark.parametrize("family,recipe", [("mlp", "ort_pt"), ("mlp", "ort_pc"), ("small_cnn", "ort_pt"),
                                           ("small_cnn", "ort_pc"), ("transformer_encoder", "ort_pt"),
                                           ("small_cnn", "portable_pt")])
def test_clean_int8_programs_name_no_culprit_and_planted_weight_is_first(family, recipe):
    prog = _program(family, recipe)
    insp, df = B.debug_run(prog, prog.pte)
    assert insp.find_culprits(df, top=100).empty, df[["aot_ops", "local_rel_error", "noise_floor", "verdict"]]
    if family == "transformer_encoder":
        return  # the clean case only (its weights are many; mlp and small_cnn cover the plants)
    weights = _int8_weights(prog)
    assert weights
    for w, readers in weights[:2]:
        insp, df = B.debug_run(prog, _perturb(prog, w, 8))
        cul = insp.find_culprits(df, top=3)
        assert len(cul) >= 1
        assert set(cul.iloc[0]["aot_ops"]) & readers, (readers, cul[["aot_ops", "local_rel_error", "noise_floor"]])
