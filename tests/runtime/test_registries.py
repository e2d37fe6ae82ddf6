"""``Runtime.operator_registry`` / ``Runtime.backend_registry`` (issue 26): the operator names are exactly what the
runtime resolves (allow-list + user-registered ops), and the backends those whose runtime loads."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from edgetorch.errors import OperatorNotAllowedError
from edgetorch.exir import to_edge
from edgetorch.formats.operators import ZERO_FILLED_ALLOCATIONS
from edgetorch.runtime import Runtime
from edgetorch.runtime.ops import register_operator, resolve_operator, unregister_operator


@torch.library.custom_op("edgetorch_h6test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _split(name: str) -> tuple[str, str]:
    op, _, overload = name.rpartition(".")
    return op, overload


def test_every_listed_operator_resolves_and_an_unlisted_one_is_refused():
    registry = Runtime.get().operator_registry
    names = registry.operator_names
    assert isinstance(names, set) and {"aten::add.out", "aten::relu.default", "aten::addmm.out"} <= names
    # the allocations are never run as such (the runtime zero-fills their output), so they need no kernel
    assert ZERO_FILLED_ALLOCATIONS <= names
    for name in sorted(n for n in names - ZERO_FILLED_ALLOCATIONS if not n.startswith("torchao::")):
        assert callable(resolve_operator(*_split(name))), name  # (torchao's import is slow)
    for outside in ("aten::from_file.default", "aten::save.default", "aten::resize_.default"):
        assert outside not in names and not registry.has_operator(outside)
        with pytest.raises(OperatorNotAllowedError):
            resolve_operator(*_split(outside))
    assert any(n.startswith("torchao::") for n in names) == (importlib.util.find_spec("torchao") is not None)


def test_has_operator_reads_a_name_without_overload_as_default_and_refuses_a_non_name():
    registry = Runtime.get().operator_registry
    assert registry.has_operator("aten::relu") and "aten::relu.default" in registry
    assert not registry.has_operator("aten::relu.no_such_overload") and "relu" not in registry
    with pytest.raises(TypeError, match="namespace::name"):
        registry.has_operator("relu")


def test_a_user_registered_operator_is_listed_until_unregistered():
    op = torch.ops.edgetorch_h6test.twice.default
    registry = Runtime.get().operator_registry
    assert not registry.has_operator("edgetorch_h6test::twice")
    register_operator(op)
    try:
        assert "edgetorch_h6test::twice.default" in registry.operator_names
        assert resolve_operator("edgetorch_h6test::twice", "default") is op
    finally:
        unregister_operator(op)
    assert "edgetorch_h6test::twice.default" not in registry.operator_names


def test_a_programs_operators_are_all_registered():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2)).eval()
    et = to_edge(torch.export.export(model, (torch.randn(1, 3, 8, 8),))).to_executorch()
    used = {f"{o.name}.{o.overload or 'default'}" for p in et.program.plans for o in p.operators}
    assert used and used <= Runtime.get().operator_registry.operator_names


def test_backend_registry_names_the_backends_whose_runtime_loads():
    registry = Runtime.get().backend_registry
    has_ort = importlib.util.find_spec("onnxruntime") is not None
    assert ("onnxruntime" in registry.registered_backend_names) == has_ort
    assert registry.is_available("onnxruntime") == has_ort
    assert not registry.is_available("XnnpackBackend")
