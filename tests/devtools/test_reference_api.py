"""Issue 26: the public API the reference ExecuTorch's users call first, on edgetorch (comparator contract,
built-in comparators on Python numbers and mismatched shapes, Inspector.get_op_list and save_data_to_tsv's
keywords, generate_etrecord's current signature, ExecutorchProgramManager.dump_executorch_program)."""

from __future__ import annotations

import io
import math

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector.comparators import (
    L1Comparator,
    MSEComparator,
    NumericalComparatorBase,
    SNRComparator,
)
from tests.devtools._reference_data import DATA, debug_buffer


def _inspector(name: str = "cnn_portable") -> Inspector:
    return Inspector(etdump_path=DATA / f"{name}.etdp", etrecord=DATA / f"{name}_etrecord.bin",
                     debug_buffer_path=debug_buffer(name))


class DoubledMSE(NumericalComparatorBase):
    """Written to the reference's contract: __init__(inspector), preprocessing(mapping) on the whole mapping."""

    def __init__(self, inspector=None):
        super().__init__(inspector)
        self.seen = 0

    def preprocessing(self, mapping):
        self.seen += len(mapping)
        return {(h, a * 2): (rh, b * 2) for (h, a), (rh, b) in mapping.items()}

    def element_compare(self, a, b) -> float:
        return float(torch.mean((a.double() - b.double()) ** 2))


def test_reference_style_comparator():
    ins = _inspector()
    cmp = DoubledMSE()
    assert cmp.inspector is None
    df = ins.calculate_numeric_gap(cmp)
    mse = ins.calculate_numeric_gap("MSE")
    assert cmp.seen >= len(df) and cmp.inspector is ins
    for g, m in zip(df["gap"], mse["gap"]):  # doubling both sides quadruples the MSE
        assert g[0] == pytest.approx(4 * m[0], rel=1e-6, abs=1e-30)


def test_comparator_with_inspector_argument():
    ins = _inspector("mlp_portable")
    cmp = DoubledMSE(ins)
    assert cmp.inspector is ins


def test_builtin_comparators_take_python_numbers():
    assert MSEComparator().element_compare(1.0, 3.0) == 4.0
    assert L1Comparator().element_compare([1.0, 2.0], [2.0, 4.0]) == 3.0
    assert SNRComparator().element_compare(2, 2) == math.inf


@pytest.mark.parametrize("cmp", [MSEComparator(), L1Comparator(), SNRComparator()])
def test_shape_mismatch_is_a_value_error(cmp):
    with pytest.raises(ValueError, match="mismatch"):
        cmp.element_compare(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError):
        cmp.element_compare("a", torch.ones(1))


def test_bad_mapping_preprocessing_is_a_value_error():
    class Bad(DoubledMSE):
        def preprocessing(self, mapping):
            return [1, 2]

    with pytest.raises(ValueError, match="mapping"):
        Bad().compare(torch.ones(2), torch.ones(2))


def test_get_op_list():
    ins = _inspector("cnn_xnnpack")
    ops = ins.get_op_list("Execute")
    assert [e.name for e in ops["aten::mean"]] == ["native_call_mean.out"]
    assert [e.name for e in ops["aten::convolution"]] == ["DELEGATE_CALL"]
    assert set(ops) == {op for b in ins.event_blocks if b.name == "Execute" for e in b.events for op in e.op_types}
    portable = _inspector("cnn_portable").get_op_list("Execute", show_delegated_ops=False)
    assert [e.name for e in portable["aten::convolution"]] == ["native_call_convolution.out"] * 2
    from edgetorch.errors import InspectorError

    with pytest.raises(InspectorError, match="no event block"):
        ins.get_op_list("nope")


