"""Bad program files and bad inputs: each gives its own clear, typed error."""

from __future__ import annotations

import struct

import pytest
import torch

from edgetorch.errors import MethodNotFoundError, ProgramFormatError, RuntimeInputError
from edgetorch.formats import program as pf
from edgetorch.models import get_model
from edgetorch.runtime import Runtime, Verification
from tests.conftest import lower


@pytest.fixture(scope="module")
def program_bytes():
    model, inputs = get_model("small_cnn")
    return lower(model, inputs).buffer, inputs


def _load(data, **kw):
    return Runtime.get().load_program(data, **kw)


def test_truncated_file(program_bytes):
    data, _ = program_bytes
    with pytest.raises(ProgramFormatError, match="truncated"):
        _load(data[:64])
    with pytest.raises(ProgramFormatError, match="truncated"):
        _load(data[: len(data) - 100])


def test_wrong_magic_and_identifier(program_bytes):
    data, _ = program_bytes
    with pytest.raises(ProgramFormatError, match="not an edgetorch program"):
        _load(b"PK\x03\x04" + data[4:])
    bad = bytearray(data)
    bad[pf.HEADER_SIZE + 4:pf.HEADER_SIZE + 8] = b"XXXX"
    with pytest.raises(ProgramFormatError, match="identifier") as e:
        _load(bytes(bad), verification=Verification.Minimal)
    assert e.value.field == "flatbuffer.identifier"


def test_unknown_version(program_bytes):
    data, _ = program_bytes
    bad = bytearray(data)
    struct.pack_into("<I", bad, 12, 99)
    with pytest.raises(ProgramFormatError, match="schema version 99"):
        _load(bytes(bad))


def _rewrite(data: bytes, mutate) -> bytes:
    header = pf.read_header(data)
    prog = pf.decode_flatbuffer(data[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size])
    mutate(prog)
    seg = data[header.segment_offset:header.segment_offset + header.segment_size]
    return b"".join(bytes(p) for p in pf.build_file_parts(prog, [seg]))


def test_out_of_bounds_constant_offset(program_bytes):
    data, _ = program_bytes

    def mutate(prog):
        off, size = prog.constants[0]
        prog.constants[0] = (off + 10**9, size)

    bad = _rewrite(data, mutate)
    with pytest.raises(ProgramFormatError, match="constant 0") as e:
        _load(bad)
    assert e.value.field == "constants[0]"


def test_out_of_bounds_value_index_and_arena_offset(program_bytes):
    data, _ = program_bytes

    def bad_index(prog):
        prog.plans[0].instructions[0].call.args[0] = 10**6

    with pytest.raises(ProgramFormatError, match="refers to value 1000000"):
        _load(_rewrite(data, bad_index))

    def bad_arena(prog):
        p = prog.plans[0]
        t = next(v for v in p.values if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED)
        t.arena_offset = p.arena_size + 64

    with pytest.raises(ProgramFormatError, match="arena"):
        _load(_rewrite(data, bad_arena))


def test_garbage_flatbuffer_is_a_format_error(program_bytes):
    data, _ = program_bytes
    bad = bytearray(data)
    for i in range(pf.HEADER_SIZE + 8, pf.HEADER_SIZE + 200):
        bad[i] = 0xFF
    with pytest.raises(ProgramFormatError):
        _load(bytes(bad))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pte"):
        _load(tmp_path / "nope.pte")


def test_unknown_method(program_bytes):
    data, _ = program_bytes
    with pytest.raises(MethodNotFoundError, match="'decode'.*forward"):
        _load(data).load_method("decode")


def test_wrong_inputs_name_the_input(program_bytes):
    data, inputs = program_bytes
    m = _load(data).load_method("forward")
    with pytest.raises(RuntimeInputError, match="expects 1 input"):
        m.execute(inputs[0], inputs[0])
    with pytest.raises(RuntimeInputError, match="'x'.*shape"):
        m.execute(torch.randn(1, 3, 16, 16))
    with pytest.raises(RuntimeInputError, match="'x'.*dtype"):
        m.execute(inputs[0].double())
    with pytest.raises(RuntimeInputError, match="'x'.*tensor"):
        m.execute([3])
