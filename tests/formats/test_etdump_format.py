"""The .etdp format: serialize/deserialize round trips, and one typed error per kind of bad input."""

from __future__ import annotations

import random
import struct

import pytest
import torch

from edgetorch.errors import ETDumpFormatError, FormatError
from edgetorch.formats import etdump as ed
from edgetorch.formats.dtypes import DTYPE_TO_CODE


def _tensor(dtype: torch.dtype, sizes: list[int], offset: int) -> ed.Tensor:
    n = 1
    for s in sizes:
        n *= s
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.insert(0, acc)
        acc *= max(s, 1)
    return ed.Tensor(DTYPE_TO_CODE[dtype], sizes, strides, offset if n else -1, n * dtype.itemsize)


def _debug(value: ed.Value, k: int = 3, j: int = 0, **kw) -> ed.Event:
    return ed.Event(debug_event=ed.DebugEvent(0, k, debug_entry=value, output_index=j, name=f"node_{k}", **kw))


def sample_etdump() -> ed.ETDump:
    """An ETDump that uses every field and value type."""
    V, T = ed.ValueType, ed.ValueType.Tensor
    load = ed.RunData(ed.LOAD_BLOCK, "forward", events=[
        ed.Event(profile_event=ed.ProfileEvent(ed.METHOD_INIT, start_time=10, end_time=20)),
        ed.Event(profile_event=ed.ProfileEvent(ed.PROGRAM_LOAD_METHOD, start_time=5, end_time=25))])
    events = [
        ed.Event(profile_event=ed.ProfileEvent("native_call_addmm.out", 0, 1, start_time=100, end_time=150)),
        _debug(ed.Value(T, tensor=_tensor(torch.float32, [4, 16], 0)), k=1),
        ed.Event(profile_event=ed.ProfileEvent("DELEGATE_CALL", 0, 3, start_time=160, end_time=300)),
        ed.Event(profile_event=ed.ProfileEvent("7", 0, 3, delegate_debug_id_int=7, delegate_debug_metadata=b"\0\1x",
                                               start_time=170, end_time=180)),
        ed.Event(profile_event=ed.ProfileEvent("fused", 0, 3, delegate_debug_id_str="fused", start_time=2**40,
                                               end_time=2**40 + 1)),
        _debug(ed.Value(T, tensor=_tensor(torch.float16, [2, 3], 256))),
        _debug(ed.Value(T, tensor=_tensor(torch.bfloat16, [], 320)), j=1),
        _debug(ed.Value(T, tensor=_tensor(torch.bool, [0, 5], -1)), j=2),
        _debug(ed.Value(V.TensorList, tensor_list=[_tensor(torch.int64, [3], 384), _tensor(torch.uint8, [1], 448)])),
        _debug(ed.Value(V.TensorList, tensor_list=[])),
        _debug(ed.Value(V.Int, int_value=-(2**40)), delegate_debug_id_int=7),
        _debug(ed.Value(V.Bool, bool_value=True), delegate_debug_id_str="fused"),
        _debug(ed.Value(V.Float, float_value=0.5)),
        _debug(ed.Value(V.Double, double_value=0.1)),
        _debug(ed.Value(V.String, string_value="héllo")),
        _debug(ed.Value(V.Null)),
        ed.Event(debug_event=ed.DebugEvent(-1, -1, debug_entry=ed.Value(T, tensor=_tensor(torch.float32, [4], 512),
                                                                       output=True), name="out")),
        ed.Event(profile_event=ed.ProfileEvent(ed.METHOD_EXECUTE, start_time=90, end_time=400)),
    ]
    run = ed.RunData(ed.EXECUTE_BLOCK, "forward", 2, events)
    other = ed.RunData(ed.EXECUTE_BLOCK, "encode", -1, [])
    return ed.ETDump(program_hash="ab" * 32, run_data=[load, run, other], debug_buffer_bytes=576)


def test_round_trip_is_lossless_and_deterministic():
    e = sample_etdump()
    data = ed.serialize_etdump(e)
    assert data[8:12] == ed.FB_IDENTIFIER
    assert struct.unpack_from("<I", data, 0)[0] == len(data) - 4  # size prefix
    assert ed.deserialize_etdump(data) == e
    assert ed.deserialize_etdump(memoryview(data)) == e
    assert ed.deserialize_etdump(bytearray(data)) == e
    assert ed.serialize_etdump(ed.deserialize_etdump(data)) == data


