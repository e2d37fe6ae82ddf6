"""A reference ETRecord's weights (``torch.save`` archives stored inside its zip) are read once into one buffer
that every tensor views (``etrecord/_stored_torch``), equal to ``torch.load(weights_only=True)`` of the entry,
and a deflated entry still reads (issue 26)."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from edgetorch.devtools.etrecord._executorch import _Zip
from edgetorch.errors import ETRecordFormatError
from tests.devtools._reference_data import DATA

ENTRIES = ("exported_program_state_dict", "edge_dialect_exported_program/forward_state_dict",
           "edge_dialect_exported_program/forward_constants", "representative_inputs", "reference_outputs")


def _flat(x):
    return torch.utils._pytree.tree_flatten(x)


def _same(a, b) -> None:
    (la, sa), (lb, sb) = _flat(a), _flat(b)
    assert sa == sb
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y) and x.stride() == y.stride() and x.requires_grad == y.requires_grad
        else:
            assert x == y


@pytest.mark.parametrize("name", ["cnn_xnnpack", "vit_portable"])
def test_stored_entries_equal_torch_load_and_share_one_buffer(name: str) -> None:
    path = DATA / f"{name}_etrecord.bin"
    for source in (str(path), path.read_bytes()):
        z = _Zip(source, str(path))
        with z.zf:
            for entry in ENTRIES:
                got = z.torch_load(entry)
                _same(got, torch.load(io.BytesIO(z.zf.read(entry)), weights_only=True))
            sd = z.torch_load("exported_program_state_dict")
    tensors = list(sd.values())
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    assert len(tensors) > 1 and len(storages) == len(tensors)  # one storage per tensor, as torch.load gives ...
    base = min(storages)  # ... all inside one buffer of the entry's size, 64-byte aligned
    size = z.infos["exported_program_state_dict"].file_size
    assert all(base <= p < base + size and p % 64 == 0 for p in storages)


def test_deflated_entries_and_truncated_archives(tmp_path) -> None:
    data = (DATA / "mlp_portable_etrecord.bin").read_bytes()
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    deflated = _Zip(out.getvalue(), "deflated")
    plain = _Zip(data, "plain")
    with deflated.zf, plain.zf:
        _same(deflated.torch_load("exported_program_state_dict"), plain.torch_load("exported_program_state_dict"))
    # an entry whose stored bytes run past the end of the archive: a typed error naming the entry
    info = src.getinfo("exported_program_state_dict")
    z = _Zip(data, "cut")
    z.infos["exported_program_state_dict"].file_size = len(data)
    with z.zf, pytest.raises(ETRecordFormatError, match="past the end") as ei:
        z.torch_load("exported_program_state_dict")
    assert ei.value.field == "exported_program_state_dict" and info.file_size < len(data)
