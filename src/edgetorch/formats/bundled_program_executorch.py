"""Reader of the reference ExecuTorch's bundled program (.bpte, flatbuffer identifier "BP08"): its test suites and
the embedded reference program, mapped onto edgetorch's in-memory mirror (``formats.bundled_program.BundleDef``).

Layout (schema ``bundled_program_schema.fbs``, version 2): a flatbuffer (root offset, then "BP08"; not size-
prefixed); root ``BundledProgram{version, method_test_suites, program: [ubyte]}``; ``BundledMethodTestSuite{
method_name, test_cases}``; ``BundledMethodTestCase{inputs: [Value], expected_outputs: [Value]}``; ``Value{val:
ValueUnion}`` (a union: Tensor 1, Int 2, Bool 3, Double 4); ``Tensor{scalar_type, sizes: [int], data: [ubyte],
dim_order: [ubyte]}``, ``data`` laid out in ``dim_order`` (``tensor_values`` restores the logical layout).
Every table, vector and string is bounds-checked (``formats._fbread.Table``); the data of a tensor must have
exactly its size; errors are ``BundledProgramFormatError`` naming the field. The embedded program is the
reference's ``.pte`` (identifier "ET12"), kept as bytes: edgetorch does not run it.
"""

from __future__ import annotations

import struct
from typing import Any

from edgetorch.formats._fbread import Table
from edgetorch.formats.bundled_program import (
    BundleDef,
    BundledProgramFormatError,
    TensorData,
    TestCaseDef,
    TestSuiteDef,
)
from edgetorch.formats.dtypes import CODE_TO_DTYPE
from edgetorch.formats.errors import ProgramFormatError

__all__ = ["FB_IDENTIFIER", "SCHEMA_VERSIONS", "PTE_IDENTIFIER", "is_executorch_bundle", "read_executorch_bundle",
           "tensor_value"]

FB_IDENTIFIER = b"BP08"
SCHEMA_VERSIONS = (2,)  #: BUNDLED_PROGRAM_SCHEMA_VERSION of the reference
PTE_IDENTIFIER = b"ET12"
_TENSOR, _INT, _BOOL, _DOUBLE = 1, 2, 3, 4
_MAX_RANK = 64


def is_executorch_bundle(data: Any) -> bool:
    """True when ``data`` carries the reference's bundled-program identifier (bytes [4, 8))."""
    mv = memoryview(data)
    return mv.nbytes >= 8 and bytes(mv[4:8]) == FB_IDENTIFIER


class _Reader:
    def __init__(self, path: str | None) -> None:
        self.path, self.at = path, "root"

    def fail(self, msg: str, fld: str) -> BundledProgramFormatError:
        return BundledProgramFormatError(f"{self.path or 'bundled program'}: ExecuTorch bundled program: {fld}: "
                                         f"{msg}", field=fld, path=self.path)

    def tensor(self, t: Table, at: str) -> TensorData:
        code = t.scalar(0, "b")
        if code not in CODE_TO_DTYPE:
            raise self.fail(f"unknown scalar type code {code}", f"{at}.scalar_type")
        sizes = t.scalars(1, "i")
        if len(sizes) > _MAX_RANK or any(s < 0 for s in sizes):
            raise self.fail(f"sizes {sizes[:8]} are not a shape", f"{at}.sizes")
        order = list(t.raw(3)) or list(range(len(sizes)))
        if sorted(order) != list(range(len(sizes))):
            raise self.fail(f"dim order {order} is not a permutation of {len(sizes)} dims", f"{at}.dim_order")
        data = t.raw(2)
        numel = 1
        for s in sizes:
            numel *= s
        want = numel * CODE_TO_DTYPE[code].itemsize
        if len(data) != want:
            raise self.fail(f"{len(data)} data bytes, but {CODE_TO_DTYPE[code]} {sizes} has {want}", f"{at}.data")
        return TensorData(code, sizes, data, order)

    def value(self, v: Table, at: str) -> Any:
        self.at = at
        kind, body = v.scalar(0, "B"), v.table(1)
        if body is None:
            raise self.fail(f"value of union type {kind} has no table", f"{at}.val")
        if kind == _TENSOR:
            return self.tensor(body, f"{at}.tensor")
        if kind == _INT:
            return int(body.scalar(0, "q"))
        if kind == _BOOL:
            return bool(body.scalar(0, "?"))
        if kind == _DOUBLE:
            return float(body.scalar(0, "d"))
        raise self.fail(f"unknown value type {kind}", f"{at}.val")

    def suite(self, s: Table, at: str) -> TestSuiteDef:
        self.at = at
        suite = TestSuiteDef(s.string(0))
        for j, c in enumerate(s.tables(1)):
            where = f"{at}.test_cases[{j}]"
            inputs = [self.value(v, f"{where}.inputs[{k}]") for k, v in enumerate(c.tables(0))]
            outs = [self.value(v, f"{where}.expected_outputs[{k}]") for k, v in enumerate(c.tables(1))]
            suite.test_cases.append(TestCaseDef(inputs, outs or None))
        return suite


def read_executorch_bundle(data: Any, path: str | None = None) -> BundleDef:
    """The test suites and embedded reference program of a reference .bpte (``BundleDef.program`` holds the
    reference's .pte bytes; ``version`` its schema version)."""
    buf = bytes(data)
    r = _Reader(path)
    if not is_executorch_bundle(buf):
        raise r.fail(f"identifier {buf[4:8]!r}, expected {FB_IDENTIFIER!r}", "file_identifier")
    try:
        root = Table(buf, struct.unpack_from("<I", buf, 0)[0])
        version = root.scalar(0, "I")
        if version not in SCHEMA_VERSIONS:
            raise r.fail(f"unsupported schema version {version} (this reader reads {list(SCHEMA_VERSIONS)})",
                         "version")
        r.at = "method_test_suites"
        suites = [r.suite(s, f"method_test_suites[{i}]") for i, s in enumerate(root.tables(1))]
        r.at = "program"
        program = root.raw(2)
    except BundledProgramFormatError:
        raise
    except (ProgramFormatError, struct.error, UnicodeDecodeError, ValueError, OverflowError) as e:
        raise r.fail(f"malformed data ({e})", r.at) from None
    if len(program) < 8 or program[4:8] != PTE_IDENTIFIER:
        raise r.fail(f"the embedded program is not an ExecuTorch .pte (identifier {program[4:8]!r})", "program")
    return BundleDef(program, suites, version)


def tensor_value(t: TensorData) -> Any:
    """A ``torch.Tensor`` (a copy) of a reference tensor, its bytes laid out in ``t.dim_order``."""
    from edgetorch.formats.bundled_program import tensor_to_torch

    order = list(t.dim_order or range(len(t.sizes)))
    stored = TensorData(t.scalar_type, [t.sizes[d] for d in order], t.data)
    x = tensor_to_torch(stored, copy=True)
    if order == sorted(order):
        return x
    inverse = [order.index(d) for d in range(len(order))]
    return x.permute(inverse).contiguous()
