"""edgetorch.exir.quant_annotations: the one source of the quantizer's annotation tables and of the PT2E numeric
debug handle key, read by the export side and the developer tools alike."""

from __future__ import annotations

import torch
from torchao.quantization.pt2e import CUSTOM_KEY, NUMERIC_DEBUG_HANDLE_KEY

from edgetorch.exir import quant_annotations as qa
from edgetorch.export import quantizer


def test_the_keys_are_torchaos():
    assert (qa.CUSTOM_KEY, qa.NUMERIC_DEBUG_HANDLE_KEY) == (CUSTOM_KEY, NUMERIC_DEBUG_HANDLE_KEY)


def test_the_export_side_reads_the_same_tables():
    for name in ("ANNOTATED_OPS", "WEIGHTED_OPS", "FUSED_ACTIVATION_OPS", "float_handle", "module_paths",
                 "float_handles_as_debug_handles"):
        assert getattr(quantizer, name) is getattr(qa, name), name
    assert qa.WEIGHTED_OPS | qa.FUSED_ACTIVATION_OPS <= qa.ANNOTATED_OPS


def test_float_handles_of_a_captured_program_become_debug_handles():
    from edgetorch.exir.debug_handles import get_debug_handle

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 3, 3)

        def forward(self, x):
            return torch.relu(self.conv(x))

    ep = quantizer.capture_float_program(M(), (torch.randn(1, 2, 8, 8),))
    ops = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert {n.target for n in ops} <= qa.ANNOTATED_OPS
    handles = [qa.float_handle(n) for n in ops]
    assert all(isinstance(h, int) for h in handles) and len(set(handles)) == len(ops)
    assert qa.float_handles_as_debug_handles(ep) == len(ops)
    assert [get_debug_handle(n) for n in ops] == handles
    assert any("conv" in p for p in qa.module_paths(ops[0]))