def test_save_data_to_tsv_keywords(tmp_path):
    ins = _inspector("cnn_portable")
    buf = io.StringIO()
    ins.save_data_to_tsv(buf, include_units=False, include_delegate_debug_data=True)
    header, *rows = buf.getvalue().splitlines()
    cols = header.split("\t")
    assert "avg" in cols and "avg (ms)" not in cols and "delegate_debug_metadata" in cols
    names = [r.split("\t")[cols.index("event_name")] for r in rows]
    assert "OPERATOR_CALL" not in names and names.count("native_call_convolution.out") == 2
    ins.save_data_to_tsv(tmp_path / "p.tsv")
    assert "avg (ms)" in (tmp_path / "p.tsv").read_text().splitlines()[0].split("\t")


def test_generate_etrecord_both_signatures(tmp_path):
    from torch import nn

    from edgetorch.devtools.etrecord import generate_etrecord, parse_etrecord
    from edgetorch.exir import to_edge

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    ep = torch.export.export(model, (x,))
    edge = to_edge(ep)
    et = edge.to_executorch()
    other = torch.export.export(nn.Linear(8, 2).eval(), (x,))
    calls = {
        "reference keyword": lambda p: generate_etrecord(p, edge, et, ep, extra_recorded_export_modules={"o": other}),
        "reference positional": lambda p: generate_etrecord(p, edge, et, ep, {"o": other}),
        "earlier positional": lambda p: generate_etrecord(p, edge, et, {"o": other}, ep),
        "earlier keyword": lambda p: generate_etrecord(p, edge, et, export_modules={"o": other}, exported_program=ep),
    }
    for what, call in calls.items():
        path = tmp_path / f"{what.replace(' ', '_')}.etrecord"
        call(path)
        rec = parse_etrecord(path)
        assert set(rec.graph_map) == {"o/forward"}, what
        torch.testing.assert_close(rec.exported_programs["forward"].module()(x), model(x))
        torch.testing.assert_close(rec.graph_map["o/forward"].module()(x), other.module()(x))
    with pytest.raises(TypeError, match="both"):
        generate_etrecord(tmp_path / "x", edge, et, {"o": other}, extra_recorded_export_modules={"o": other})
    with pytest.raises(TypeError, match="not both"):
        generate_etrecord(tmp_path / "x", edge, et, export_modules={}, extra_recorded_export_modules={})


def test_dump_executorch_program():
    from torch import nn

    from edgetorch.exir import to_edge

    x = torch.randn(2, 8)
    et = to_edge(torch.export.export(nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval(), (x,))).to_executorch()
    assert et.executorch_program is et.program
    buf = io.StringIO()
    et.dump_executorch_program(out=buf)
    text = buf.getvalue()
    plan = et.program.plan("forward")
    assert text.count("\n  [") == len(plan.instructions) and "aten::addmm.out" in text and "aten::relu" in text
    verbose = io.StringIO()
    et.dump_executorch_program(verbose=True, out=verbose)
    assert verbose.getvalue().count("  value ") == len(plan.values)


def test_reference_bundled_program():
    """A reference .bpte: its test cases (checked against the reference's own eager outputs in the ETRecord's
    representative input) feed an ETRecord; its program is the reference .pte, refused by the runtime by name."""
    from edgetorch.devtools.bundled_program import load_bundled_program
    from edgetorch.devtools.bundled_program.executorch import ExecutorchBundledProgram
    from edgetorch.devtools.etrecord import parse_etrecord
    from edgetorch.errors import ProgramFormatError
    from edgetorch.runtime import Runtime

    bp = load_bundled_program(DATA / "mlp_portable.bpte")
    assert isinstance(bp, ExecutorchBundledProgram) and bp.version == 2
    assert bp.program == (DATA / "mlp_portable.pte").read_bytes()
    (suite,) = bp.method_test_suites
    assert suite.method_name == "forward" and len(suite.test_cases) == 2
    rec = parse_etrecord(DATA / "mlp_portable_etrecord.bin")
    x = rec.representative_inputs["forward"][0][0]
    case0, case1 = suite.test_cases
    assert torch.equal(case0.inputs[0], x) and torch.equal(case1.inputs[0], x + 1)
    torch.testing.assert_close(case0.expected_outputs[0], rec.reference_outputs["forward"][0][0])
    model = rec.exported_programs["forward"].module()
    torch.testing.assert_close(case1.expected_outputs[0], model(x + 1))
    rec.update_representative_inputs(bp)
    rec.update_reference_outputs(bp)
    assert len(rec.representative_inputs["forward"]) == 2
    for f in ("mlp_portable.pte", "mlp_portable.bpte"):
        with pytest.raises(ProgramFormatError, match="ExecuTorch"):
            Runtime.get().load_program(DATA / f)


