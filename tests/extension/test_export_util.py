"""``edgetorch.extension.export_util.utils`` and the names the reference's example scripts import (issue 26):
``export_to_exec_prog`` + a bundled program of its methods, ``export_to_edge`` + ``generate_etrecord``, as
``examples/devtools/scripts/{export_bundled_program,gen_sample_etrecord}.py`` do with the import swap only."""

from __future__ import annotations

import copy

import pytest
import torch

from edgetorch.devtools import BundledProgram, generate_etrecord
from edgetorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
from edgetorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.exir import EdgeCompileConfig, ExportedProgram
from edgetorch.exir.backend.compile_spec_schema import CompileSpec
from edgetorch.extension.export_util.utils import export_to_edge, export_to_exec_prog, save_pte_program
from edgetorch.formats.bundled_program import read_bundle, tensor_to_torch
from edgetorch.runtime import Runtime


class AddMul(torch.nn.Module):
    def forward(self, a: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, x) + b


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    return tuple(torch.randn(2, 2, generator=g) for _ in range(3))


def test_export_to_exec_prog_runs_and_bundles(tmp_path):
    model, inputs = AddMul(), _inputs()
    prog = export_to_exec_prog(model, inputs)
    names = [plan.name for plan in prog.executorch_program.execution_plan]
    assert names == ["forward"]
    path = save_pte_program(prog, "add_mul", str(tmp_path))
    assert path == str(tmp_path / "add_mul.pte")
    (out,) = Runtime.get().load_program(path).load_method("forward").execute(*inputs)
    torch.testing.assert_close(out, model(*inputs), rtol=0, atol=0)
    suites = [MethodTestSuite(method_name="forward", test_cases=[
        MethodTestCase(inputs=inputs, expected_outputs=model(*inputs))])]
    data = serialize_from_bundled_program_to_flatbuffer(BundledProgram(prog, suites))
    bundle = read_bundle(data)
    (case,) = bundle.suite("forward").test_cases
    assert len(case.inputs) == 3 and len(case.expected_outputs) == 1
    torch.testing.assert_close(tensor_to_torch(case.expected_outputs[0]), model(*inputs), rtol=0, atol=0)


def test_export_to_edge_feeds_generate_etrecord(tmp_path):
    model, inputs = AddMul(), _inputs()
    aten: ExportedProgram = torch.export.export(model, inputs, strict=True)
    edge = export_to_edge(model, inputs, edge_compile_config=EdgeCompileConfig(_check_ir_validity=True))
    et = copy.deepcopy(edge).to_executorch()
    generate_etrecord(tmp_path / "etrecord.bin", edge_dialect_program=edge, executorch_program=et,
                      extra_recorded_export_modules={"aten_dialect_output": aten})
    rec = parse_etrecord(tmp_path / "etrecord.bin")
    assert list(rec.edge_programs) == ["forward"]
    assert "aten_dialect_output/forward" in rec.graph_map


def test_bad_model_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="got int"):
        export_to_exec_prog(3, _inputs())


def test_compile_spec_is_the_partitioners():
    from edgetorch.exir.backend.partitioner import CompileSpec as Defined

    assert CompileSpec is Defined
    assert CompileSpec("k", b"v").value == b"v"
