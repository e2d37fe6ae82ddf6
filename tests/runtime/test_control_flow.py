"""``torch.cond`` end to end: export, to_edge (with and without the ONNX Runtime partitioner), emission as
JUMP_FALSE / MOVE instructions with both branches inlined, a saved .pte run by the runtime equal to eager on
inputs taking either branch (a predicate from data and one from a dynamic shape, tuple operands, a nested cond),
an ETDump with a debug buffer whose branch ops the Inspector pairs with the reference (no culprit, no row and no
"unmatched" noise for the branch that did not run), the ETRecord round trip, and hostile files (decoded, one
field changed, re-encoded with a valid hash) refused with typed errors naming the field."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from edgetorch.errors import ProgramFormatError, UnsupportedOpError
from edgetorch.exir import to_edge, to_edge_transform_and_lower
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime, Verification
from tests.fuzz import pte_edit


class TwoBranches(torch.nn.Module):
    """A predicate computed from the data, tuple operands, two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x)

        def yes(h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.sigmoid(h) * y, h + 1.0

        def no(h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.tanh(h) - y, h.exp()

        a, b = torch.cond(h.sum() > 0, yes, no, (h, y))
        return a + b, b.relu()


class ByShape(torch.nn.Module):
    """A predicate from a dynamic dim (a SymBool)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.shape[0] > 4, lambda x: x.sin() + 1, lambda x: x.cos() * 2, (x,))


class Nested(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def outer_yes(x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.mean() > 0.5, lambda x: x * 10, lambda x: x - 10, (x,))
        return torch.cond(x.sum() > 0, outer_yes, lambda x: -x, (x,)) + 1


def _inputs(positive: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4, generator=g)
    return (x if positive else -x), torch.randn(3, 4, generator=g)


def _taken(model: TwoBranches, x: torch.Tensor) -> bool:
    return bool(model.lin(x).sum() > 0)


@pytest.fixture(scope="module")
def model() -> TwoBranches:
    torch.manual_seed(0)
    m = TwoBranches().eval()
    with torch.no_grad():  # one branch for x > 0, the other for x < 0
        m.lin.weight.copy_(torch.eye(4))
        m.lin.bias.zero_()
    return m


@pytest.fixture(scope="module")
def program(model, tmp_path_factory):
    ep = torch.export.export(model, _inputs(True))
    et = to_edge(ep, generate_etrecord=True).to_executorch()
    path = tmp_path_factory.mktemp("cond") / "cond.pte"
    et.save(str(path))
    return et, path


def _ops(plan: pf.PlanDef) -> list[str]:
    return [type(i.call).__name__ for i in plan.instructions]


def test_emitted_as_jumps_and_moves(program):
    et, _ = program
    plan = et.program.plans[0]
    kinds = _ops(plan)
    assert kinds.count("JumpFalseCallDef") == 2 and kinds.count("MoveCallDef") == 4
    jf = [i.call for i in plan.instructions if isinstance(i.call, pf.JumpFalseCallDef)]
    assert all(j.destination_instruction > k for k, j in
               ((k, i.call) for k, i in enumerate(plan.instructions) if isinstance(i.call, pf.JumpFalseCallDef)))
    assert plan.values[jf[1].cond_value_index] is False  # the jump over the false branch is unconditional


@pytest.mark.parametrize("positive", [True, False])
def test_either_branch_equals_eager(program, model, positive):
    _, path = program
    x, y = _inputs(positive)
    assert _taken(model, x) is positive
    method = Runtime.get().load_program(str(path), verification=Verification.Full).load_method("forward")
    got = method.execute(x, y)
    with torch.no_grad():
        want = model(x, y)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.slow
def test_with_the_onnxruntime_partitioner_the_cond_stays_portable(model, tmp_path):
    """The ops around the cond go to ONNX Runtime, the cond and its branches stay portable; the Inspector pairs
    the delegate's ops and the branch ops alike."""
    pytest.importorskip("onnxruntime")
    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.devtools import Inspector
    ep = torch.export.export(model, _inputs(True))
    et = to_edge_transform_and_lower(ep, partitioner=[OrtPartitioner()], generate_etrecord=True).to_executorch()
    plan = et.program.plans[0]
    assert "JumpFalseCallDef" in _ops(plan) and "DelegateCallDef" in _ops(plan)
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    method = prog.load_method("forward")
    for positive in (True, False):
        x, y = _inputs(positive)
        with torch.no_grad():
            want = model(x, y)
        for g, w in zip(method.execute(x, y), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    prog.write_etdump_result_to_file(tmp_path / "e.etdp", tmp_path / "e.bin")
    rec = et.get_etrecord()
    rec.update_representative_inputs([_inputs(True), _inputs(False)])
    insp = Inspector(etdump_path=tmp_path / "e.etdp", etrecord=rec, debug_buffer_path=tmp_path / "e.bin")
    df = insp.calculate_numeric_gap("MSE", execution=1)  # the second call: the false branch
    assert insp.find_culprits(df).empty
    assert {"tanh", "exp", "linear"} <= {o for ops in df["aot_ops"] for o in ops}
    assert not {"sigmoid"} & {o for ops in df["aot_ops"] for o in ops}


def test_a_predicate_from_a_dynamic_shape():
    m = ByShape()
    ep = torch.export.export(m, (torch.randn(6, 3),),
                             dynamic_shapes=({0: torch.export.Dim("b", min=2, max=10)},))
    method = Runtime.get().load_program(to_edge(ep).to_executorch().buffer).load_method("forward")
    for n in (2, 4, 5, 10):
        x = torch.randn(n, 3)
        torch.testing.assert_close(method.execute(x)[0], m(x), rtol=0, atol=0)


def test_nested_conds():
    m = Nested()
    x = torch.rand(2, 3)
    method = Runtime.get().load_program(to_edge(torch.export.export(m, (x,))).to_executorch().buffer
                                        ).load_method("forward")
    for x in (torch.rand(2, 3) * 0.4, torch.rand(2, 3) * 0.4 + 0.6, -torch.rand(2, 3)):
        torch.testing.assert_close(method.execute(x)[0], m(x), rtol=0, atol=0)


def test_other_control_flow_is_refused_naming_it():
    class Loop(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch._higher_order_ops.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2),
                                                      (torch.tensor(0), x))[1]
    ep = torch.export.export(Loop(), (torch.randn(2),))
    with pytest.raises(UnsupportedOpError, match="while_loop"):
        to_edge(ep)


# -- the debugger -------------------------------------------------------------------------------------
@pytest.mark.parametrize("positive", [True, False])
def test_etdump_and_inspector_see_the_branch_that_ran(program, model, positive, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="edgetorch"):
        _inspect_one_branch(program, model, positive, tmp_path)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records


def _inspect_one_branch(program, model, positive: bool, tmp_path) -> None:
    """An ETRecord saved and loaded back, a traced run of one branch, its gap table and culprits."""
    from edgetorch.devtools import Inspector
    from edgetorch.devtools.etrecord import parse_etrecord
    et, path = program
    x, y = _inputs(positive)
    rec = et.get_etrecord()
    rec.update_representative_inputs((x, y))
    rec.save(tmp_path / "r.bin")
    prog = Runtime.get().load_program(str(path), enable_etdump=True, debug_buffer_size="auto")
    got = prog.load_method("forward").execute(x, y)
    with torch.no_grad():
        torch.testing.assert_close(got[0], model(x, y)[0], rtol=0, atol=0)
    prog.write_etdump_result_to_file(tmp_path / "e.etdp", tmp_path / "e.bin")
    insp = Inspector(etdump_path=tmp_path / "e.etdp", etrecord=tmp_path / "r.bin",
                     debug_buffer_path=tmp_path / "e.bin")
    df = insp.calculate_numeric_gap("MSE")
    assert insp.find_culprits(df).empty
    ops = {op for row in df["aot_ops"] for op in row}
    ran, other = ({"sigmoid", "mul"}, {"tanh", "exp"}) if positive else ({"tanh", "exp"}, {"sigmoid", "mul"})
    assert ran <= {o.rstrip("_0123456789") for o in ops}, ops
    assert not other & {o.rstrip("_0123456789") for o in ops}, ops
    assert all(v == "exact" for v in df["verdict"]), df[["aot_ops", "verdict"]]
    reference_side = [u for u in df.attrs["coverage"].unmatched if u["side"] == "reference"]
    assert not [u for u in reference_side if {o.rstrip("_0123456789") for o in u["ops"]} & other], reference_side
    back = parse_etrecord(str(tmp_path / "r.bin")).edge_programs["forward"]  # the round trip keeps the cond
    assert [n.name for n in back.graph.nodes if n.target is torch.ops.higher_order.cond] == ["cond"]
    first_op = {i.debug_handle for i in et.program.plans[0].instructions if i.node_name.startswith(("sig", "tanh"))}
    branch = {h for hs in df["aot_debug_handle"] for h in hs} & first_op
    assert len(branch) == 1  # the branch op's row carries its debug handle, the one its instruction has


def test_runs_of_both_branches_in_one_etdump(program, tmp_path):
    """Two calls taking different branches are two event blocks; ``run=k`` still names the k-th call."""
    from edgetorch.devtools import Inspector
    et, path = program
    prog = Runtime.get().load_program(str(path), enable_etdump=True, debug_buffer_size="auto")
    method = prog.load_method("forward")
    for positive in (True, False):
        method.execute(*_inputs(positive))
    prog.write_etdump_result_to_file(tmp_path / "e.etdp", tmp_path / "e.bin")
    rec = et.get_etrecord()
    rec.update_representative_inputs([_inputs(True), _inputs(False)])
    insp = Inspector(etdump_path=tmp_path / "e.etdp", etrecord=rec, debug_buffer_path=tmp_path / "e.bin")
    for run, op in ((0, "sigmoid"), (1, "tanh")):
        df = insp.calculate_numeric_gap("MSE", run=run)
        assert op in {o for ops in df["aot_ops"] for o in ops} and insp.find_culprits(df).empty


def test_a_hostile_reference_cond_is_a_typed_error(model):
    """A reference graph whose branch takes more inputs than the cond passes, or whose predicate is no bool."""
    from edgetorch.devtools.inspector._control_flow import inline_taken_branches
    from edgetorch.errors import ETRecordFormatError
    x, y = _inputs(True)
    gm = torch.export.export(model, (x, y)).module()
    flat = inline_taken_branches(gm, (x, y))
    assert not any(n.target is torch.ops.higher_order.cond for n in flat.graph.nodes)
    torch.testing.assert_close(torch.fx.Interpreter(flat).run(x, y)[0], model(x, y)[0], rtol=0, atol=0)
    true_gm = gm.get_submodule("true_graph_0")
    first = next(iter(true_gm.graph.nodes))
    with true_gm.graph.inserting_before(first):
        true_gm.graph.placeholder("extra")
    with pytest.raises(ETRecordFormatError, match="passes 2 operands to a branch taking 3"):
        inline_taken_branches(gm, (x, y))
    cond = next(n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond)
    cond.args = (next(n for n in gm.graph.nodes if n.op == "placeholder"), *cond.args[1:])  # a [3, 4] float
    with pytest.raises(ETRecordFormatError, match="not one bool"):
        inline_taken_branches(gm, (x, y))


# -- hostile files ------------------------------------------------------------------------------------
def _first(plan: pf.PlanDef, cls: type) -> tuple[int, object]:
    return next((k, i.call) for k, i in enumerate(plan.instructions) if isinstance(i.call, cls))


def _refused(data: bytes, edit, field: str, match: str, minimal: bool = True) -> None:
    """Refused at every verification level (``minimal``: by the runtime's own load checks too)."""
    bad = pte_edit.edit(data, edit)
    levels = (Verification.Minimal,) * minimal + (Verification.InternalConsistency, Verification.Full)
    for level in levels:
        with pytest.raises(ProgramFormatError, match=match) as ei:
            Runtime.get().load_program(bad, verification=level).load_method("forward")
        assert field in ei.value.field, (ei.value.field, field)


def _on_first(kind, fn):
    """An edit applying ``fn(plan, index, call)`` to the first instruction of ``kind`` of the first method."""
    def edit(prog: pf.ProgramDef) -> None:
        plan = prog.plans[0]
        k, c = _first(plan, kind)
        fn(plan, k, c)
    return edit


def _jump(fn):
    return _on_first(pf.JumpFalseCallDef, fn)


def _move(fn):
    return _on_first(pf.MoveCallDef, fn)


def test_hostile_jump_destination_out_of_range(program):
    data = bytes(program[0].buffer)
    _refused(data, _jump(lambda p, k, c: setattr(c, "destination_instruction", len(p.instructions) + 1)),
             ".destination_instruction", "only forward jumps")


def test_hostile_backward_jump(program):
    data = bytes(program[0].buffer)
    _refused(data, _jump(lambda p, k, c: setattr(c, "destination_instruction", k)), ".destination_instruction",
             "only forward jumps")


def test_hostile_jump_condition_of_another_kind(program):
    data = bytes(program[0].buffer)

    def edit(p, k, c):
        c.cond_value_index = next(i for i, v in enumerate(p.values) if isinstance(v, pf.TensorDef)
                                  and v.scalar_type == 6)  # a float tensor
    _refused(data, _jump(edit), ".cond_value_index", "not a bool")


def test_hostile_move_between_different_dtypes_or_shapes(program):
    data = bytes(program[0].buffer)

    def dtype(p, k, c):
        v = copy.deepcopy(p.values[c.move_to])
        v.scalar_type = 3  # int32: as many bytes as float32, so only the dtype differs
        p.values[c.move_to] = v
    _refused(data, _move(dtype), ".move_to", "keeps dtype and shape")

    def shape(p, k, c):
        v = copy.deepcopy(p.values[c.move_from])
        v.sizes, v.strides = [4, 3], [3, 1]  # [3, 4] before: the same bytes, another shape
        p.values[c.move_from] = v
    _refused(data, _move(shape), ".move_to", "keeps dtype and shape")


def test_hostile_move_into_a_constant(program):
    data = bytes(program[0].buffer)

    def edit(p, k, c):
        c.move_to = next(i for i, v in enumerate(p.values) if isinstance(v, pf.TensorDef)
                         and v.placement == pf.PLACEMENT_CONSTANT)
    _refused(data, _move(edit), ".instructions[", "a constant|not a planned tensor")


def test_hostile_jump_over_the_writes_of_an_output(program):
    """The first jump sent past the false branch: on that path the cond's outputs are never written, so the
    code after it would read arena bytes nothing wrote."""
    data = bytes(program[0].buffer)
    _refused(data, _jump(lambda p, k, c: _skip_false_branch(p, c)), ".args", "not written on every path",
             minimal=False)  # Minimal does not prove def-use (docs/formats.md, verification levels)


def _skip_false_branch(plan: pf.PlanDef, c: pf.JumpFalseCallDef) -> None:
    end = [i.call for i in plan.instructions if isinstance(i.call, pf.JumpFalseCallDef)][1].destination_instruction
    c.destination_instruction = end


def test_older_schema_versions_still_load_and_jumps_need_version_4(program):
    lin = torch.nn.Linear(3, 2)
    x = torch.randn(1, 3)
    plain = bytes(to_edge(torch.export.export(lin, (x,))).to_executorch().buffer)
    for version in (1, 2, 3):
        old = pte_edit.edit(plain, lambda prog, v=version: setattr(prog, "version", v))
        assert pf.read_header(old).schema_version == version
        got = Runtime.get().load_program(old, verification=Verification.Full).load_method("forward").execute(x)[0]
        torch.testing.assert_close(got, lin(x).detach(), rtol=0, atol=0)
    bad = pte_edit.edit(bytes(program[0].buffer), lambda prog: setattr(prog, "version", 3))
    with pytest.raises(ProgramFormatError, match="schema version 3 does not have") as ei:
        Runtime.get().load_program(bad)
    assert ".instructions[" in ei.value.field
