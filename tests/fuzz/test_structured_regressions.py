"""Regressions found by the structure-aware campaign (``bench/fuzz_structured.py``, issue 23): each is one
semantic edit of a valid artifact with every hash, manifest and CRC recomputed, which used to end in a generic
exception (or worse); each must now be refused with a typed error naming the field, op or node at fault, or run
exactly as the unedited artifact."""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.errors import ETRecordFormatError, ProgramFormatError
from edgetorch.models import get_model
from edgetorch.runtime import Runtime, Verification
from tests.fuzz import structured
from tests.fuzz.fuzzlib import reseal_etrecord
from tests.fuzz.pte_edit import edit


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, str]:
    return structured.build_artifacts(str(tmp_path_factory.mktemp("sfuzz-reg")))


def _run(data: bytes, inputs: tuple, level: Verification) -> list:
    return Runtime.get().load_program(data, verification=level).load_method("forward").execute(*inputs)


@pytest.mark.parametrize("level", list(Verification))
@pytest.mark.parametrize("kind", ["mlp", "cnn_ort"])
@pytest.mark.parametrize("delta", [3, -1])
def test_an_arena_size_that_is_not_a_whole_number_of_elements_is_typed_or_runs_as_the_original(
        artifacts, kind, level, delta):
    """``arena_size`` moved off a whole number of float elements: ``Tensor.view`` of the arena used to raise a
    generic RuntimeError at load (mutant 87 of the ORT program, under InternalConsistency), and under Minimal a
    slot past the arena's end a generic ``setStorage`` error. The size is refused with a typed error naming it or
    the value it cuts off, or the float slots lie in the whole elements and the program runs as the original."""
    data = open(artifacts[kind], "rb").read()
    inputs = get_model(structured.MODELS[kind])[1]
    want = _run(data, inputs, Verification.Full)

    def resize(prog) -> None:
        prog.plans[0].arena_size += delta

    try:
        got = _run(edit(data, resize), inputs, level)
    except ProgramFormatError as e:
        assert "arena" in str(e) or "lies outside its storage" in str(e), e
        assert e.field.startswith("forward."), e.field
        return
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def _edited_reference(data: bytes, edit_nodes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        entries = {i.filename: z.read(i) for i in z.infolist()}
        infos = z.infolist()
    doc = json.loads(entries["reference/0.json"])
    edit_nodes({n["name"]: n for n in doc["nodes"]})
    entries["reference/0.json"] = json.dumps(doc).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for i in infos:
            z.writestr(i, entries[i.filename])
    return reseal_etrecord(out.getvalue())


def _moved_arg(nodes) -> None:  # fc2's linear reads the input x (1x64) where it reads relu (1x256)
    nodes["linear_1"]["args"][0] = {"node": "x"}


def _swapped_target(nodes) -> None:  # an allowed op of another schema: bmm(self, mat2) given (x, w, b)
    nodes["linear_1"]["target"] = "aten::bmm.default"


@pytest.mark.parametrize("change", [_moved_arg, _swapped_target])
def test_a_reference_graph_node_that_fails_on_its_arguments_is_a_typed_error(artifacts, tmp_path, change):
    """A reference-graph node given arguments its op cannot take (a moved argument, a target swapped for an
    allowed op of another schema) used to end in torch's generic RuntimeError from ``numeric_gap``'s walk."""
    path = tmp_path / "etrecord.bin"
    path.write_bytes(_edited_reference(open(artifacts["etrecord"], "rb").read(), change))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        insp = Inspector(etdump_path=artifacts["etdump"], etrecord=str(path),
                         debug_buffer_path=artifacts["debug_buffer"])
        with pytest.raises(ETRecordFormatError, match="reference graph is inconsistent: node 'linear_1'") as ei:
            insp.calculate_numeric_gap("MSE")
    assert ei.value.field == "reference graph node linear_1"


@pytest.mark.parametrize("level", list(Verification))
def test_a_delegate_output_slot_edited_into_a_broadcast_is_refused_when_the_values_differ(artifacts, level):
    """The ORT program's output slot [1, 10] given strides [1, 0] (a broadcast, as ``expand`` outputs are): the
    backend stored the first logit only and the method returned it ten times, no error (mutant 3299 of the ORT
    program). The delegate's values differ along the broadcast dimension: typed error naming the output."""
    data = open(artifacts["cnn_ort"], "rb").read()
    inputs = get_model("small_cnn")[1]

    def broadcast(prog) -> None:
        v = prog.plans[0].values[prog.plans[0].outputs[0]]
        v.strides = [1, 0]

    with pytest.raises(ProgramFormatError, match="planned as a broadcast along dims \\[1\\]") as ei:
        _run(edit(data, broadcast), inputs, level)
    assert ei.value.field.endswith(".strides")


def _etdump_edit(artifacts, change) -> bytes:
    from edgetorch.formats import etdump as ed

    doc = ed.deserialize_etdump(open(artifacts["etdump"], "rb").read())
    events = [e.debug_event for r in doc.run_data for e in r.events if e.debug_event is not None
              and e.debug_event.instruction_id >= 0]
    change(events)
    return ed.serialize_etdump(doc)


def _dtype(events) -> None:  # float32 -> int32: same byte count, the nbytes check passes
    events[0].debug_entry.tensor.scalar_type = 3


def _shape(events) -> None:  # [1, 256] -> [2, 128] with contiguous strides and the same bytes
    t = events[0].debug_entry.tensor
    t.sizes, t.strides = [2, 128], [128, 1]


def _strides(events) -> None:
    events[0].debug_entry.tensor.strides = [256, 2]


def _offset(events) -> None:  # relu's value read from addmm's bytes (same size)
    events[1].debug_entry.tensor.offset = events[0].debug_entry.tensor.offset


def _instruction(events) -> None:  # relu's value logged under the instruction of addmm_1
    events[1].instruction_id = events[2].instruction_id


def _delegate_id(events) -> None:
    events[0].delegate_debug_id_int = 3


@pytest.mark.parametrize("change, field", [(_dtype, "tensor"), (_shape, "tensor"), (_strides, "strides"),
                                           (_offset, "offset"), (_instruction, "instruction_id"),
                                           (_delegate_id, "delegate_debug_id_int")])
def test_an_etdump_value_that_contradicts_the_runtime_or_the_etrecord_is_refused(artifacts, change, field):
    """A logged value's dtype, shape, strides, offset, instruction or delegate id edited (the ETDump has no
    checksum; the debug buffer's CRC still holds): 46 of 100 dtype edits used to change the gap table silently.
    Each contradicts how the runtime logs values or what the ETRecord's op produces: ``ETDumpFormatError`` naming
    the event's field."""
    from edgetorch.errors import ETDumpFormatError

    data = _etdump_edit(artifacts, change)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ETDumpFormatError) as ei:
            Inspector(etdump_data=data, etrecord=artifacts["etrecord"],
                      debug_buffer_path=artifacts["debug_buffer"]).calculate_numeric_gap("MSE")
    assert ei.value.field.endswith(field), ei.value.field


