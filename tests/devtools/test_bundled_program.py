"""BundledProgram: validation, .bpte round trip (bit-exact, every dtype), runtime loading, ETRecord hook."""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from edgetorch.devtools.bundled_program import (
    BundledInputMismatchError,
    BundledMethodNotFoundError,
    BundledOutputMismatchError,
    BundledProgram,
    BundledProgramError,
    BundledProgramFormatError,
    InvalidTestCaseError,
    MethodTestCase,
    MethodTestSuite,
    deserialize_from_flatbuffer_to_bundled_program,
    load_bundled_program,
    serialize_from_bundled_program_to_flatbuffer,
)
from edgetorch.errors import FormatError
from edgetorch.exir import to_edge, to_edge_transform_and_lower
from edgetorch.formats import bundled_program as bpf
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime


class AllDtypes(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, a, h, bf, i, b):
        return a @ self.w + h.float() + bf.float(), i * 2, b.logical_not(), h * 2, bf + 1


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g).half(),
            torch.randn(2, 4, generator=g).bfloat16(), torch.randint(-2**40, 2**40, (2, 4), generator=g),
            torch.rand(2, 4, generator=g) > 0.5)


@pytest.fixture(scope="module")
def all_dtypes():
    model = AllDtypes().eval()
    ins = _inputs()
    et = to_edge(torch.export.export(model, ins)).to_executorch()
    return model, ins, et


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same_bits(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            _bits(a), _bits(b))
    return type(a) is type(b) and a == b


def _bundle(model, et, n_cases: int = 2, nan: bool = False) -> BundledProgram:
    cases = []
    for k in range(n_cases):
        ins = _inputs(k)
        with torch.no_grad():
            out = model(*ins)
        if nan:
            out = (out[0].clone().index_fill_(1, torch.tensor([0]), float("nan")), *out[1:])
        cases.append(MethodTestCase(ins, out))
    cases.append(MethodTestCase(_inputs(9)))  # profiling-only case, no expected outputs
    return BundledProgram(et, [MethodTestSuite("forward", cases)])


def test_round_trip_bit_exact_every_dtype(all_dtypes):
    model, _, et = all_dtypes
    bp = _bundle(model, et, nan=True)
    data = serialize_from_bundled_program_to_flatbuffer(bp)
    back = deserialize_from_flatbuffer_to_bundled_program(data)
    assert isinstance(back, BundledProgram)
    assert bytes(back.program_buffer) == et.buffer
    assert [s.method_name for s in back.method_test_suites] == ["forward"]
    got, want = back.method_test_suites[0].test_cases, bp.method_test_suites[0].test_cases
    assert len(got) == len(want) == 3
    dtypes = set()
    for g, w in zip(got, want):
        assert len(g.inputs) == len(w.inputs) == 5
        assert all(_same_bits(a, b) for a, b in zip(g.inputs, w.inputs))
        if w.expected_outputs is None:
            assert g.expected_outputs is None
        else:
            assert all(_same_bits(a, b) for a, b in zip(g.expected_outputs, w.expected_outputs))
            dtypes |= {t.dtype for t in g.expected_outputs}
    assert dtypes == {torch.float32, torch.int64, torch.bool, torch.float16, torch.bfloat16}
    assert torch.isnan(got[0].expected_outputs[0][:, 0]).all()  # NaN payloads survive
    assert serialize_from_bundled_program_to_flatbuffer(back) == data  # stable encoding


def test_format_round_trip_scalars_and_odd_tensors():
    et = to_edge(torch.export.export(torch.nn.Linear(3, 2), (torch.randn(1, 3),))).to_executorch()
    tensors = [torch.tensor(2.5), torch.empty(0, 3), torch.randint(-100, 100, (3, 5), dtype=torch.int8),
               torch.randint(0, 255, (7,), dtype=torch.uint8), torch.randn(2, 3, dtype=torch.float64),
               torch.randint(-9, 9, (4,), dtype=torch.int32), torch.randn(4, 3)[:, 1]]  # non-contiguous
    values = [bpf.tensor_from_torch(t) for t in tensors] + [7, -2**62, 0.1, True, False]
    bundle = bpf.BundleDef(et.buffer, [bpf.TestSuiteDef("forward", [bpf.TestCaseDef(values, [3.5, 1])]),
                                       bpf.TestSuiteDef("zz", [])])
    data = bpf.serialize_bundle(bundle)
    back = bpf.read_bundle(data)
    vals = back.suites[0].test_cases[0].inputs
    for t, v in zip(tensors, vals):
        assert _same_bits(bpf.tensor_to_torch(v), t)
    assert vals[len(tensors):] == [7, -2**62, 0.1, True, False]
    assert [type(v) for v in vals[-2:]] == [bool, bool]
    assert back.suites[0].test_cases[0].expected_outputs == [3.5, 1]
    assert back.suites[1].method_name == "zz" and back.suites[1].test_cases == []
    # layout: the .pte starts 64-byte aligned and is stored verbatim; tensor data is 64-byte aligned
    h = bpf.read_header(data)
    assert h.program_offset % 64 == 0 and h.data_offset % 64 == 0
    assert data[h.program_offset:h.program_offset + h.program_size] == et.buffer


