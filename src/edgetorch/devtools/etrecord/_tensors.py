"""Pickle-free tensor storage for ETRecord files.

Tensors are written as raw little-endian bytes into one blob (each start aligned to 64 bytes) and described by
a JSON record ``{"dtype", "shape", "strides", "offset", "nbytes"}``. Nested containers of tensors and scalars
(inputs, outputs, example inputs) are stored as a JSON treespec (``torch.utils._pytree.treespec_dumps``) plus a
list of encoded leaves; a container of any other type than the plain ones (a Hugging Face ``ModelOutput``, a
dataclass, a namedtuple or structseq) is stored by name as a ``ForeignContainer`` node and read back as one,
never imported. Every field read back is validated before any tensor is built.
"""

from __future__ import annotations

import collections
import json
import math
import sys
from typing import Any

import torch
import torch.utils._pytree as pytree

from edgetorch.formats.dtypes import contiguous_strides

ALIGNMENT = 64

_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
    "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
)
DTYPES: dict[str, torch.dtype] = {
    n: getattr(torch, n) for n in _DTYPE_NAMES if isinstance(getattr(torch, n, None), torch.dtype)
}
_NAME_OF: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
_RECORD_KEYS = {"dtype", "shape", "strides", "offset", "nbytes"}

# treespec node types that rebuild without importing anything named in the file
_SAFE_TREESPEC_TYPES = {
    "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict", "collections.namedtuple",
    "collections.deque", "torch.fx.immutable_collections.immutable_list",
    "torch.fx.immutable_collections.immutable_dict", "torch.Size",
}
_MAX_TREESPEC_DEPTH = 64


class TensorDataError(ValueError):
    """Bad tensor record, blob or tree; the caller turns it into an ETRecord error naming the entry."""


