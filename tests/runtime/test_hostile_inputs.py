"""Inputs the runtime cannot take are refused by name, before anything is copied (issue 23)."""

from __future__ import annotations

import pytest
import torch

from edgetorch.errors import RuntimeInputError
from edgetorch.models import get_model
from edgetorch.runtime import Runtime
from tests.conftest import lower


@pytest.fixture(scope="module")
def mlp():
    model, inputs = get_model("mlp")
    return Runtime.get().load_program(lower(model, inputs).buffer).load_method("forward"), model, inputs


def test_an_unknown_keyword_is_refused_naming_the_expected_inputs(mlp):
    method, model, (x,) = mlp
    with pytest.raises(RuntimeInputError, match=r"no input named \['y'\]; it takes \['x'\]"):
        method.execute(y=x)
    with pytest.raises(RuntimeInputError, match=r"'x' is given both by position and by name"):
        method.execute(x, x=x)
    (out,) = method.execute(x=x)  # the right name binds by name
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)


def test_keywords_bind_by_name_not_position():
    """A two-input model called with its inputs by name in the other order computes what eager computes."""
    class Sub(torch.nn.Module):
        def forward(self, a, b):
            return a - 2 * b

    a, b = torch.randn(3), torch.randn(3)
    method = Runtime.get().load_program(lower(Sub(), (a, b)).buffer).load_method("forward")
    (out,) = method.execute(b=b, a=a)
    torch.testing.assert_close(out, a - 2 * b, rtol=0, atol=0)
    with pytest.raises(RuntimeInputError, match=r"missing \['b'\]"):
        method.execute(a=a)


@pytest.mark.parametrize("make,match", [
    (lambda x: x.to_sparse(), "sparse_coo tensor"),
    (lambda x: x.to_sparse_csr(), "sparse_csr tensor"),
    (lambda x: torch.nested.nested_tensor([x[0], x[0]]), "nested tensor"),
])
def test_sparse_and_nested_inputs_are_refused(mlp, make, match):
    method, _, (x,) = mlp
    with pytest.raises(RuntimeInputError, match=rf"input 'x' is a {match}"):
        method.execute(make(x))


def test_an_input_without_storage_is_refused(mlp):
    method, _, (x,) = mlp
    y = x.clone()
    y.untyped_storage().resize_(0)  # shape (1, 64), 0 bytes behind it
    with pytest.raises(RuntimeInputError, match=r"input 'x' addresses 256 bytes but its storage holds 0"):
        method.execute(y)