def test_runtime_loads_bpte_like_pte_zero_copy(all_dtypes, tmp_path):
    model, ins, et = all_dtypes
    bp = _bundle(model, et)
    bpte, pte = tmp_path / "m.bpte", tmp_path / "m.pte"
    bp.save(bpte)
    et.save(pte)
    rt = Runtime.get()
    p_bundle, p_plain = rt.load_program(str(bpte)), rt.load_program(str(pte))
    assert p_bundle.content_hash == p_plain.content_hash == et.content_hash
    out_b = p_bundle.load_method("forward").execute_structured(*ins)
    out_p = p_plain.load_method("forward").execute_structured(*ins)
    assert all(_same_bits(a, b) for a, b in zip(out_b, out_p))
    assert all(_same_bits(a, b) for a, b in zip(rt.load_program(bpte.read_bytes()).load_method("forward")
                                               .execute_structured(*ins), out_p))
    # constants are views of the mapped .bpte file, not copies, and stay 64-byte aligned
    buf = p_bundle._loaded.buffer
    assert isinstance(buf, memoryview) and isinstance(buf.obj, mmap.mmap)
    file_base = torch.frombuffer(buf.obj, dtype=torch.uint8).data_ptr()
    header = bpf.read_header(buf.obj)
    method = p_bundle.load_method("forward")
    plan = method.plan
    consts = [vid for vid, v in enumerate(plan.values)
              if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_CONSTANT]
    assert consts
    for vid in consts:
        v = plan.values[vid]
        off, _ = p_bundle._loaded.program.constants[v.constant_index]
        ptr = method.value(vid).data_ptr()
        assert ptr == file_base + header.program_offset + p_bundle._loaded.segment_base + off
        assert ptr % 64 == 0
    # embedded_program: .pte unchanged, .bpte a zero-copy slice
    raw = pte.read_bytes()
    assert bpf.embedded_program(raw) is raw
    view = bpf.embedded_program(bpte.read_bytes())
    assert isinstance(view, memoryview) and bytes(view) == raw


def test_corrupt_bundles_raise_format_errors(all_dtypes, tmp_path):
    model, _, et = all_dtypes
    data = serialize_from_bundled_program_to_flatbuffer(_bundle(model, et))
    h = bpf.read_header(data)
    with pytest.raises(BundledProgramFormatError, match="truncated") as e:
        Runtime.get().load_program(data[:h.program_offset + 100])
    assert e.value.field == "header.program_size"
    bad = bytearray(data)
    bad[h.data_offset + 3] ^= 0xFF  # flip a bit of a test-case tensor
    with pytest.raises(BundledProgramFormatError, match="checksum") as e:
        deserialize_from_flatbuffer_to_bundled_program(bytes(bad))
    assert e.value.field == "header.digest"
    bad = bytearray(data)
    bad[8] = 9  # header version
    with pytest.raises(FormatError, match="header version"):
        Runtime.get().load_program(bytes(bad))
    bad = bytearray(data)
    bad[h.program_offset:h.program_offset + 8] = b"XXXXXXXX"
    with pytest.raises(BundledProgramFormatError, match="embedded program") as e:
        Runtime.get().load_program(bytes(bad))
    assert e.value.field == "program"
    path = tmp_path / "trunc.bpte"
    path.write_bytes(data[:60])
    with pytest.raises(FormatError, match="trunc.bpte"):  # too short for any header: named by the .pte reader
        Runtime.get().load_program(str(path))
    with pytest.raises(BundledProgramFormatError, match="not an edgetorch bundled program"):
        bpf.read_bundle(et.buffer[:8].replace(b"EDGTPROG", b"garbage!") + bytes(200))