class UnsupportedValueError(TypeError):
    """A value the ETRecord format cannot store (tensor subclass, quantized tensor, arbitrary object)."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)




def is_dense(shape: list[int], strides: list[int]) -> bool:
    """True when the strides lay the elements out without gaps or overlaps (any dimension order)."""
    if math.prod(shape) == 0:
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(shape, strides, strict=True) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


class TensorBlobWriter:
    """Accumulates tensor bytes; ``add`` returns the JSON record of one tensor. A tensor object added twice
    (a weight shared by the ATen and the edge program, tied weights) is stored once."""

    def __init__(self) -> None:
        self.chunks: list[bytes | memoryview] = []  # views of the tensors' own bytes: saving copies no weight
        self.nbytes = 0
        self._keep: list[torch.Tensor] = []
        self._seen: dict[int, tuple[torch.Tensor, dict[str, Any]]] = {}

    def add(self, t: torch.Tensor, what: str) -> dict[str, Any]:
        if id(t) in self._seen:
            return dict(self._seen[id(t)][1])
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise UnsupportedValueError(f"{what}: tensor subclass {type(t).__name__} cannot be stored")
        if t.layout != torch.strided or t.is_quantized or t.is_meta:
            raise UnsupportedValueError(f"{what}: only dense, non-quantized tensors with data can be stored "
                                        f"(got layout={t.layout}, quantized={t.is_quantized}, meta={t.is_meta})")
        if t.dtype not in _NAME_OF:
            raise UnsupportedValueError(f"{what}: dtype {t.dtype} cannot be stored")
        src = t
        t = t.detach().resolve_conj().resolve_neg()
        if t.device.type != "cpu":
            t = t.cpu()
        shape = [int(s) for s in t.shape]
        strides = [int(s) for s in t.stride()]
        if not is_dense(shape, strides):  # expanded / sliced views: stored as their contiguous copy
            strides = contiguous_strides(shape)
        flat = t.contiguous().reshape(-1).view(torch.uint8)  # no copy of an already contiguous tensor
        self._keep.append(flat)  # the chunk is a view of it until the archive is written
        data = memoryview(flat.numpy()) if flat.numel() else b""
        pad = (-self.nbytes) % ALIGNMENT
        if pad:
            self.chunks.append(b"\0" * pad)
            self.nbytes += pad
        n = memoryview(data).nbytes
        rec = {"dtype": _NAME_OF[t.dtype], "shape": shape, "strides": strides, "offset": self.nbytes, "nbytes": n}
        self.chunks.append(data)
        self.nbytes += n
        self._seen[id(src)] = (src, rec)  # holding src keeps its id unique while writing
        return dict(rec)


class TensorReader:
    """Builds tensors from records over one blob; the same record (and flags) gives the same tensor object,
    so weights shared between programs stay shared after loading.

    ``blob`` is any buffer (bytes, bytearray, memoryview, mmap); ``start`` and ``size`` select the tensor
    region inside it (default: all of it). With a writable buffer (an ``mmap`` with ``ACCESS_COPY``, a
    bytearray), a tensor whose bytes are suitably aligned is built zero-copy: ``torch.frombuffer`` keeps the
    buffer alive for as long as the tensor is referenced. Otherwise the bytes are copied.
    """

    def __init__(self, blob: Any, start: int = 0, size: int | None = None) -> None:
        self.blob = blob
        mv = memoryview(blob)
        self.start = start
        self.size = (mv.nbytes - start) if size is None else size
        if start < 0 or self.size < 0 or start + self.size > mv.nbytes:
            raise TensorDataError(f"tensor region [{start}, {start + self.size}) lies outside the buffer")
        self.zero_copy = not mv.readonly and mv.nbytes > 0
        # address of the region start: zero-copy only where a tensor's bytes meet its dtype's alignment
        self._addr = torch.frombuffer(blob, dtype=torch.uint8, count=1).data_ptr() if self.zero_copy else 0
        mv.release()
        self._cache: dict[tuple, torch.Tensor] = {}

    def read(self, rec: Any, what: str, param: bool = False, requires_grad: bool = False) -> torch.Tensor:
        dtype, shape, strides, offset, nbytes = check_record(rec, self.size, what)
        key = (dtype, tuple(shape), tuple(strides), offset, nbytes, param, requires_grad)
        if key in self._cache:
            return self._cache[key]
        if requires_grad and not (dtype.is_floating_point or dtype.is_complex):
            raise TensorDataError(f"{what}: requires_grad on a {dtype} tensor")
        t = self._build(dtype, shape, strides, offset, nbytes, what)
        t = torch.nn.Parameter(t, requires_grad=requires_grad) if param else t.requires_grad_(requires_grad)
        self._cache[key] = t
        return t

    def _build(self, dtype: torch.dtype, shape: list[int], strides: list[int], offset: int, nbytes: int,
               what: str) -> torch.Tensor:
        pos = self.start + offset
        # in place only at torch's own allocation alignment: CPU kernels (gemm blocking) may round differently
        # on less aligned data, and a loaded weight must compute exactly like the original
        if nbytes and self.zero_copy and (self._addr + pos) % ALIGNMENT == 0:
            flat = torch.frombuffer(self.blob, dtype=torch.uint8, count=nbytes, offset=pos)
            return _finish(flat, dtype, shape, strides, what)
        return _build(memoryview(self.blob)[pos:pos + nbytes], dtype, shape, strides, 0, nbytes, what)

    def address_range(self) -> tuple[int, int]:
        """[first, last) address of the tensor region when tensors are built in place, else (0, 0)."""
        if not self.zero_copy:
            return 0, 0
        return self._addr + self.start, self._addr + self.start + self.size


def check_record(rec: Any, blob_len: int, what: str) -> tuple[torch.dtype, list[int], list[int], int, int]:
    """Validates a tensor record against a blob of ``blob_len`` bytes."""
    if not isinstance(rec, dict) or set(rec) != _RECORD_KEYS:
        raise TensorDataError(f"{what}: tensor record must have exactly the keys {sorted(_RECORD_KEYS)}")
    dtype = DTYPES.get(rec["dtype"]) if isinstance(rec["dtype"], str) else None
    if dtype is None:
        raise TensorDataError(f"{what}: unknown dtype {rec['dtype']!r}")
    shape, strides, offset, nbytes = rec["shape"], rec["strides"], rec["offset"], rec["nbytes"]
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape) or len(shape) > 64:
        raise TensorDataError(f"{what}: bad shape {shape!r}")
    if not isinstance(strides, list) or len(strides) != len(shape) or not all(_is_int(s) and 0 <= s < 2**62
                                                                               for s in strides):
        raise TensorDataError(f"{what}: bad strides {strides!r} for shape {shape}")
    if not (_is_int(offset) and _is_int(nbytes) and offset >= 0 and nbytes >= 0):
        raise TensorDataError(f"{what}: bad offset/nbytes {offset!r}/{nbytes!r}")
    numel = math.prod(shape)
    itemsize = dtype.itemsize
    if nbytes != numel * itemsize:
        raise TensorDataError(f"{what}: nbytes {nbytes} != {numel} elements x {itemsize} bytes")
    if offset + nbytes > blob_len:
        raise TensorDataError(f"{what}: bytes [{offset}, {offset + nbytes}) run past the blob ({blob_len} bytes)")
    if nbytes and offset % ALIGNMENT:  # the writer starts every tensor at a multiple of 64: a moved offset
        raise TensorDataError(f"{what}: offset {offset} is not a multiple of {ALIGNMENT} (every stored tensor "
                              "starts 64-byte aligned; an offset moved inside another tensor would shift its values)")
    if not is_dense(shape, strides):
        raise TensorDataError(f"{what}: strides {strides} are not dense and non-overlapping for shape {shape}")
    return dtype, shape, strides, offset, nbytes


def _finish(flat: torch.Tensor, dtype: torch.dtype, shape: list[int], strides: list[int], what: str
            ) -> torch.Tensor:
    """``flat``: the tensor's bytes (uint8, row-major); returns the tensor with its dtype, shape and strides."""
    if dtype == torch.bool and int(flat.max()) > 1:
        raise TensorDataError(f"{what}: bool tensor holds bytes other than 0 and 1")
    t = flat.view(dtype).reshape(shape)
    if strides != contiguous_strides(shape):
        out = torch.empty_strided(shape, strides, dtype=dtype)
        out.copy_(t)
        t = out
    return t


