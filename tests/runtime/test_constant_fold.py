"""Instructions that compute the same every run (a deterministic op of constants only, e.g. the dequantized int8
weight of a quantized program) run once at load: their values equal an independent numpy dequantization, live
out of the arena, still reach an observer every run, and the program's outputs do not change. What must run
every run (a random op, a method output) still does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.export import ExportRecipe, PortableRecipeType, export
from edgetorch.runtime import Runtime
from edgetorch.runtime.method import _noop
from tests.quant_helpers import TinyConvNet, conv_samples


def _ops(method, name: str) -> list[int]:  # noqa: ANN001
    plan = method.plan
    return [k for k, ins in enumerate(plan.instructions)
            if hasattr(ins.call, "op_index") and plan.operators[ins.call.op_index].name == name]


@pytest.fixture(scope="module")
def int8():  # noqa: ANN201
    samples = conv_samples(3)
    model = TinyConvNet().eval()
    session = export(model, samples, ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL))
    return session, samples


def test_dequantized_weights_are_computed_once_and_equal_numpy(int8) -> None:  # noqa: ANN001
    session, _ = int8
    m = Runtime.get().load_program(session.get_pte_buffer()).load_method("forward")
    dq = _ops(m, "quantized_decomposed::dequantize_per_channel")
    assert len(dq) == 3  # conv1, conv2, head
    arena = m._arena.untyped_storage().data_ptr()
    for k in dq:
        call = m.plan.instructions[k].call
        assert m._calls[k] is _noop
        w, scale, zp = (m.value(a) for a in call.args[:3])
        (out,) = call.outputs
        got = m.value(out)
        assert got.untyped_storage().data_ptr() != arena
        axis = m.value(call.args[3])
        shape = [1] * w.dim()
        shape[axis] = -1
        want = (w.numpy().astype(np.float32) - zp.numpy().reshape(shape).astype(np.float32)) \
            * scale.numpy().reshape(shape).astype(np.float32)
        assert np.array_equal(got.numpy(), want)
    # activations are quantized every run: never folded
    assert all(m._calls[k] is not _noop for k in _ops(m, "quantized_decomposed::quantize_per_tensor"))


def test_folding_can_be_turned_off(int8) -> None:  # noqa: ANN001
    session, samples = int8
    folded = Runtime.get().load_program(session.get_pte_buffer()).load_method("forward")
    plain = Runtime.get().load_program(session.get_pte_buffer(), fold_constants=False).load_method("forward")
    assert all(plain._calls[k] is not _noop for k in _ops(plain, "quantized_decomposed::dequantize_per_channel"))
    for x in samples:
        assert torch.equal(plain.execute(*x)[0], folded.execute(*x)[0])  # bitwise: the same op, run once
    with pytest.raises(TypeError, match="fold_constants must be True or False, got 'no'"):
        Runtime.get().load_program(session.get_pte_buffer(), fold_constants="no")


def test_outputs_match_the_quantized_program_run_eagerly(int8) -> None:  # noqa: ANN001
    session, samples = int8
    m = Runtime.get().load_program(session.get_pte_buffer()).load_method("forward")
    module = session.get_executorch_program_manager().exported_program().module()
    for x in [*samples, *samples[:1]]:  # a repeated input: the folded values were not overwritten
        (got,) = m.execute(*x)
        with torch.no_grad():
            want = module(*x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_an_observer_still_sees_every_folded_value(int8) -> None:  # noqa: ANN001
    session, samples = int8
    m = Runtime.get().load_program(session.get_pte_buffer()).load_method("forward")
    dq = set(_ops(m, "quantized_decomposed::dequantize_per_channel"))
    seen: dict[int, torch.Tensor] = {}

    class Watch:
        def begin_run(self, method) -> None:  # noqa: ANN001
            self.method = method

        def before_instruction(self, k: int) -> None:
            pass

        def after_instruction(self, k: int) -> None:
            if k in dq:
                seen[k] = self.method.value(m.plan.instructions[k].call.outputs[0]).clone()

        def end_run(self, method, ok: bool) -> None:  # noqa: ANN001
            pass

    m.observer = Watch()
    m.execute(*samples[0])
    assert set(seen) == dq
    for k, v in seen.items():
        assert torch.equal(v, m.value(m.plan.instructions[k].call.outputs[0]))


class _RandomOfConstant(nn.Module):
    """A random op and a method output computed from constants only: both must run every time."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w", torch.arange(6.0).reshape(2, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + torch.rand_like(self.w), self.w * 2


def test_random_ops_and_method_outputs_are_not_folded() -> None:
    x = torch.zeros(2, 3)
    et = to_edge_transform_and_lower(torch.export.export(_RandomOfConstant(), (x,))).to_executorch()
    m = Runtime.get().load_program(et.buffer).load_method("forward")
    (a1, w1), (a2, w2) = m.execute(x), m.execute(x)
    assert not torch.equal(a1, a2)  # drawn anew each run
    assert torch.equal(w1, torch.arange(6.0).reshape(2, 3) * 2) and torch.equal(w1, w2)
    w1.add_(1)  # the caller owns its outputs: the next run is unchanged
    assert torch.equal(m.execute(x)[1], w2)


class _IndexConstant(nn.Module):
    """A constant table indexed by an input (a list-of-tensors argument): not constant."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(10.0) * 3)

    def forward(self, i: torch.Tensor) -> torch.Tensor:
        return self.table[i] + 1


def test_an_op_reading_an_input_through_a_tensor_list_is_not_folded() -> None:
    i = torch.tensor([1, 2])
    et = to_edge_transform_and_lower(torch.export.export(_IndexConstant(), (i,))).to_executorch()
    m = Runtime.get().load_program(et.buffer).load_method("forward")
    assert torch.equal(m.execute(i)[0], torch.tensor([4.0, 7.0]))
    assert torch.equal(m.execute(torch.tensor([5, 0]))[0], torch.tensor([16.0, 1.0]))


class _Dequantize(nn.Module):
    """An int8 weight dequantized in the graph (as a quantized program does), read by two methods."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randint(-127, 128, (4, 3), generator=g, dtype=torch.int8))
        self.register_buffer("s", torch.rand(4, generator=g) / 10 + 0.01)
        self.register_buffer("z", torch.zeros(4, dtype=torch.int64))
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.ops.quantized_decomposed.dequantize_per_channel(self.w, self.s, self.z, 0, -127, 127, torch.int8)
        return x @ w.t() + self.shift


def test_methods_share_a_folded_value_of_the_same_constants() -> None:
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    a = _Dequantize(0.0)
    b = _Dequantize(1.0)
    b.load_state_dict(a.state_dict())
    b.w, b.s, b.z = a.w, a.s, a.z  # the same tensors: stored once in the program
    x = torch.randn(2, 3)
    et = to_edge_transform_and_lower({"forward": torch.export.export(a, (x,)),
                                      "other": torch.export.export(b, (x,))}).to_executorch()
    program = Runtime.get().load_program(et.buffer)
    methods = [program.load_method(n) for n in ("forward", "other")]
    folded = []
    for m in methods:
        (k,) = _ops(m, "quantized_decomposed::dequantize_per_channel")
        assert m._calls[k] is _noop
        folded.append(m.value(m.plan.instructions[k].call.outputs[0]))
    with torch.no_grad():
        assert torch.equal(methods[0].execute(x)[0], a(x)) and torch.equal(methods[1].execute(x)[0], b(x))
    assert folded[0] is folded[1]  # the emitter stores the shared weight once; its float copy is kept once


def test_a_folded_instruction_that_fails_at_load_names_it(int8, monkeypatch) -> None:  # noqa: ANN001
    """Folding runs the instruction when the method loads: its failure is a KernelError naming the instruction
    and op there, as it would have been at the first run."""
    import edgetorch.runtime.ops as ops_module
    from edgetorch.errors import KernelError

    session, _ = int8
    real = ops_module.resolve_operator

    class Broken:
        def __init__(self, op) -> None:  # noqa: ANN001
            self._schema, self.tags, self._overloadname = op._schema, op.tags, op._overloadname

        def _op(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            raise RuntimeError("planted failure")

        def __str__(self) -> str:
            return "quantized_decomposed.dequantize_per_channel.default"

    def resolve(name: str, overload: str):  # noqa: ANN202
        op = real(name, overload)
        return Broken(op) if name == "quantized_decomposed::dequantize_per_channel" else op

    monkeypatch.setattr(ops_module, "resolve_operator", resolve)
    with pytest.raises(KernelError, match=r"instruction \d+ .*dequantize_per_channel.*planted failure"):
        Runtime.get().load_program(session.get_pte_buffer()).load_method("forward")
