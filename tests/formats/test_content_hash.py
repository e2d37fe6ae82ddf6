"""The .pte content hash: header version 2 hashes the body in ``HASH_CHUNKS`` pieces (verified in parallel
threads) and combines their digests; version-1 files (plain SHA-256 of the body) are still read and verified.
``Verification.Full`` refuses a change in any piece."""

from __future__ import annotations

import hashlib

import pytest
import torch

from edgetorch.errors import ProgramFormatError
from edgetorch.exir import to_edge
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime, Verification
from edgetorch.runtime.loader import body_digest


@pytest.fixture(scope="module")
def pte() -> tuple[bytes, tuple]:
    x = (torch.randn(2, 16),)
    et = to_edge(torch.export.export(torch.nn.Sequential(torch.nn.Linear(16, 300), torch.nn.ReLU()), x)) \
        .to_executorch()
    return bytes(et.buffer), x


def test_the_header_records_the_chunked_digest(pte):
    data, _ = pte
    h = pf.read_header(data)
    assert h.header_version == 2
    body = data[pf.HEADER_SIZE:]
    cuts = pf.hash_boundaries(len(body))
    assert cuts[0] == 0 and cuts[-1] == len(body) and all(c % 64 == 0 for c in cuts[:-1])
    want = hashlib.sha256(b"".join(hashlib.sha256(body[a:b]).digest() for a, b in zip(cuts, cuts[1:]))).hexdigest()
    assert h.content_hash == want == body_digest(data, 2)


@pytest.mark.parametrize("where", [0.1, 0.49, 0.51, 0.99])
def test_a_flip_in_any_piece_is_refused(pte, where):
    data, _ = pte
    bad = bytearray(data)
    pos = pf.HEADER_SIZE + int((len(data) - pf.HEADER_SIZE) * where)
    bad[pos] ^= 1
    with pytest.raises(ProgramFormatError, match="content hash mismatch") as ei:
        Runtime.get().load_program(bytes(bad), verification=Verification.Full)
    assert ei.value.field == "header.content_hash"


def test_version_1_files_still_load_and_are_verified(pte):
    data, x = pte
    body = data[pf.HEADER_SIZE:]
    old = bytearray(data)
    old[8:12] = (1).to_bytes(4, "little")
    old[48:80] = hashlib.sha256(body).digest()
    prog = Runtime.get().load_program(bytes(old), verification=Verification.Full)
    assert prog.content_hash == hashlib.sha256(body).hexdigest()
    expected = Runtime.get().load_program(data).load_method("forward").execute(*x)
    assert torch.equal(prog.load_method("forward").execute(*x)[0], expected[0])
    old[len(old) - 5] ^= 1
    with pytest.raises(ProgramFormatError, match="content hash mismatch"):
        Runtime.get().load_program(bytes(old), verification=Verification.Full)


def test_an_unknown_header_version_is_refused(pte):
    bad = bytearray(pte[0])
    bad[8:12] = (3).to_bytes(4, "little")
    with pytest.raises(ProgramFormatError, match="unsupported header version 3"):
        Runtime.get().load_program(bytes(bad))