def _build(blob: bytes | memoryview, dtype: torch.dtype, shape: list[int], strides: list[int], offset: int,
           nbytes: int, what: str) -> torch.Tensor:
    """Builds a tensor from a copy of ``blob[offset:offset + nbytes]`` (in memory from torch's allocator)."""
    if nbytes == 0:
        return torch.empty_strided(shape, strides, dtype=dtype)
    flat = torch.empty(nbytes, dtype=torch.uint8)
    memoryview(flat.numpy())[:] = memoryview(blob)[offset:offset + nbytes]
    return _finish(flat, dtype, shape, strides, what)


def check_disjoint(records: list[tuple[str, Any]]) -> None:
    """The stored byte ranges of ``records`` ((what, record) pairs of one document) are disjoint, or one range
    stored once and named twice (a tied weight): an offset moved onto another tensor's bytes (64-byte aligned,
    so the alignment check passes) would read that tensor's values. Malformed records are left to
    ``check_record``."""
    spans = sorted((r["offset"], r["nbytes"], what) for what, r in records if isinstance(r, dict)
                   and _is_int(r.get("offset")) and _is_int(r.get("nbytes")) and r["nbytes"] > 0)
    for (a, na, wa), (b, nb, wb) in zip(spans, spans[1:]):
        if b < a + na and (a, na) != (b, nb):
            raise TensorDataError(f"{wb}: bytes [{b}, {b + nb}) overlap the bytes [{a}, {a + na}) of {wa} (every "
                                  "stored tensor has bytes of its own: an offset moved onto another tensor?)")


def read_tensor(rec: Any, blob: bytes | memoryview, what: str) -> torch.Tensor:
    """Builds one tensor from a record written by ``TensorBlobWriter.add``; validates every field first."""
    return _build(blob, *check_record(rec, len(blob), what), what)


class ForeignContainer(tuple):
    """A container whose type is stored by name only (a ``ModelOutput``, a dataclass, a namedtuple or structseq
    this process does not know, any other pytree node type): a tuple of its children carrying ``type_name`` (the
    type's serialized or qualified name) and ``context`` (its pytree context as a JSON string, or None).
    Informational: nothing named in it is ever imported or looked up; ``pytree.tree_leaves`` flattens it."""

    type_name: str
    context: str | None

    def __new__(cls, items: Any = (), type_name: str = "", context: str | None = None) -> ForeignContainer:
        obj = super().__new__(cls, items)
        obj.type_name = type_name
        obj.context = context
        return obj

    def __repr__(self) -> str:
        return f"{self.type_name}{tuple.__repr__(self)}"

    def __reduce__(self) -> tuple:
        return ForeignContainer, (tuple(self), self.type_name, self.context)


FOREIGN_TYPE = "edgetorch.etrecord.ForeignContainer"
_MAX_FOREIGN_CHARS = 65536


def _foreign_context(dumped: Any) -> tuple[str, str | None]:
    """The context of a stored ``ForeignContainer`` node: JSON ``[type name, context JSON string | null]``."""
    try:
        ctx = json.loads(dumped) if isinstance(dumped, str) and len(dumped) <= _MAX_FOREIGN_CHARS else None
    except (ValueError, RecursionError):
        ctx = None
    if not (isinstance(ctx, list) and len(ctx) == 2 and isinstance(ctx[0], str) and (ctx[1] is None or isinstance(
            ctx[1], str))):
        raise TensorDataError(f"{FOREIGN_TYPE} context must be JSON [type name, context string | null]")
    return ctx[0], ctx[1]