def test_empty_etdump_round_trips():
    e = ed.ETDump()
    assert ed.deserialize_etdump(ed.serialize_etdump(e)) == e


@pytest.mark.parametrize("dtype", list(DTYPE_TO_CODE))
def test_every_dtype_code_round_trips(dtype):
    e = ed.ETDump(run_data=[ed.RunData("Execute", events=[_debug(ed.Value(ed.ValueType.Tensor,
                                                                          tensor=_tensor(dtype, [2, 2], 0)))])])
    got = ed.deserialize_etdump(ed.serialize_etdump(e))
    assert got == e
    assert got.run_data[0].events[0].debug_event.debug_entry.tensor.dtype == dtype


def test_truncated_files_raise_a_typed_error():
    data = ed.serialize_etdump(sample_etdump())
    for cut in [0, 3, 11, 12, 40, len(data) // 2, len(data) - 1]:
        with pytest.raises(ETDumpFormatError, match="truncated") as ei:
            ed.deserialize_etdump(data[:cut], path="x.etdp")
        assert ei.value.field == "size_prefix"
        assert ei.value.path == "x.etdp" and "x.etdp" in str(ei.value)
        assert isinstance(ei.value, FormatError)


def test_trailing_bytes_are_rejected():
    with pytest.raises(ETDumpFormatError, match="trailing") as ei:
        ed.deserialize_etdump(ed.serialize_etdump(sample_etdump()) + b"\0" * 8)
    assert ei.value.field == "size_prefix"


@pytest.mark.parametrize("ident,hint", [(b"XXXX", "not an edgetorch ETDump"), (b"ED00", "ExecuTorch"),
                                        (b"EDTP", "program")])
def test_wrong_identifier(ident, hint):
    data = bytearray(ed.serialize_etdump(sample_etdump()))
    data[8:12] = ident
    with pytest.raises(ETDumpFormatError, match=hint) as ei:
        ed.deserialize_etdump(bytes(data))
    assert ei.value.field == "file_identifier"
    assert repr(ident) in str(ei.value)


@pytest.mark.parametrize("version", [0, 2, 99])
def test_unknown_version(version):
    e = sample_etdump()
    e.version = version
    with pytest.raises(ETDumpFormatError, match=f"unsupported ETDump schema version {version}") as ei:
        ed.deserialize_etdump(ed.serialize_etdump(e))
    assert ei.value.field == "version"


def _with_tensor(t: ed.Tensor) -> bytes:
    return ed.serialize_etdump(ed.ETDump(run_data=[ed.RunData("Execute", events=[
        ed.Event(profile_event=ed.ProfileEvent("x")), _debug(ed.Value(ed.ValueType.Tensor, tensor=t))])]))


@pytest.mark.parametrize("tensor,fld,msg", [
    (ed.Tensor(6, [2, 3], [3, 1], 0, 23), "nbytes", "nbytes is 23"),
    (ed.Tensor(99, [2], [1], 0, 2), "scalar_type", "unknown scalar type code 99"),
    (ed.Tensor(6, [2], [1], 32, 8), "offset", "offset 32"),
    (ed.Tensor(6, [2], [1], -5, 8), "offset", "offset -5"),
    (ed.Tensor(6, [2, 2], [1], 0, 16), "strides", "2 sizes but 1 strides"),
    (ed.Tensor(6, [-2], [1], 0, 0), "sizes", "negative size"),
])
def test_inconsistent_tensor_fields_name_the_field(tensor, fld, msg):
    with pytest.raises(ETDumpFormatError, match=msg) as ei:
        ed.deserialize_etdump(_with_tensor(tensor))
    assert ei.value.field == f"run_data[0].events[1].debug_event.debug_entry.tensor.{fld}"


def test_event_must_hold_exactly_one_payload():
    with pytest.raises(ValueError, match="exactly one"):
        ed.serialize_etdump(ed.ETDump(run_data=[ed.RunData("Execute", events=[ed.Event()])]))


def test_deserialize_rejects_non_bytes():
    with pytest.raises(TypeError):
        ed.deserialize_etdump("not bytes")  # type: ignore[arg-type]


def test_corrupted_bytes_only_ever_raise_etdump_format_error():
    data = ed.serialize_etdump(sample_etdump())
    rng = random.Random(1234)
    raised = 0
    for _ in range(400):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            bad[rng.randrange(12, len(bad))] = rng.randrange(256)
        try:
            ed.deserialize_etdump(bytes(bad))
        except ETDumpFormatError as e:
            raised += 1
            assert e.field, e
    assert raised > 0
