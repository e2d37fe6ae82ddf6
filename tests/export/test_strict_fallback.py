"""Modules that reach their buffers through plain Python objects (a Hugging Face ``StaticCache``) through the export
API with the recipe's default ``strict=False``: non-strict ``torch.export`` would make those buffers constants
written in place (and ``to_edge`` fail deep in AOT autograd); the session exports them again with
``strict=True``, so the program's KV cache is a real mutable buffer (decode steps equal the eager model's), and
says what to do, with a typed error, when the strict export fails too."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from edgetorch.errors import ExportError
from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, export
from edgetorch.export._capture import export_method, frozen_state
from edgetorch.runtime import Runtime

STEPS = 3


class _Holder:
    """A plain Python object holding a tensor (as HF's StaticCache holds the cache tensors)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class Accumulate(nn.Module):
    """Adds each input into a buffer it reaches through ``_Holder``; returns twice the running sum."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4), persistent=False)
        self.holder = _Holder(self.total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.holder.t.add_(x)
        return self.holder.t * 2


@pytest.fixture(scope="module")
def hf_program():
    pytest.importorskip("transformers")
    from edgetorch.models import hf

    wrapper = hf.wrap_static_cache(hf.build_hf_llama(num_hidden_layers=1), max_cache_len=8)
    ids = torch.tensor([[3]])
    recipe = ExportRecipe.get_recipe(OrtRecipeType.FP32)
    assert recipe.strict is False  # the default the fallback is for
    session = export({"forward": wrapper}, {"forward": [(ids, torch.tensor([0]))]}, recipe)
    return wrapper, session.get_pte_buffer()


def test_a_hf_static_cache_model_exports_with_the_default_recipe_and_decodes_like_eager(hf_program):
    wrapper, pte = hf_program
    tokens = [3, 17, 250]
    method = Runtime.get().load_program(pte).load_method("forward")
    wrapper.reset_cache()
    with torch.no_grad():
        for pos, tok in enumerate(tokens[:STEPS]):
            args = (torch.tensor([[tok]]), torch.tensor([pos]))
            want = wrapper(*args)
            got = method.execute(*args)[0]
            # the cache is the program's mutable buffer: a frozen copy would give other logits from step 2 on
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_frozen_state_names_the_constants_and_the_session_re_exports_strict(caplog):
    model = Accumulate()
    x = torch.ones(4)
    ep = torch.export.export(model, (x,), strict=False)
    assert set(frozen_state(ep, model).values()) == {"total"}
    with caplog.at_level(logging.WARNING, logger="edgetorch.export._capture"):
        session = export(model, [(x,)], ExportRecipe.get_recipe(PortableRecipeType.FP32))
    assert "strict=True" in caplog.text and "total" in caplog.text
    method = Runtime.get().load_program(session.get_pte_buffer()).load_method("forward")
    outs = [method.execute(torch.full((4,), float(k)))[0] for k in (1, 2, 3)]
    assert [o[0].item() for o in outs] == [2.0, 6.0, 12.0]  # 2 * (1), 2 * (1 + 2), 2 * (1 + 2 + 3)


def test_a_module_without_aliased_state_is_exported_once(monkeypatch):
    calls = []
    real = torch.export.export

    def counting(*a, **k):
        calls.append(k.get("strict"))
        return real(*a, **k)

    monkeypatch.setattr(torch.export, "export", counting)
    export_method(nn.Linear(4, 4), (torch.ones(1, 4),))
    assert calls == [False]


def test_a_failing_strict_export_says_what_to_do(monkeypatch):
    real = torch.export.export

    def strict_fails(*a, **k):
        if k.get("strict"):
            raise RuntimeError("dynamo cannot trace this")
        return real(*a, **k)

    monkeypatch.setattr(torch.export, "export", strict_fails)
    with pytest.raises(ExportError, match=r"method 'forward'.*\['total'\].*constants.*strict.*dynamo cannot trace"):
        export_method(Accumulate(), (torch.ones(4),))
