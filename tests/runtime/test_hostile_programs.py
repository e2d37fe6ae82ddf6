"""Hostile programs, built as an attacker builds them (decode, change one field, re-encode with a valid hash):
the runtime refuses each with a typed error at ``load_method``, under every verification level, and touches no
file."""

from __future__ import annotations

import os

import pytest
import torch

from edgetorch.errors import OperatorNotAllowedError, ProgramFormatError
from edgetorch.formats import program as pf
from edgetorch.models import get_model
from edgetorch.runtime import Runtime, Verification
from edgetorch.runtime import ops as runtime_ops
from tests.conftest import lower
from tests.fuzz.pte_edit import add_operator, add_value, edit

LEVELS = (Verification.Minimal, Verification.InternalConsistency, Verification.Full)


@pytest.fixture(scope="module")
def mlp():
    model, inputs = get_model("mlp")
    return lower(model, inputs).buffer, model, inputs


def _from_file(p: pf.PlanDef, path: str, n: int, kind: int) -> tuple[pf.InstructionDef, int]:
    """``aten::from_file(path, shared=True, size=n, dtype=uint8)`` into a new value of ``p``."""
    op = add_operator(p, "aten::from_file", "default")
    args = [add_value(p, path), add_value(p, True), add_value(p, n), add_value(p, pf.DtypeV(0)),
            add_value(p, None), add_value(p, None), add_value(p, None)]
    placement = pf.PLACEMENT_ALIAS if kind == pf.CALL_VIEW else pf.PLACEMENT_PLANNED
    out = add_value(p, pf.TensorDef(0, [n], [1], 0, placement, n, arena_offset=0 if kind != pf.CALL_VIEW else -1))
    return pf.InstructionDef(pf.KernelCallDef(op, kind, args, [out]), "evil_from_file", 0, ""), out


def _write_attack(path: str, n: int, kind: int):
    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        ins, out = _from_file(p, path, n, kind)
        fill = add_operator(p, "aten::fill", "Scalar_out")
        write = pf.InstructionDef(pf.KernelCallDef(fill, pf.CALL_OUT, [out, add_value(p, 65)], [out]), "evil_fill")
        p.instructions[0:0] = [ins, write]
    return mutate


def _read_attack(path: str, n: int, kind: int):
    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        ins, out = _from_file(p, path, n, kind)
        p.instructions.insert(0, ins)
        p.outputs.append(out)
        p.output_names.append("secret")
    return mutate


@pytest.mark.parametrize("kind", [pf.CALL_VIEW, pf.CALL_FUNCTIONAL_COPY, pf.CALL_OUT])
@pytest.mark.parametrize("level", LEVELS)
def test_from_file_write_is_refused_and_no_file_is_touched(mlp, tmp_path, level, kind):
    data, _, inputs = mlp
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious" * 8)
    before = os.stat(victim)
    bad = edit(data, _write_attack(str(victim), 64, kind))
    # header, hash and bounds are all valid; the plan check (InternalConsistency, Full) may see the write into
    # storage no planned slot owns first, the operator allow-list refuses it at every level
    with pytest.raises(ProgramFormatError, match=r"instruction [01] \(.*(evil_from_file\) calls aten::from_file"
                                                 r"|writes value \d+, which is not a planned)") as e:
        Runtime.get().load_program(bad, verification=level).load_method("forward").execute(*inputs)
    if level == Verification.Minimal:
        assert isinstance(e.value, OperatorNotAllowedError) and e.value.field.startswith("forward.operators[")
    assert victim.read_bytes() == b"precious" * 8
    after = os.stat(victim)
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)


@pytest.mark.parametrize("level", LEVELS)
def test_from_file_read_is_refused(mlp, tmp_path, level):
    data, _, inputs = mlp
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s3cr3t!!" * 8)
    bad = edit(data, _read_attack(str(secret), 64, pf.CALL_VIEW))
    with pytest.raises(OperatorNotAllowedError, match="aten::from_file.default"):
        Runtime.get().load_program(bad, verification=level).load_method("forward")


