"""What ``execute`` takes and returns: the reference's flat lists, the model's own structure on request,
keyword inputs in any order, and non-tensor inputs (specialised constants checked on every call)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import OrderedDict

import pytest
import torch

from edgetorch.errors import RuntimeInputError
from edgetorch.exir import to_edge
from edgetorch.runtime import Runtime
from edgetorch.runtime.method import ValueInfo


class Flags(torch.nn.Module):
    """Keyword inputs, a bool flag, an int, a float and None, and a dict output."""

    def forward(self, x, mask=None, *, use_cache: bool = True, scale: float = 1.0, n: int = 2, extra=None):
        y = x * scale
        if mask is not None:
            y = y.masked_fill(~mask, 0.0)
        if use_cache:
            y = y + 1
        return OrderedDict(hidden=y * n, pooled=(y.sum(-1), y.amax(-1)))


def _program(**kwargs):
    x, mask = torch.randn(2, 5), torch.rand(2, 5) > 0.3
    ep = torch.export.export(Flags(), (x,), {"mask": mask, **kwargs})
    return Runtime.get().load_program(to_edge(ep).to_executorch().buffer).load_method("forward"), x, mask


def test_execute_returns_a_flat_list_and_call_returns_the_model_structure():
    kw = dict(use_cache=False, scale=0.5, n=3, extra=None)
    method, x, mask = _program(**kw)
    want = Flags()(x, mask=mask, **kw)
    flat = method.execute(x, mask=mask, **kw)
    assert isinstance(flat, list) and len(flat) == 3
    for got, w in zip(flat, [want["hidden"], *want["pooled"]]):
        torch.testing.assert_close(got, w)
    structured = method(x, mask=mask, **kw)
    assert isinstance(structured, OrderedDict) and list(structured) == ["hidden", "pooled"]
    torch.testing.assert_close(structured["pooled"][1], want["pooled"][1])


def test_flat_input_sequence_and_keywords_in_any_order():
    kw = dict(use_cache=False, scale=0.5, n=3, extra=None)
    method, x, mask = _program(**kw)
    ref = method.execute(x, mask=mask, **kw)
    names = method.metadata.input_names
    assert names[:2] == ["x", "mask"] and set(names[2:]) == {"use_cache", "scale", "n", "extra"}
    by_name = {"x": x, "mask": mask, **kw}
    for got in (method.execute([by_name[n] for n in names]),  # the reference's flat sequence
                method.execute(x, extra=None, n=3, mask=mask, scale=0.5, use_cache=False)):
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
    infos = {i.name: i for i in method.metadata.inputs}
    assert infos["use_cache"] == ValueInfo("use_cache", False) and infos["scale"].value == 0.5


@pytest.mark.parametrize("name,value,shown", [("use_cache", True, "False"), ("n", 4, "3"), ("scale", 0.25, "0.5"),
                                              ("n", 3.0, "3"), ("extra", 1, "None")])
def test_a_value_other_than_the_exported_one_is_refused_naming_the_input(name, value, shown):
    kw = dict(use_cache=False, scale=0.5, n=3, extra=None)
    method, x, mask = _program(**kw)
    with pytest.raises(RuntimeInputError, match=f"input '{name}' was exported as {shown} .* got {value!r}"):
        method.execute(x, mask=mask, **{**kw, name: value})


def test_wrong_number_of_inputs_names_what_is_expected():
    method, x, mask = _program(use_cache=False)
    with pytest.raises(RuntimeInputError, match=r"expects \d+ input\(s\) \['x', 'mask'"):
        method.execute(x)


def test_a_program_runs_without_the_classes_of_its_output_structure(tmp_path):
    """An output structure naming a class the running process never imported: flat outputs work, the
    structured call explains what to import; loading imports nothing."""
    script = textwrap.dedent("""
        import dataclasses, sys, torch, torch.utils._pytree as pytree
        from edgetorch.exir import to_edge

        @dataclasses.dataclass
        class Out:
            a: torch.Tensor
            b: torch.Tensor
        pytree.register_dataclass(Out, serialized_type_name="mypkg.outputs.Out")

        class M(torch.nn.Module):
            def forward(self, x):
                return Out(x + 1, x * 2)
        to_edge(torch.export.export(M(), (torch.ones(3),))).to_executorch().save(sys.argv[1])
    """)
    pte = tmp_path / "out.pte"
    r = subprocess.run([sys.executable, "-c", script, str(pte)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    method = Runtime.get().load_program(pte).load_method("forward")
    a, b = method.execute(torch.ones(3))
    assert torch.equal(a, torch.full((3,), 2.0)) and torch.equal(b, torch.full((3,), 2.0))
    with pytest.raises(RuntimeInputError, match="structured as mypkg.outputs.Out, which is not registered"):
        method(torch.ones(3))
    assert "mypkg" not in sys.modules