def test_a_reference_attribute_moved_onto_another_attributes_bytes_is_refused(artifacts, tmp_path):
    """fc3's weight offset moved 64 bytes on (aligned, so the alignment check passes) overlaps its bias: every
    weight of the row shifted, and the gap table changed with no error (campaign mutants 57 and 81)."""
    data = open(artifacts["etrecord"], "rb").read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        entries = {i.filename: z.read(i) for i in z.infolist()}
        infos = z.infolist()
    doc = json.loads(entries["reference/0.json"])
    a = next(a for a in doc["attrs"] if a["name"] == "p_fc3_weight")
    a["tensor"]["offset"] += 64
    entries["reference/0.json"] = json.dumps(doc).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for i in infos:
            z.writestr(i, entries[i.filename])
    path = tmp_path / "etrecord.bin"
    path.write_bytes(reseal_etrecord(out.getvalue()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ETRecordFormatError, match="overlap the bytes"):
            Inspector(etdump_path=artifacts["etdump"], etrecord=str(path),
                      debug_buffer_path=artifacts["debug_buffer"]).calculate_numeric_gap("MSE")


def _meta_dtype(nodes) -> None:  # the record says relu computes int32
    nodes["relu"]["meta"]["val"]["dtype"] = "int32"


def test_a_reference_node_whose_record_contradicts_what_it_computes_is_refused(artifacts, tmp_path):
    """A reference node's recorded value (``meta.val``) edited: the walk pairs runtime values by it, so the gap
    table changed with no error (campaign mutant 16 of seed 0)."""
    path = tmp_path / "etrecord.bin"
    path.write_bytes(_edited_reference(open(artifacts["etrecord"], "rb").read(), _meta_dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        insp = Inspector(etdump_path=artifacts["etdump"], etrecord=str(path),
                         debug_buffer_path=artifacts["debug_buffer"])
        with pytest.raises(ETRecordFormatError, match="node 'relu' .* computes float32\\[1, 256\\], its record says "
                                                      "int32"):
            insp.calculate_numeric_gap("MSE")


@pytest.mark.parametrize("what", ["kernel without instruction", "input under an instruction"])
def test_an_event_moved_off_its_instruction_or_an_input_moved_onto_one_is_refused(artifacts, what):
    """Silent gap changes the campaign found after the value checks: a kernel's event given instruction id -1
    (neither input nor output), or the method input's event given a kernel's instruction id."""
    from edgetorch.errors import ETDumpFormatError
    from edgetorch.formats import etdump as ed

    doc = ed.deserialize_etdump(open(artifacts["etdump"], "rb").read())
    events = [e.debug_event for r in doc.run_data for e in r.events if e.debug_event is not None]
    if what == "kernel without instruction":
        next(d for d in events if d.instruction_id >= 0).instruction_id = -1
        match = "names no instruction|ran but logged no value"
    else:
        next(d for d in events if ed.is_input_event(d)).instruction_id = 3
        match = "named as a method input but logged under instruction 3"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ETDumpFormatError, match=match) as ei:
            Inspector(etdump_data=ed.serialize_etdump(doc), etrecord=artifacts["etrecord"],
                      debug_buffer_path=artifacts["debug_buffer"])
    assert ei.value.field.endswith("instruction_id")


def test_a_dropped_debug_event_is_refused(artifacts):
    """One kernel's debug event removed from the ETDump (its profile event kept): its row vanished from the gap
    table with no error (30 of the campaign's 10,000 ETDump mutants)."""
    from edgetorch.errors import ETDumpFormatError
    from edgetorch.formats import etdump as ed

    doc = ed.deserialize_etdump(open(artifacts["etdump"], "rb").read())
    run = next(r for r in doc.run_data if any(e.debug_event is not None for e in r.events))
    i = next(i for i, e in enumerate(run.events) if e.debug_event is not None and e.debug_event.name == "relu")
    del run.events[i]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ETDumpFormatError, match=r"instruction 2 \('native_call_relu.out'\) ran but logged no "
                                                    "value") as ei:
            Inspector(etdump_data=ed.serialize_etdump(doc), etrecord=artifacts["etrecord"],
                      debug_buffer_path=artifacts["debug_buffer"])
    assert ei.value.field.endswith("profile_event.instruction_id")


def test_a_value_moved_to_a_view_instruction_of_the_same_handle_is_refused(artifacts):
    """addmm's event moved from instruction 1 to instruction 0 (the permute of the same debug handle, a view the
    tracer never logs): the ETRecord's handles agree, the gap table's instruction changed silently (24 of the
    campaign's 10,000 ETDump mutants). The run timed no instruction 0."""
    from edgetorch.errors import ETDumpFormatError
    from edgetorch.formats import etdump as ed

    doc = ed.deserialize_etdump(open(artifacts["etdump"], "rb").read())
    d = next(e.debug_event for r in doc.run_data for e in r.events if e.debug_event is not None
             and e.debug_event.name == "addmm")
    d.instruction_id = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ETDumpFormatError, match="logged under instruction 0, which the run never timed|ran but "
                                                    "logged no value"):
            Inspector(etdump_data=ed.serialize_etdump(doc), etrecord=artifacts["etrecord"],
                      debug_buffer_path=artifacts["debug_buffer"])


