"""The reference's ``ExecutorchBackendConfig`` layout fields (issue 26): values edgetorch's program already meets
are accepted and the file shows it; values it cannot honour are refused, typed, naming the field."""

from __future__ import annotations

import pytest
import torch

from edgetorch.errors import ExportError
from edgetorch.exir import ExecutorchBackendConfig, to_edge
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 5), torch.nn.Linear(5, 7)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)).view(2, 5).permute(1, 0).permute(1, 0))


def test_accepted_values_give_a_program_that_meets_them():
    config = ExecutorchBackendConfig(segment_alignment=64, constant_tensor_alignment=16, delegate_alignment=None,
                                     remove_view_copy=True, enable_non_cpu_memory_planning=False)
    x = torch.randn(2, 3)
    model = _Net().eval()
    et = to_edge(torch.export.export(model, (x,))).to_executorch(config)
    header = pf.read_header(et.buffer)
    # every constant starts on a 64-byte boundary of the file: what any alignment dividing 64 asks
    assert header.segment_offset % 64 == 0 and et.program.constants
    assert all((header.segment_offset + off) % 64 == 0 for off, _ in et.program.constants)
    # the views are load-time aliases: no instruction copies them
    plan = et.program.plans[0]
    views = [i for i in plan.instructions if plan.operators[i.call.op_index].name in ("aten::view", "aten::permute")]
    assert views and all(i.call.kind == pf.CALL_VIEW for i in views)
    out = Runtime.get().load_program(et.buffer).load_method("forward").execute(x)[0]
    torch.testing.assert_close(out, model(x))


@pytest.mark.parametrize("field,value,match", [
    ("segment_alignment", 4096, "64-byte boundary"), ("constant_tensor_alignment", 24, "power of two"),
    ("delegate_alignment", 128, "cannot honour"), ("remove_view_copy", False, "alias"),
    ("external_constants", True, ".ptd"), ("external_constants", lambda node: "w", "True or False"),
    ("external_mutable_weights", True, ".ptd"), ("enable_non_cpu_memory_planning", "yes", "True or False"),
])
def test_values_that_cannot_be_honoured_are_refused_naming_the_field(field, value, match):
    with pytest.raises(ExportError, match=match) as err:
        ExecutorchBackendConfig(**{field: value})
    assert f"ExecutorchBackendConfig.{field}" in str(err.value)
