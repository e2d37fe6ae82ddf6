"""Any argument name a module uses works everywhere: built-in modules whose ``forward`` argument is named ``input``
(which a graph copy, and torch's deepcopy of an ExportedProgram, rename to ``input_1`` but not in the signature)
lower to the portable backend and to ONNX Runtime, go through the reference's ``deepcopy(edge)`` +
``generate_etrecord`` flow and ``deepcopy(edge).to_executorch()``, run equal to eager and name no culprit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from edgetorch.devtools import Inspector
from edgetorch.devtools.etrecord import generate_etrecord
from edgetorch.exir import to_edge, to_edge_transform_and_lower
from edgetorch.runtime import Runtime

MODULES = {
    "linear": lambda: nn.Linear(4, 3),
    "sequential": lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)),
    "layer_norm": lambda: nn.LayerNorm(4),
    "gelu_softmax": lambda: nn.Sequential(nn.GELU(), nn.Softmax(dim=-1)),
}


@pytest.mark.parametrize("backend", ["portable", "onnxruntime"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_forward_argument_named_input(name, backend, tmp_path):
    torch.manual_seed(0)
    model, x = MODULES[name]().eval(), torch.randn(2, 4)
    ep = torch.export.export(model, (x,))
    assert "input" in [n.name for n in ep.graph.nodes if n.op == "placeholder"]
    parts = None
    if backend == "onnxruntime":
        from edgetorch.backends.onnxruntime import OrtPartitioner

        parts = [OrtPartitioner()]
    edge = to_edge(ep, generate_etrecord=True)
    edge_copy = copy.deepcopy(edge)  # the reference's flow: a copy for the record, the original lowered
    lowered = edge.to_backend(parts[0]) if parts else edge
    et = lowered.to_executorch()
    generate_etrecord(tmp_path / "rec.bin", edge_copy, et)
    et_of_copy = copy.deepcopy(lowered).to_executorch()
    et_lowered_copy = copy.deepcopy(to_edge_transform_and_lower(ep, partitioner=parts)).to_executorch()
    with torch.no_grad():
        want = model(x)
    for program in (et, et_of_copy, et_lowered_copy):
        (got,) = Runtime.get().load_program(program.buffer).load_method("forward").execute(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    rec = et.get_etrecord()
    rec.update_representative_inputs((x,))
    rec.save(tmp_path / "own.bin")
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(x)
    prog.write_etdump_result_to_file(tmp_path / "e.etdp", tmp_path / "e.bin")
    for record in ("own.bin", "rec.bin"):
        insp = Inspector(etdump_path=tmp_path / "e.etdp", etrecord=tmp_path / record,
                         debug_buffer_path=tmp_path / "e.bin")
        df = insp.calculate_numeric_gap("MSE", inputs=(x,))
        assert len(df) >= 1 and insp.find_culprits(df).empty
        torch.testing.assert_close(df.iloc[-1]["aot_intermediate_output"].reshape(want.shape), want)