pytree.register_pytree_node(
    ForeignContainer,
    lambda x: (list(x), (x.type_name, x.context)),
    lambda values, ctx: ForeignContainer(values, *ctx),
    serialized_type_name=FOREIGN_TYPE,
    to_dumpable_context=lambda ctx: json.dumps(list(ctx)),
    from_dumpable_context=_foreign_context,
    flatten_with_keys_fn=lambda x: ([(pytree.SequenceKey(i), v) for i, v in enumerate(x)], (x.type_name, x.context)),
)


def _node_dump(spec: pytree.TreeSpec) -> dict[str, Any] | None:
    """torch's JSON of one container node (its children as leaves), or None when torch cannot write it."""
    one = pytree.TreeSpec(spec.type, spec.context, [pytree.treespec_leaf()] * spec.num_children)
    try:
        node = json.loads(pytree.treespec_dumps(one))[1]
    except Exception:  # unregistered name, context JSON cannot hold, structseq without a name
        return None
    return node


def _type_name(spec: pytree.TreeSpec) -> str:
    typ = spec.context if spec.type is collections.namedtuple else spec.type
    entry = pytree.SUPPORTED_SERIALIZED_TYPES.get(typ)
    name = getattr(entry, "serialized_type_name", None)
    if isinstance(name, str) and name != pytree.NO_SERIALIZED_TYPE_NAME_FOUND:
        return name
    return f"{getattr(typ, '__module__', '?')}.{getattr(typ, '__qualname__', typ)}"


def portable_spec(spec: pytree.TreeSpec) -> pytree.TreeSpec:
    """``spec`` with every node ``check_treespec`` would not rebuild as is (any type outside the plain containers,
    a context holding enums) replaced by a ``ForeignContainer`` node naming the type; plain specs come back
    unchanged (the same object)."""
    if spec.is_leaf():
        return spec
    old = spec.children()
    children = [portable_spec(c) for c in old]
    node = _node_dump(spec) if spec.type is not ForeignContainer else {"type": FOREIGN_TYPE}
    if node is not None and (node["type"] == FOREIGN_TYPE or _plain_node_quiet(node)):
        if all(c is o for c, o in zip(children, old, strict=True)):
            return spec
        return pytree.TreeSpec(spec.type, spec.context, children)
    ctx = node["context"] if node is not None else None
    return pytree.TreeSpec(ForeignContainer, (_type_name(spec), ctx if isinstance(ctx, str) else None), children)


def _plain_node(node: dict[str, Any]) -> bool:
    """True for a plain container node ``treespec_loads`` may rebuild; raises ``TensorDataError`` for a plain
    container whose context is not JSON or holds an enum reference (which torch would import)."""
    typ, ctx = node.get("type"), node.get("context")
    if typ == "collections.namedtuple":
        return isinstance(ctx, str) and _is_registered_namedtuple(ctx)
    if typ not in _SAFE_TREESPEC_TYPES or typ not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
        return False
    if not isinstance(ctx, str):
        raise TensorDataError("treespec context must be a JSON string")
    try:
        todo = [json.loads(ctx)]
    except (ValueError, RecursionError):
        raise TensorDataError("treespec context is not JSON") from None
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            if "__enum__" in x:
                raise TensorDataError("treespec context holds an enum reference")
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
    return True


def _plain_node_quiet(node: dict[str, Any]) -> bool:
    try:
        return _plain_node(node)
    except TensorDataError:  # an enum context: stored by name instead
        return False


def _is_registered_namedtuple(name: str) -> bool:
    typ = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name)
    return isinstance(typ, type) and issubclass(typ, tuple) and hasattr(typ, "_fields")


def _checked_plain(node: dict[str, Any], what: str) -> bool:
    try:
        return _plain_node(node)
    except TensorDataError as e:
        raise TensorDataError(f"{what}: {e}") from None