@pytest.mark.parametrize("level", list(Verification))
def test_a_batch_norm_argument_moved_to_a_number_is_a_typed_error(level):
    """small_cnn's batch-norm input or statistic moved to a scalar value of the plan (the schema's Tensor admits a
    Python number): the shape rule called ``.dim()`` on it, a generic AttributeError (13 of the campaign's
    10,000 small_cnn mutants)."""
    from edgetorch.formats import program as pf
    from tests.fuzz.pte_edit import decode

    model, inputs = get_model("small_cnn")
    data = structured_lower(model, inputs)
    p = decode(data)[0].plans[0]
    k = next(k for k, ins in enumerate(p.instructions) if isinstance(ins.call, pf.KernelCallDef)
             and "batch_norm" in p.operators[ins.call.op_index].name)
    number = next(i for i, v in enumerate(p.values) if isinstance(v, float) and not isinstance(v, bool))
    for j in (0, 3):
        def mutate(prog, j=j) -> None:
            prog.plans[0].instructions[k].call.args[j] = number

        with pytest.raises(ProgramFormatError, match="must be a tensor|has a float"):
            _run(edit(data, mutate), inputs, level)


def structured_lower(model, inputs) -> bytes:
    from tests.conftest import lower

    return lower(model, inputs).buffer
