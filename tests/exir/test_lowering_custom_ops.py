"""Lowering a program whose graph keeps an op no backend takes (a Hugging Face custom op) and an op without users
that ``legalize_graph`` would place after the output (issue 24: Qwen2-MoE on ONNX Runtime died with
"last node must be output")."""

from __future__ import annotations

import pytest
import torch

from edgetorch.errors import OperatorNotAllowedError
from edgetorch.exir.backend.lowering import _output_last


def test_nodes_after_the_output_move_before_it() -> None:
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    graph = gm.graph
    x = next(n for n in graph.nodes if n.op == "placeholder")
    out = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_after(out):
        dead = graph.call_function(torch.ops.aten.bitwise_and.Tensor, (x, x))
    assert list(graph.nodes)[-1] is dead
    _output_last(gm)
    assert list(graph.nodes)[-1] is out and dead in list(graph.nodes)
    graph.lint()


@pytest.mark.slow
def test_qwen2_moe_lowers_to_ort_and_its_custom_op_is_named_at_load() -> None:
    transformers = pytest.importorskip("transformers")
    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.runtime import Runtime
    from edgetorch.runtime.ops import register_operator, unregister_operator

    class Logits(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(ids, use_cache=False, return_dict=False)[0]

    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64)
    model = Logits(transformers.Qwen2MoeForCausalLM(cfg)).eval()
    ids = (torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1)),)
    aten = torch.export.export(model, ids)
    custom = [n.target for n in aten.graph.nodes if n.op == "call_function" and "transformers" in str(n.target)]
    et = to_edge_transform_and_lower(aten, partitioner=[OrtPartitioner()]).to_executorch()
    if not custom:  # this transformers version computes its experts with ATen ops only
        (out,) = Runtime.get().load_program(et.buffer).load_method("forward").execute(*ids)
    else:  # the custom op stayed off the delegate; the runtime names it until the user allows it
        with pytest.raises(OperatorNotAllowedError, match=str(custom[0]).rsplit(".", 1)[0].replace(".", "::", 1)):
            Runtime.get().load_program(et.buffer).load_method("forward")
        for op in set(custom):
            register_operator(op)
        try:
            (out,) = Runtime.get().load_program(et.buffer).load_method("forward").execute(*ids)
        finally:
            for op in set(custom):
                unregister_operator(op)
    with torch.no_grad():
        want = model(*ids)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