def check_treespec(spec: Any, what: str) -> str:
    """Validates a serialized treespec and returns the form ``treespec_loads`` may read: every node whose type
    is not a plain container (tuple, list, dict, OrderedDict, deque, torch.Size, the fx immutable containers, a
    namedtuple registered in this process) becomes a ``ForeignContainer`` node naming it, so nothing is ever
    imported or looked up by a name from the file (enum contexts, defaultdict factories, ``ModelOutput``
    classes). Raises ``TensorDataError`` for a malformed spec."""
    if not isinstance(spec, str):
        raise TensorDataError(f"{what}: treespec must be a string")
    try:
        loaded = json.loads(spec)
    except (ValueError, RecursionError) as e:
        raise TensorDataError(f"{what}: treespec is not JSON ({e})") from None
    if not (isinstance(loaded, list) and len(loaded) == 2 and loaded[0] == 1):
        raise TensorDataError(f"{what}: treespec must be [1, schema]")
    changed = False
    stack = [(loaded[1], 0)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_TREESPEC_DEPTH:
            raise TensorDataError(f"{what}: treespec nested deeper than {_MAX_TREESPEC_DEPTH}")
        if not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"}:
            raise TensorDataError(f"{what}: malformed treespec node")
        typ, ctx, children = node["type"], node["context"], node["children_spec"]
        if not isinstance(children, list):
            raise TensorDataError(f"{what}: malformed treespec children")
        if typ is None:
            if ctx is not None or children:
                raise TensorDataError(f"{what}: malformed treespec leaf")
            continue
        if not isinstance(typ, str) or len(typ) > 1024:
            raise TensorDataError(f"{what}: treespec node type must be a string")
        if typ == FOREIGN_TYPE:
            try:
                _foreign_context(ctx)
            except TensorDataError as e:
                raise TensorDataError(f"{what}: {e}") from None
        elif not _checked_plain(node, what):
            node["type"] = FOREIGN_TYPE
            node["context"] = json.dumps([typ, ctx if isinstance(ctx, str) else None])
            changed = True
        stack.extend((c, depth + 1) for c in children)
    return json.dumps(loaded) if changed else spec


def _encode_leaf(leaf: Any, blobs: TensorBlobWriter, what: str) -> dict[str, Any]:
    if isinstance(leaf, torch.Tensor):
        return {"tensor": blobs.add(leaf, what)}
    if isinstance(leaf, float) and not math.isfinite(leaf):
        return {"float": repr(leaf)}
    if leaf is None or isinstance(leaf, (bool, int, float, str)):
        return {"value": leaf}
    raise UnsupportedValueError(f"{what}: cannot store a value of type {type(leaf).__name__}")


def encode_tree(obj: Any, blobs: TensorBlobWriter, what: str) -> dict[str, Any]:
    """``{"spec": treespec JSON, "leaves": [{"tensor": record} | {"value": scalar} | {"float": "nan"}]}``."""
    leaves, spec = pytree.tree_flatten(obj)
    try:
        spec_str = pytree.treespec_dumps(portable_spec(spec))
    except (TypeError, NotImplementedError) as e:
        raise UnsupportedValueError(f"{what}: container structure cannot be serialized: {e}") from None
    return {"spec": spec_str, "leaves": [_encode_leaf(x, blobs, f"{what}[{i}]") for i, x in enumerate(leaves)]}


def _decode_leaf(enc: Any, reader: TensorReader, what: str) -> Any:
    if not isinstance(enc, dict) or len(enc) != 1:
        raise TensorDataError(f"{what}: malformed leaf")
    (kind, val), = enc.items()
    if kind == "tensor":
        return reader.read(val, what)
    if kind == "float" and val in ("nan", "inf", "-inf"):
        return float(val)
    if kind == "value" and (val is None or isinstance(val, (bool, int, float, str))):
        return val
    raise TensorDataError(f"{what}: malformed leaf {kind!r}")


def decode_tree(enc: Any, reader: TensorReader, what: str) -> Any:
    """Inverse of ``encode_tree``; the treespec is checked by ``check_treespec`` before it is loaded."""
    if not isinstance(enc, dict) or set(enc) != {"spec", "leaves"} or not isinstance(enc["leaves"], list):
        raise TensorDataError(f"{what}: malformed tree (needs 'spec' and 'leaves')")
    spec_str = check_treespec(enc["spec"], what)
    try:
        spec = pytree.treespec_loads(spec_str)
    except Exception as e:
        raise TensorDataError(f"{what}: bad treespec ({type(e).__name__}: {e})") from None
    leaves = [_decode_leaf(x, reader, f"{what}[{i}]") for i, x in enumerate(enc["leaves"])]
    if spec.num_leaves != len(leaves):
        raise TensorDataError(f"{what}: treespec has {spec.num_leaves} leaves, file has {len(leaves)}")
    try:
        return pytree.tree_unflatten(leaves, spec)
    except Exception as e:
        raise TensorDataError(f"{what}: cannot rebuild the container ({e})") from None


def check_byteorder() -> None:
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        raise TensorDataError("ETRecord tensor data is little-endian; this host is big-endian")