@pytest.mark.parametrize("name,overload", [
    ("aten::_print", "default"), ("aten::set_", "source_Storage"), ("aten::resize_as_", "default"),
    ("aten::resize_", "default"), ("debugprims::load_tensor", "default"), ("prims::add", "default"),
    ("profiler::_record_function_enter_new", "default"), ("quantized::add", "default"),
    ("aten::__class__", "default"), ("os::system", "default"),
])
def test_ops_outside_the_allow_list_are_refused_naming_op_and_instruction(mlp, name, overload):
    data, _, _ = mlp

    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        c = p.instructions[1].call
        p.operators[c.op_index] = pf.OperatorDef(name, overload)

    bad = edit(data, mutate)
    with pytest.raises(OperatorNotAllowedError, match=rf"instruction \d+ \(.*\) calls {name}.{overload}"):
        Runtime.get().load_program(bad).load_method("forward")


def test_an_allowed_op_called_with_the_wrong_kind_is_refused(mlp):
    """``copy_`` (in place: writes ``self``) is allowed in a reference graph, never as a program's kernel; an out
    variant called as a VIEW or FUNCTIONAL_COPY would write its out argument."""
    data, _, _ = mlp

    def copy_inplace(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        c = next(i.call for i in p.instructions if i.call.kind == pf.CALL_OUT)
        p.operators[c.op_index] = pf.OperatorDef("aten::copy_", "default")
        c.kind = pf.CALL_FUNCTIONAL_COPY

    minimal = Verification.Minimal  # the kind check holds at every level (the plan check may refuse first)
    with pytest.raises(OperatorNotAllowedError, match="writes its argument"):
        Runtime.get().load_program(edit(data, copy_inplace), verification=minimal).load_method("forward")

    def out_as_view(prog: pf.ProgramDef) -> None:
        next(i.call for i in prog.plans[0].instructions if i.call.kind == pf.CALL_OUT).kind = pf.CALL_VIEW

    with pytest.raises(OperatorNotAllowedError, match="not a view"):
        Runtime.get().load_program(edit(data, out_as_view), verification=minimal).load_method("forward")


def test_a_user_registered_operator_runs_and_the_file_cannot_register_one(mlp):
    """``register_operator`` (Python, by the user) adds an op; unregistering removes it again."""
    data, model, inputs = mlp
    lib = torch.library.Library("edgetorch_test_i23", "DEF")
    lib.define("twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")

    def twice_out(x, *, out):  # noqa: ANN001, ANN202
        return torch.mul(x, 2, out=out)

    lib.impl("twice.out", twice_out, "CompositeExplicitAutograd")
    op = torch.ops.edgetorch_test_i23.twice.out

    def swap_relu(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        for i, o in enumerate(p.operators):
            if o.name == "aten::relu":
                p.operators[i] = pf.OperatorDef("edgetorch_test_i23::twice", "out")

    bad = edit(data, swap_relu)
    with pytest.raises(OperatorNotAllowedError, match="edgetorch_test_i23::twice.out"):
        Runtime.get().load_program(bad).load_method("forward")
    runtime_ops.register_operator(op)
    try:
        (out,) = Runtime.get().load_program(bad).load_method("forward").execute(*inputs)
        with torch.no_grad():  # eager with relu replaced by the registered kernel
            want = model.fc3(2 * model.fc2(2 * model.fc1(inputs[0])))
        torch.testing.assert_close(out, want)
    finally:
        runtime_ops.unregister_operator(op)
    with pytest.raises(OperatorNotAllowedError):
        Runtime.get().load_program(bad).load_method("forward")


def test_registration_refuses_file_and_storage_ops():
    for op in (torch.ops.aten.from_file.default, torch.ops.aten.set_.source_Storage, torch.ops.aten._print.default):
        with pytest.raises(ValueError, match="cannot be registered"):
            runtime_ops.register_operator(op)
    with pytest.raises(TypeError):
        runtime_ops.register_operator("aten::from_file")  # type: ignore[arg-type]


def test_zoo_operators_are_allowed():
    """What the compiler emitted for the zoo's fast models (and a reference graph holds) is on the list."""
    from edgetorch.formats.operators import allowed_operators

    allowed = allowed_operators()
    for name in ("aten::addmm.out", "aten::convolution.out", "aten::_native_batch_norm_legit_no_training.out",
                 "aten::max_pool2d_with_indices.out", "aten::scaled_dot_product_attention.default",
                 "aten::index_put.out", "aten::copy.out", "aten::view.default", "aten::linear.default",
                 "quantized_decomposed::dequantize_per_tensor.default", "edgetorch::linear_q4.default"):
        assert name in allowed
    for name in ("aten::from_file.default", "aten::_print.default", "aten::set_.source_Storage",
                 "aten::empty.memory_format", "aten::resize_.default",
                 "edgetorch::call_delegate.default"):  # gone: a delegate call is torch's higher-order op
        assert name not in allowed


@pytest.fixture(scope="module")
def cnn():
    model, inputs = get_model("small_cnn")
    return lower(model, inputs).buffer, model, inputs


@pytest.mark.parametrize("position", [1, 2, 3, 4])  # weight, bias, running_mean, running_var
@pytest.mark.parametrize("level", LEVELS)
def test_batch_norm_statistic_moved_to_an_empty_tensor_is_refused(cnn, level, position):
    """The issue's SIGSEGV: a hash-valid file whose batch-norm statistic is an empty (valid) tensor; torch's CPU
    kernel reads C elements of it unchecked. The load refuses it naming the instruction and the argument (a
    crash here kills the test process)."""
    data, _, inputs = cnn

    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        c = next(i.call for i in p.instructions if isinstance(i.call, pf.KernelCallDef)
                 and "batch_norm" in p.operators[i.call.op_index].name)
        c.args[position] = next(o for o in c.outputs if p.values[o].nbytes == 0)  # save_mean: shape [0]

    name = ("weight", "bias", "running_mean", "running_var")[position - 1]
    prog = Runtime.get().load_program(edit(data, mutate), verification=level)
    with pytest.raises(ProgramFormatError, match=rf"instruction \d+ .*batch_norm.*{name} must have shape \[16\]"):
        prog.load_method("forward").execute(*inputs)


def test_an_argument_of_the_wrong_kind_is_refused_at_load(mlp):
    """A tensor argument pointed at an int list: refused when the method loads, naming the argument."""
    data, _, _ = mlp

    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        c = next(i.call for i in p.instructions if i.call.kind == pf.CALL_OUT
                 and p.operators[i.call.op_index].name == "aten::addmm")
        c.args[1] = add_value(p, pf.IntListV((1, 2)))

    with pytest.raises(ProgramFormatError, match="argument 'mat1' must be Tensor, the program passes list"):
        Runtime.get().load_program(edit(data, mutate)).load_method("forward")


@pytest.mark.parametrize("level", LEVELS)
def test_an_op_swapped_for_an_empty_allocation_computes_zeros_never_arena_bytes(mlp, level):
    """A hash-valid edit naming ``aten::empty.memory_format`` where the last kernel stood: the runtime zero-fills
    that output instead of handing out what the arena held (another valid program, never a leak)."""
    data, _, inputs = mlp

    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        ins = next(i for i in reversed(p.instructions) if i.call.kind == pf.CALL_OUT and p.outputs[0] in i.call.outputs)
        ins.call.op_index = add_operator(p, "aten::empty", "memory_format")
        ins.call.kind = pf.CALL_FUNCTIONAL_COPY
        ins.call.args = [add_value(p, pf.IntListV([1, 10]))] + [add_value(p, None) for _ in range(5)]

    method = Runtime.get().load_program(edit(data, mutate), verification=level).load_method("forward")
    for sample in (inputs[0], torch.randn_like(inputs[0]) * 100):
        (out,) = method.execute(sample)
        assert torch.count_nonzero(out) == 0