def test_reference_bundled_program_bit_flips():
    from edgetorch.devtools.bundled_program import (
        BundledProgramFormatError,
        deserialize_from_flatbuffer_to_bundled_program,
    )
    from edgetorch.errors import EdgeTorchError

    data = (DATA / "mlp_portable.bpte").read_bytes()
    n_err = 0
    for i in range(0, len(data), 3):
        bad = bytearray(data)
        bad[i] ^= 0xFF
        try:
            deserialize_from_flatbuffer_to_bundled_program(bytes(bad))
        except BundledProgramFormatError:
            n_err += 1
        except EdgeTorchError:  # flipped out of the reference's identifier: edgetorch's own reader refuses it
            n_err += 1
    assert n_err > 50


def test_integration_tutorial_calls_on_reference_artifacts():
    """What the reference's developer-tools integration tutorial calls after its runner, on reference artifacts."""
    ins = _inspector("cnn_portable")
    buf = io.StringIO()
    ins.print_data_tabular(file=buf)
    assert "native_call_convolution.out" in buf.getvalue()
    conv1 = [e for b in ins.event_blocks for e in b.events if e.name == "native_call_convolution.out"][0]
    assert conv1.debug_handles == 1 and conv1.op_types == ["aten::convolution"]
    assert conv1.module_hierarchy["aten_convolution_default"]["L__self__conv1"] == (
        "conv1", "torch.nn.modules.conv.Conv2d")
    assert "make_reference_artifacts.py" in conv1.stack_traces["aten_convolution_default"]
    # the kernel's time only (the reference's OPERATOR_CALL scope around it is not counted again)
    assert ins.find_total_for_module("conv1") == pytest.approx(conv1.perf_data.avg)
    ep = ins.get_exported_program()
    assert any(n.name == "aten_convolution_default" for n in ep.graph.nodes)


def test_compare_results_on_reference_outputs():
    """The integration tutorial's last step: the bundled reference output against the run's logged output."""
    from edgetorch.devtools.inspector import compare_results

    ins = _inspector("cnn_portable")
    block = next(b for b in ins.event_blocks if b.name == "Execute")
    ref = ins.etrecord.reference_outputs["forward"][0]
    buf = io.StringIO()
    res = compare_results(ref, block.run_output, file=buf)
    assert set(res) == {"snr", "mse", "cosine_similarity"} and "snr" in buf.getvalue()
    diff = (ref[0].double() - block.run_output[0].double())
    assert res["mse"] == [round(float((diff ** 2).mean()), 2)]
    assert res["cosine_similarity"] == [1.0] and res["snr"][0] > 100
    assert compare_results(ref, ref, metrics=["MSE"], file=io.StringIO()) == {"mse": [0.0]}
    from edgetorch.errors import InspectorError

    with pytest.raises(InspectorError, match="unknown"):
        compare_results(ref, ref, metrics=["psnr"])
    with pytest.raises(InspectorError, match="output"):
        compare_results(ref, ref + ref)