def test_validation_errors(all_dtypes):
    model, ins, et = all_dtypes
    with torch.no_grad():
        out = model(*ins)
    with pytest.raises(BundledMethodNotFoundError, match="no method 'encode'") as e:
        BundledProgram(et, [MethodTestSuite("encode", [MethodTestCase(ins)])])
    assert e.value.method_name == "encode"
    with pytest.raises(BundledInputMismatchError, match=r"test case 1: 4 input\(s\) given, method 'forward' takes 5"):
        BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(ins), MethodTestCase(ins[:4])])])
    wrong_dtype = (ins[0].double(), *ins[1:])
    with pytest.raises(BundledInputMismatchError, match=r"input 0 \('a'\) has the wrong dtype") as e:
        BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(wrong_dtype)])])
    assert (e.value.method_name, e.value.test_case, e.value.index) == ("forward", 0, 0)
    with pytest.raises(BundledInputMismatchError, match="input 3 .* wrong shape"):
        BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase((*ins[:3], ins[3][:1], ins[4]))])])
    with pytest.raises(BundledInputMismatchError, match="wrong type: a int"):
        BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase((*ins[:4], 1))])])
    with pytest.raises(BundledOutputMismatchError, match=r"4 expected output\(s\) given, method 'forward' returns 5"):
        BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(ins, out[:4])])])
    with pytest.raises(BundledOutputMismatchError, match="expected output 1 has the wrong dtype") as e:
        BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(ins, (out[0], out[1].int(), *out[2:]))])])
    assert e.value.index == 1
    with pytest.raises(BundledMethodNotFoundError, match="two method test suites"):
        BundledProgram(et, [MethodTestSuite("forward", []), MethodTestSuite("forward", [])])
    with pytest.raises(InvalidTestCaseError, match="input 1 is None"):
        MethodTestCase((ins[0], None))
    with pytest.raises(InvalidTestCaseError, match="is a str"):
        MethodTestCase(("x",))


def test_multi_method_nested_outputs_and_sources(tmp_path):
    from edgetorch.models import get_spec, method_module

    spec = get_spec("two_method")
    model = spec.build()
    inputs = spec.example_inputs()
    eps = {m: torch.export.export(method_module(model, m), inputs[m]) for m in ("forward", "encode")}
    et = to_edge(eps).to_executorch()
    with torch.no_grad():
        suites = [MethodTestSuite("forward", [MethodTestCase(inputs["forward"], [model(*inputs["forward"])])]),
                  MethodTestSuite("encode", [MethodTestCase([inputs["encode"][0]],
                                                            {"z": model.encode(*inputs["encode"])})])]
    bp = BundledProgram(et, suites)
    assert [s.method_name for s in bp.method_test_suites] == ["encode", "forward"]  # sorted
    path = tmp_path / "two.pte"
    et.save(path)
    from_path = BundledProgram(None, suites, pte_file_path=path)
    from_bytes = BundledProgram(et.buffer, suites)
    assert from_path.to_bytes() == from_bytes.to_bytes() == bp.to_bytes()
    bp.save(tmp_path / "two.bpte")
    back = load_bundled_program(tmp_path / "two.bpte")
    prog = Runtime.get().load_program(str(tmp_path / "two.bpte"))
    for s in back.method_test_suites:
        tc = s.test_cases[0]
        got = prog.load_method(s.method_name).execute_structured(*tc.inputs)
        assert torch.allclose(got, tc.expected_outputs[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(BundledProgramError, match="exactly one"):
        BundledProgram(et, suites, pte_file_path=path)


def test_etrecord_takes_inputs_and_outputs_from_bundle(tmp_path):
    from edgetorch.devtools.etrecord import parse_etrecord

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    cases = [(torch.randn(1, 8),), (torch.randn(1, 8),)]
    et = to_edge_transform_and_lower(torch.export.export(model, cases[0]), generate_etrecord=True).to_executorch()
    with torch.no_grad():
        bp = BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(c, model(*c)) for c in cases])])
    rec = et.get_etrecord()
    rec.update_representative_inputs(bp)
    rec.update_reference_outputs(bp)
    rec.save(tmp_path / "etrecord.bin")
    back = parse_etrecord(tmp_path / "etrecord.bin")
    reps = back.representative_inputs["forward"]
    refs = back.reference_outputs["forward"]
    assert len(reps) == len(refs) == 2
    for (x,), c, r in zip(reps, cases, refs):
        assert torch.equal(x, c[0])
        got = r[0] if isinstance(r, (list, tuple)) else r
        assert torch.equal(got, model(c[0]).detach())


def test_save_is_atomic_and_readable(all_dtypes, tmp_path):
    model, _, et = all_dtypes
    bp = _bundle(model, et)
    path = tmp_path / "sub" / "b.bpte"
    bp.save(path)
    assert path.read_bytes() == bp.to_bytes()
    assert [f for f in os.listdir(path.parent)] == ["b.bpte"]  # no temp file left behind
