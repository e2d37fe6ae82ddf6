"""The reference's ``.pte`` alone names what every instruction its runtime logged calls (issue 26): per method,
(chain, instruction) -> the kernel's operator or the delegate's backend, the key the reference's ETDump events
carry. Checked against every committed reference program's own ETDump (each profiled instruction's event name)
and ETRecord (the delegate calls and their backends); hostile programs raise typed errors."""

from __future__ import annotations

import random

import pytest

from edgetorch.devtools.etdump import read_etdump
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.errors import ProgramFormatError
from edgetorch.formats.handles import DELEGATE_CALL
from edgetorch.formats.program_executorch import is_executorch_program, read_executorch_program
from tests.devtools._reference_data import DATA

PROGRAMS = ["mlp_portable", "cnn_xnnpack", "llama_portable", "llama_xnnpack"]  # the committed programs


@pytest.mark.parametrize("name", PROGRAMS)
def test_instructions_name_every_logged_event(name: str) -> None:
    data = (DATA / f"{name}.pte").read_bytes()
    assert is_executorch_program(data)
    prog = read_executorch_program(data, name)
    ins = prog.instructions("forward")
    checked = 0
    for run in read_etdump(DATA / f"{name}.etdp").run_data:
        for e in run.events:
            pe = e.profile_event
            if pe is None or pe.instruction_id < 0 or pe.name == "OPERATOR_CALL" or pe.delegate_debug_id_int != -1 \
                    or pe.delegate_debug_id_str:
                continue  # framework events, the per-call overhead row, events inside a delegate
            assert ins[(pe.chain_index, pe.instruction_id)].event_name == pe.name, (name, pe.instruction_id)
            checked += 1
    assert checked == len(ins)  # every instruction ran and was profiled once
    groups = parse_etrecord(str(DATA / f"{name}_etrecord.bin")).handle_groups["forward"]
    calls = {g.instruction_id: g.backend for g in groups if g.kind == DELEGATE_CALL}
    assert calls == {i.index: i.target for i in ins.values() if i.kind == "delegate"}


def test_hostile_programs_raise_typed_errors() -> None:
    data = (DATA / "llama_xnnpack.pte").read_bytes()
    with pytest.raises(ProgramFormatError, match="identifier"):
        read_executorch_program(data[:4] + b"XX12" + data[8:])
    rng = random.Random(26)
    typed = 0
    for _ in range(300):
        bad = bytearray(data[:8192])  # the program's tables lie before its weights
        for _ in range(rng.randint(1, 6)):
            bad[rng.randrange(8, len(bad))] = rng.randrange(256)
        try:
            read_executorch_program(bytes(bad))
        except ProgramFormatError:
            typed += 1
    assert typed > 0


@pytest.mark.parametrize("name", PROGRAMS)
def test_inspector_with_the_pte_alone(name: str) -> None:
    """Without the ETRecord, ``etrecord=<the .pte>`` still gives the event blocks: the same events, names and
    delegate backends as with the reference's ETRecord, each kernel event's ``op_types`` naming the operator
    its instruction calls; the numeric gap asks for what it lacks (a typed error)."""
    from edgetorch.devtools import Inspector
    from edgetorch.errors import InspectorError
    from tests.devtools._reference_data import debug_buffer

    kw = {"etdump_path": str(DATA / f"{name}.etdp"), "debug_buffer_path": str(debug_buffer(name))}
    alone = Inspector(etrecord=str(DATA / f"{name}.pte"), **kw)
    full = Inspector(etrecord=str(DATA / f"{name}_etrecord.bin"), **kw)
    kernels = 0
    for b, fb in zip(alone.event_blocks, full.event_blocks, strict=True):
        assert [(e.name, e.delegate_backend_name, e.is_delegated_op) for e in b.events] == \
            [(e.name, e.delegate_backend_name, e.is_delegated_op) for e in fb.events]
        for e in b.events:
            if e.name.startswith("native_call_"):
                op = e.name.removeprefix("native_call_").split(".")[0]
                assert e.op_types == [f"aten::{op}"], (e.name, e.op_types)
                kernels += 1
            if e.name == "DELEGATE_CALL":
                assert e.delegate_backend_name == "XnnpackBackend" and e.op_types
    assert kernels or "xnnpack" in name
    assert len(alone.to_dataframe()) == len(full.to_dataframe())
    with pytest.raises(InspectorError):
        alone.calculate_numeric_gap("MSE")
