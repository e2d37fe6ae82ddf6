"""PT2E INT8 recipes on the portable backend: accuracy vs the float eager model and vs the fake-quantized
reference, Q/DQ ops present, and the quantized .pte running in a fresh process that never imports the compiler.

Stated tolerances (measured values, 4 random inputs, noted per model in the comments):
  * vs the float eager model: relative max error (max|q - f| / max|f|) <= 0.1 and cosine similarity >= 0.995;
  * vs the fake-quantized reference (the converted PT2E GraphModule run in eager PyTorch): relative max error
    <= 1e-5 (the runtime runs the same Q/DQ and float kernels; measured 0).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from edgetorch.export import ExportRecipe, PortableRecipeType, StageType, export
from edgetorch.models import get_spec

P = PortableRecipeType
REL_MAX_VS_EAGER = 0.1
COSINE_MIN_VS_EAGER = 0.995
REL_MAX_VS_FAKE_QUANT = 1e-5
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _samples(x: tuple, n: int, seed: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    if x[0].dtype == torch.int64:  # token ids
        return [(torch.randint(0, 1000, x[0].shape, generator=g),) for _ in range(n)]
    return [(torch.randn(x[0].shape, generator=g),) for _ in range(n)]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()


def _cos(got: torch.Tensor, want: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0).item()


_CACHE: dict = {}  # one quantized session per (model, recipe), shared by this module's tests, freed after it


@pytest.fixture(autouse=True, scope="module")
def _release_sessions():
    yield
    _CACHE.clear()


def _quantized(name: str, recipe_type: PortableRecipeType, n_calibration: int = 4):
    key = (name, recipe_type, n_calibration)
    if key not in _CACHE:
        spec = get_spec(name)
        model, x = spec.build(), spec.example_inputs()["forward"]
        session = export(model, [x] + _samples(x, n_calibration - 1, 1), ExportRecipe.get_recipe(recipe_type))
        _CACHE[key] = model, x, session
    return _CACHE[key]


def _check(name: str, recipe_type: PortableRecipeType, n_calibration: int = 4) -> None:
    model, x, session = _quantized(name, recipe_type, n_calibration)
    edge = session.get_edge_program_manager().exported_program()
    targets = [str(n.target) for n in edge.graph.nodes if n.op == "call_function"]
    assert any(t.startswith("quantized_decomposed.quantize_per_tensor") for t in targets)
    per_channel = any(t.startswith("quantized_decomposed.dequantize_per_channel") for t in targets)
    assert per_channel == (recipe_type != P.INT8_STATIC_PER_TENSOR)
    dynamic = any(t.startswith("quantized_decomposed.choose_qparams") for t in targets)
    assert dynamic == (recipe_type == P.INT8_DYNAMIC_PER_CHANNEL)
    fake_quant = session.get_stage_artifacts()[StageType.QUANTIZE].data["forward"]
    with torch.no_grad():
        for sample in _samples(x, 4, 2):
            got = session.run_method("forward", sample)[0]
            want = model(*sample)
            assert _rel(got, want) <= REL_MAX_VS_EAGER, (name, recipe_type, _rel(got, want))
            assert _cos(got, want) >= COSINE_MIN_VS_EAGER, (name, recipe_type, _cos(got, want))
            assert _rel(got, fake_quant(*sample)) <= REL_MAX_VS_FAKE_QUANT


# small_cnn measured: rel max 0.011 / 0.015 / 0.009, cosine >= 0.99994 (static pc / static pt / dynamic pc)
@pytest.mark.parametrize("recipe_type", [P.INT8_STATIC_PER_CHANNEL, P.INT8_STATIC_PER_TENSOR,
                                         P.INT8_DYNAMIC_PER_CHANNEL], ids=lambda t: t.name)
def test_small_cnn_int8(recipe_type):
    _check("small_cnn", recipe_type)


# transformer_encoder measured: rel max 0.032 / 0.032 / 0.009, cosine >= 0.9996 (static pc / static pt / dynamic)
def test_transformer_encoder_int8_static_per_channel():
    _check("transformer_encoder", P.INT8_STATIC_PER_CHANNEL)


@pytest.mark.slow
@pytest.mark.parametrize("recipe_type", [P.INT8_STATIC_PER_TENSOR, P.INT8_DYNAMIC_PER_CHANNEL], ids=lambda t: t.name)
def test_transformer_encoder_int8_other(recipe_type):
    _check("transformer_encoder", recipe_type)


# resnet18 measured with 8 calibration inputs: rel max 0.027 / 0.047 / 0.018, cosine >= 0.9994 (static pc / static
# pt / dynamic pc). Each recipe's code path runs on small_cnn (convolutions, batch norm, linear) and on
# transformer_encoder above; resnet18 adds depth and residual adds (a quantized add of two quantized branches),
# checked once (test time: ~40 s a recipe on 2 cores) with the recipe whose error comes closest to the bound.
@pytest.mark.slow
@pytest.mark.parametrize("recipe_type", [P.INT8_STATIC_PER_TENSOR], ids=lambda t: t.name)
def test_resnet18_int8(recipe_type):
    _check("resnet18", recipe_type, n_calibration=8)


_FRESH = textwrap.dedent("""
    import sys
    import torch
    from edgetorch.runtime import Runtime
    out = {}
    for i, (pte, inp) in enumerate(zip(sys.argv[1::2], sys.argv[2::2])):
        x = torch.load(inp, weights_only=True)
        out[i] = Runtime.get().load_program(pte).load_method("forward").execute_structured(*x)
    leaked = [m for m in sys.modules if m.startswith(("edgetorch.exir", "edgetorch.export", "torchao"))]
    assert not leaked, leaked
    torch.save(out, sys.argv[-1] if len(sys.argv) % 2 == 0 else "/dev/null")
""")


def test_int8_programs_run_in_a_fresh_process(tmp_path):
    """The runtime resolves quantized_decomposed ops (static Q/DQ and dynamic choose_qparams) on its own."""
    args, want = [], []
    for name, rt in (("small_cnn", P.INT8_STATIC_PER_CHANNEL), ("small_cnn", P.INT8_DYNAMIC_PER_CHANNEL),
                     ("transformer_encoder", P.INT8_STATIC_PER_CHANNEL)):
        _, x, session = _quantized(name, rt)
        sample = _samples(x, 1, 3)[0]
        pte = str(tmp_path / f"{name}_{rt.name}.pte")
        inp = str(tmp_path / f"{name}_{rt.name}.in")
        session.save_to_pte(pte)
        torch.save(sample, inp)
        args += [pte, inp]
        want.append(session.run_method("forward", sample)[0])
    outputs = str(tmp_path / "outputs.pt")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run([sys.executable, "-c", _FRESH, *args, outputs], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(outputs, weights_only=True)
    for i, w in enumerate(want):
        torch.testing.assert_close(got[i], w, rtol=0, atol=0)
