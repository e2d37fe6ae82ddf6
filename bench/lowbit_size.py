"""What a (quantized LLM) program's bytes are (issue 25: llama_100m 8da4w against the reference's program): per
category, the bytes of every constant, named-data entry and delegate blob, for edgetorch's ``.pte`` and the
reference ExecuTorch's (``ET12``).

edgetorch: each constant is classified by the tensor that reads it (dtype, shape), each ORT delegate's initializers
by their blob's header (name, dtype, shape, named-data key), mutable buffers by their ``MutableBuffer`` entry:
packed int4 weights (uint8 2-D/3-D), int8 weights, 16-bit / float32 group scales (a float matrix ``[N, c]`` beside
a packed ``[N, K/2]`` weight, ``K / c`` a group size), the float embedding (a float matrix of >= 8192 rows), other
float matrices (rope tables), 1-D tensors (norms, biases), the KV caches' initial state, the delegates' own bytes
(ONNX model) and the rest (flatbuffer, header, alignment). Bytes shared (named data read by two delegates) count once.

Reference: its constant segment (the embedding and the portable ops' constants), its named data (XNNPACK's
packed weights and bf16 scales, keys ``<sha256>`` and ``scale_<sha256>``) grouped by size, its delegate blobs.

    python bench/lowbit_size.py /tmp/lb/et_8da4w.pte /tmp/lb/ort_8da4w.pte /tmp/lb/ref_8da4w_g32.pte
"""

from __future__ import annotations

import collections
import json
import struct
import sys

from edgetorch.formats import program as pf
from edgetorch.formats._fbread import Table
from edgetorch.formats.dtypes import code_dtype

_GROUPS = (32, 64, 128, 256)
_MIB = 2 ** 20