def test_gap_groups_of_ops_split_between_a_delegate_and_kernels():
    """The reference's exporter may split one op between a delegate call and kernels (found on a ViT's
    ``unbind`` and ``matmul`` under XNNPACK): the part that runs first gives no row of that op."""
    from edgetorch.devtools.inspector.reference_runs import gap_groups
    from edgetorch.formats.handles import DELEGATE_CALL, KERNEL, HandleGroup

    call0 = HandleGroup(DELEGATE_CALL, 0, (6, 7, 8, 9), backend="XnnpackBackend")  # slice_copy of unbind (9) inside
    k1 = HandleGroup(KERNEL, 1, (9,))  # its squeeze_copy outside
    k2 = HandleGroup(KERNEL, 2, (11,))  # a matmul's expand_copy outside ...
    call3 = HandleGroup(DELEGATE_CALL, 3, (11, 12), backend="XnnpackBackend")  # ... and its bmm inside
    k4 = HandleGroup(KERNEL, 4, (13,))
    call5 = HandleGroup(DELEGATE_CALL, 5, (13,), backend="XnnpackBackend")
    out = gap_groups([call0, k1, k2, call3, k4, call5])
    assert out == {call0: HandleGroup(DELEGATE_CALL, 0, (6, 7, 8), backend="XnnpackBackend"), k2: None, k4: None}


def test_dim_order_ops_read_as_aten():
    from edgetorch.devtools.etrecord._executorch import _dim_order_to_aten

    edge = "executorch.exir.dialects.edge.ops."
    clone = {"target": edge + "dim_order_ops._clone_dim_order.default", "inputs": [
        {"name": "self", "arg": {"as_tensor": {"name": "x"}}}, {"name": "non_blocking", "arg": {"as_bool": False}},
        {"name": "dim_order", "arg": {"as_ints": [0, 2, 3, 1]}}]}
    _dim_order_to_aten(clone)
    assert clone["target"] == "torch.ops.aten.clone.default"
    assert [a["name"] for a in clone["inputs"]] == ["self", "memory_format"]
    assert clone["inputs"][1]["arg"] == {"as_memory_format": 2}  # channels last
    to = {"target": edge + "dim_order_ops._to_dim_order_copy.default", "inputs": [
        {"name": "self", "arg": {"as_tensor": {"name": "x"}}}, {"name": "dtype", "arg": {"as_scalar_type": 7}},
        {"name": "dim_order", "arg": {"as_ints": [0, 1, 2]}}]}
    _dim_order_to_aten(to)
    assert to["target"] == "torch.ops.aten._to_copy.default"
    assert to["inputs"][1:] == [{"name": "dtype", "arg": {"as_scalar_type": 7}},
                                {"name": "memory_format", "arg": {"as_memory_format": 1}, "kind": 2}]


def test_bundled_program_checks_raise_what_the_reference_raises():
    """The reference's bundled-program checks are assertions: edgetorch's typed errors are AssertionErrors too."""
    from torch import nn

    from edgetorch.devtools.bundled_program import (
        BundledInputMismatchError,
        BundledProgram,
        MethodTestCase,
        MethodTestSuite,
    )
    from edgetorch.exir import to_edge

    x = torch.randn(2, 8)
    et = to_edge(torch.export.export(nn.Linear(8, 4).eval(), (x,))).to_executorch()
    bad = [MethodTestSuite("forward", [MethodTestCase((torch.randn(3, 5),))])]
    with pytest.raises(AssertionError) as ei:
        BundledProgram(et, bad)
    assert isinstance(ei.value, BundledInputMismatchError) and isinstance(ei.value, ValueError)


def test_get_etrecord_without_generate_is_a_runtime_error():
    """The reference raises RuntimeError("ETRecord was not generated"); so does edgetorch (a typed one)."""
    from torch import nn

    from edgetorch.errors import ETRecordError
    from edgetorch.exir import to_edge

    et = to_edge(torch.export.export(nn.Linear(8, 4).eval(), (torch.randn(2, 8),))).to_executorch()
    with pytest.raises(RuntimeError, match="ETRecord was not generated") as ei:
        et.get_etrecord()
    assert isinstance(ei.value, ETRecordError)


def test_calculate_numeric_gap_takes_the_reference_keywords():
    ins = _inspector("mlp_portable")
    df = ins.calculate_numeric_gap(distance="MSE", disable_debug_handle_valdiation=True, reference_graph=None)
    assert len(df) == 5 and df.attrs["reference_graph"] == "exported_program"
