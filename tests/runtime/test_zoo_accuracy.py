"""Every model of the zoo: runtime outputs equal eager outputs (portable backend), every method."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.utils._pytree as pytree

from edgetorch.exir import to_edge
from edgetorch.models import get_spec, list_models, method_module
from edgetorch.runtime import Runtime
from tests.conftest import max_rel_err

FAST = [n for n in list_models() if not get_spec(n).slow]
# llama_1b (4.4 GB of fp32 weights, its program as much again) runs in a process of its own (tests/_memory_guard.py)
SLOW = [pytest.param(n, marks=pytest.mark.large_model(max_rss_gb=6)) if n == "llama_1b" else n
        for n in list_models() if get_spec(n).slow]


def _check(name: str, folder) -> None:
    spec = get_spec(name)
    model = spec.build()
    inputs = spec.example_inputs()
    eps = {m: torch.export.export(method_module(model, m), inp) for m, inp in inputs.items()}
    path = str(folder / f"{name}.pte")
    to_edge(eps).to_executorch().save(path)  # streamed to the file: no second copy of the weights in memory
    del eps
    with torch.no_grad():  # eager first (the program starts from the state exported above), then free the model
        wants = {m: getattr(model, m)(*inp) for m, inp in inputs.items()}
    del model
    gc.collect()
    program = Runtime.get().load_program(path)  # memory-mapped: the weights are read in place
    assert program.method_names == set(inputs)
    for m, inp in inputs.items():
        got, want = program.load_method(m).execute_structured(*inp), wants[m]
        assert pytree.tree_structure(got) == pytree.tree_structure(want), (name, m)
        for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
            assert g.dtype == w.dtype and g.shape == w.shape
            if w.is_floating_point():
                assert max_rel_err(g, w) <= 1e-5, (name, m, max_rel_err(g, w))
            else:
                assert torch.equal(g, w), (name, m)


@pytest.mark.parametrize("name", FAST)
def test_zoo_model_matches_eager(name, tmp_path):
    _check(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_big_zoo_model_matches_eager(name, tmp_path):
    _check(name, tmp_path)


def test_repeated_runs_do_not_leak_state_between_inputs():
    model, inputs = get_spec("small_cnn").build(), get_spec("small_cnn").example_inputs()["forward"]
    m = Runtime.get().load_program(to_edge(torch.export.export(model, inputs)).to_executorch().buffer)
    method = m.load_method("forward")
    xs = [torch.randn_like(inputs[0]) for _ in range(3)]
    outs = [method.execute_structured(x) for x in xs]  # outputs are copies: later runs must not overwrite them
    for x, o in zip(xs, outs):
        torch.testing.assert_close(o, model(x).detach(), rtol=1e-5, atol=1e-6)