def _category(dtype: str, shape: tuple[int, ...], packed_rows: set[tuple[int, int]]) -> str:
    """The category of a tensor from its dtype name ('uint8', 'bfloat16', ...) and shape."""
    if len(shape) >= 2 and dtype == "uint8":
        return "int4 weights (packed)"
    if len(shape) >= 2 and dtype == "int8":
        return "int8 weights"
    if len(shape) <= 1:
        return "1-D (norms, biases, scales)" if dtype in ("float32", "bfloat16", "float16") else f"1-D {dtype}"
    if len(shape) == 2 and dtype in ("float32", "bfloat16", "float16") and any(
            n == shape[0] and k % shape[1] == 0 and k // shape[1] in _GROUPS for n, k in packed_rows):
        return f"group scales ({dtype})"
    if dtype == "float32" and shape[0] >= 8192:
        return "embedding (float32)"
    return f"other {dtype} {len(shape)}-D (rope tables ...)"


def _ort_initializers(blob: memoryview) -> tuple[int, list[dict]]:
    """(bytes of the blob itself, its initializer entries) of an ORT delegate blob (``_blob.py`` layout)."""
    if bytes(blob[:8]) != b"ETORTDLG":
        return len(blob), []
    head_len = struct.unpack_from("<I", blob, 12)[0]
    return len(blob), json.loads(bytes(blob[32:32 + head_len]))["initializers"]


def _np_name(dtype_str: str) -> str:
    import numpy as np

    return str(np.dtype(dtype_str))


def edgetorch_breakdown(buf: bytes) -> dict[str, int]:
    """{category: bytes} of an edgetorch program."""
    header = pf.read_header(buf)
    prog = pf.decode_flatbuffer(memoryview(buf)[header.flatbuffer_offset:header.flatbuffer_offset
                                                + header.flatbuffer_size])
    const_meta: dict[int, tuple[str, tuple[int, ...]]] = {}
    mutable: set[int] = set()
    for p in prog.plans:
        for v in p.values:
            if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_CONSTANT and v.constant_index >= 0:
                const_meta.setdefault(v.constant_index, (str(code_dtype(v.scalar_type)).replace("torch.", ""),
                                                         tuple(v.sizes)))
        mutable.update(mb.constant_index for mb in p.mutable_buffers if mb.constant_index >= 0)
    named = {key: size for key, _, size in prog.named_data}
    ort_entries: list[dict] = []
    out: collections.Counter = collections.Counter()
    for off, size in prog.delegate_data:
        own, entries = _ort_initializers(memoryview(buf)[header.segment_offset + off:header.segment_offset + off
                                                         + size])
        inline = sum(int(e["nbytes"]) for e in entries if "key" not in e)
        out["delegate blobs (ONNX model, small weights)"] += own - inline
        ort_entries += entries
    metas = list(const_meta.values()) + [(_np_name(e["dtype"]), tuple(e["shape"])) for e in ort_entries]
    packed_rows = {(s[0], s[1] * 2 if len(s) == 2 else s[1] * s[2] * 2)
                   for d, s in metas if d == "uint8" and len(s) >= 2}
    for k, (off, size) in enumerate(prog.constants):
        if k in mutable:
            out["KV caches / mutable initial state"] += size
        elif k in const_meta:
            out[_category(*const_meta[k], packed_rows)] += size
        else:
            out["constants read by no tensor value"] += size
    seen: set[str] = set()
    for e in ort_entries:
        if "key" in e and e["key"] in seen:
            continue
        seen.add(e.get("key", ""))
        out[_category(_np_name(e["dtype"]), tuple(e["shape"]), packed_rows)] += int(e["nbytes"])
    out["named data read by no ORT initializer"] += sum(s for k, s in named.items() if k not in seen)
    out["flatbuffer, header, alignment"] = len(buf) - sum(out.values())
    return dict(out)


def reference_breakdown(buf: bytes) -> dict[str, int]:
    """{category: bytes} of a reference ExecuTorch program (``ET12``, extended header ``eh00``)."""
    root = Table(buf, struct.unpack_from("<I", buf, 0)[0])
    segs = [(t.scalar(0, "Q"), t.scalar(1, "Q")) for t in root.tables(4)]
    out: collections.Counter = collections.Counter()
    used: set[int] = set()
    cs = root.table(5)
    if cs is not None and segs:
        i = cs.scalar(0, "I")
        offs = sorted(cs.scalars(1, "Q")) + [segs[i][1]]
        big = [b - a for a, b in zip(offs, offs[1:]) if b - a >= 8 << 20]
        out["constant segment: embedding (float32)"] += sum(big)
        out["constant segment: other constants"] += segs[i][1] - sum(big)
        used.add(i)
    sizes: collections.Counter = collections.Counter()
    for t in root.tables(7):
        key, i = t.string(0), t.scalar(1, "I")
        kind = "XNNPACK scales (bf16)" if key.startswith("scale_") else "XNNPACK int4 weights (packed)"
        out[f"named data: {kind}"] += segs[i][1]
        sizes[(kind, segs[i][1])] += 1
        used.add(i)
    out["delegate blobs (XNNPACK graphs)"] = sum(s for j, (_, s) in enumerate(segs) if j not in used)
    out["flatbuffer, header, alignment"] = len(buf) - sum(out.values())
    for (kind, size), n in sorted(sizes.items(), key=lambda kv: -kv[0][1] * kv[1]):
        print(f"      {n:4d} x {size:>10,d} B  {kind}")
    return dict(out)


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            buf = f.read()
        kind = "reference ExecuTorch" if buf[4:8] == b"ET12" else "edgetorch"
        print(f"{path}: {kind}, {len(buf):,d} bytes = {len(buf) / _MIB:.1f} MiB")
        parts = reference_breakdown(buf) if kind != "edgetorch" else edgetorch_breakdown(buf)
        for name, size in sorted(parts.items(), key=lambda kv: -kv[1]):
            print(f"  {size / _MIB:8.2f} MiB  {size:>12,d} B  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
