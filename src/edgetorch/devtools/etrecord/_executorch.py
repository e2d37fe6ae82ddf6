"""Reader of the reference ExecuTorch's ETRecord (a zip with an empty ``ETRECORD_V0`` marker entry), turned into
an edgetorch ``ETRecord`` so the Inspector works on records the reference's exporter wrote.

Entries read: ``debug_handle_map``, ``delegate_map``, ``instruction_id_to_num_outs_map`` (JSON, string instruction
ids, read into ``HandleGroup``s by ``formats.handles.groups_from_tables``); ``export_graph_id`` (JSON int); the
ATen program ``exported_program`` and the edge programs ``edge_dialect_exported_program/<method>`` (or the legacy
single ``edge_dialect_exported_program``) and ``<name>/<method>`` graph-map programs, each four entries: the
torch.export JSON document plus ``_state_dict``, ``_constants`` and ``_example_inputs``;
``representative_inputs`` and ``reference_outputs``.

Safety: every binary entry is read with ``torch.load(weights_only=True)`` (never a full unpickle; torch's own
artifact loader falls back to one, so it is bypassed); every node target of a program must be an operator of an
allowed ``torch.ops`` namespace or one of a few ``operator`` functions, checked in the JSON before torch's
deserializer resolves it and again on the graph (a target naming any other Python callable would run it);
entry sizes and JSON nesting are bounded. Any failure is an ``ETRecordFormatError`` naming the entry.

Debug handles: edge nodes carry the reference's ``debug_handle`` metadata (a string in the JSON), stored here as
edgetorch's ``meta["custom"]["debug_handle"]``. The ATen program has none: as the reference does, each edge
node's provenance chain (``from_node``) names the ATen node it came from (the ancestor whose graph id is
``export_graph_id``), and that node gets the edge node's handle, so the ATen program is the numeric-gap reference.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import os
import re
import struct
import zipfile
from typing import Any

import torch

from edgetorch.devtools.etrecord._executorch_handles import aten_handle_bound, propagate_handles
from edgetorch.devtools.etrecord._serde_fast import converting
from edgetorch.devtools.etrecord._stored_torch import StoredCRCError, load_stored
from edgetorch.errors import ETRecordFormatError
from edgetorch.formats.handles import groups_from_tables, parse_handle

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _gc_paused() -> Any:
    """No cyclic garbage collection while a document's many containers are built (they hold no cycles: each
    full collection would walk every live container, 0.2 s on a ViT-B record); restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

MARKER = "ETRECORD_V0"
PRODUCER = "executorch"
_EDGE = "edge_dialect_exported_program"
_ATEN = "exported_program"
_SUFFIXES = ("_state_dict", "_constants", "_example_inputs")
_TABLES = ("debug_handle_map", "delegate_map", "instruction_id_to_num_outs_map")
_DATA = ("reference_outputs", "representative_inputs", "export_graph_id")
_EDGE_OPS = "executorch.exir.dialects.edge.ops."
MAX_ENTRIES = 4096
MAX_JSON_BYTES = 512 << 20
MAX_TENSOR_BYTES = 16 << 30
_MAX_DEPTH = 200
_OP_NAMESPACES = frozenset({"aten", "prims", "quantized_decomposed", "torchao"})
_OPERATORS = frozenset({"getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq", "ne",
                        "lt", "le", "gt", "ge", "and_", "or_", "not_"})
#: the module registering an allowed namespace's operators, imported (a fixed module, never one a file names)
#: before a program using that namespace is deserialized
_OP_LIBRARIES = {"quantized_decomposed": "torch.ao.quantization.fx._decomposed"}
_TARGET = re.compile(r"^torch\.ops\.([A-Za-z_][A-Za-z0-9_]*)\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


def is_executorch_etrecord(source: Any) -> bool:
    """True when ``source`` (a path, bytes or a binary file) is a zip holding the reference's marker entry."""
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            zf = zipfile.ZipFile(io.BytesIO(bytes(source)))
        elif hasattr(source, "read"):
            pos = source.tell()
            try:
                zf = zipfile.ZipFile(source)
                names = set(zf.namelist())
            finally:
                source.seek(pos)
            return MARKER in names
        else:
            zf = zipfile.ZipFile(os.fspath(source))
        with zf:
            return MARKER in set(zf.namelist())
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, OverflowError):
        return False


class _Zip:
    def __init__(self, source: Any, path: str | None) -> None:
        self.path = path
        try:
            src = io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview)) else source
            self.zf = zipfile.ZipFile(src)
            infos = self.zf.infolist()
        except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, NotImplementedError,
                OverflowError) as e:
            raise ETRecordFormatError(f"not an ExecuTorch ETRecord: not a readable zip archive ({e})",
                                      field="<archive>", path=path) from None
        if len(infos) > MAX_ENTRIES:
            raise self.error("<archive>", f"{len(infos)} entries (at most {MAX_ENTRIES})")
        self.infos = {i.filename: i for i in infos}
        if MARKER not in self.infos:
            raise self.error(MARKER, "missing marker entry: not an ExecuTorch ETRecord")

    def error(self, entry: str, msg: str) -> ETRecordFormatError:
        return ETRecordFormatError(f"ExecuTorch ETRecord entry {entry!r}: {msg}", field=entry, path=self.path)

    def read(self, name: str, limit: int) -> bytes:
        info = self.infos[name]
        if info.file_size > limit:
            raise self.error(name, f"{info.file_size} bytes (at most {limit})")
        if info.flag_bits & 0x1:
            raise self.error(name, "encrypted entry")
        try:
            with self.zf.open(info) as f:
                data = f.read(limit + 1)
        except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, OverflowError) as e:
            raise self.error(name, f"unreadable ({e})") from None
        if len(data) != info.file_size:
            raise self.error(name, f"holds {len(data)} bytes, its header says {info.file_size}")
        return data

    def json(self, name: str) -> Any:
        try:
            return json.loads(self.read(name, MAX_JSON_BYTES))
        except (ValueError, RecursionError) as e:
            raise self.error(name, f"not valid JSON ({type(e).__name__}: {e})") from None

    def torch_load(self, name: str) -> Any:
        """The ``torch.save`` archive stored under ``name``, read with torch's weights-only unpickler. A stored
        (uncompressed) entry is read once into one buffer that every tensor views (no copy of the entry's
        bytes, no second copy into each storage), checked against the CRC-32 the archive records."""
        info = self.infos[name]
        if info.file_size > MAX_TENSOR_BYTES:
            raise self.error(name, f"{info.file_size} bytes (at most {MAX_TENSOR_BYTES})")
        try:
            start = self._stored_data(info)
            if start is None:
                return torch.load(io.BytesIO(self.read(name, MAX_TENSOR_BYTES)), weights_only=True,
                                  map_location="cpu")
            return load_stored(self._raw(), start, info.file_size, info.CRC)
        except ETRecordFormatError:
            raise
        except StoredCRCError as e:
            raise self.error(name, str(e)) from None
        except Exception as e:  # weights_only refuses any pickle beyond tensors and plain containers
            raise self.error(name, f"cannot be read with torch.load(weights_only=True) "
                                   f"({type(e).__name__}: {str(e)[:200]})") from None

    def _raw(self) -> Any:
        fp = self.zf.fp
        if fp is None:
            raise ValueError("the archive is closed")
        return fp

    def _stored_data(self, info: zipfile.ZipInfo) -> int | None:
        """The offset of a stored entry's bytes in the archive (None for a compressed or encrypted entry)."""
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            return None
        fp = self._raw()
        fp.seek(info.header_offset)
        head = fp.read(30)
        if len(head) != 30 or head[:4] != b"PK\x03\x04":
            raise self.error(info.filename, "bad local file header")
        n, m = struct.unpack("<HH", head[26:30])
        start = info.header_offset + 30 + n + m
        end = fp.seek(0, io.SEEK_END)
        if start + info.file_size > end:
            raise self.error(info.filename, f"its {info.file_size} bytes at {start} run past the end of the "
                                            f"archive ({end} bytes)")
        return start


# -- side tables ---------------------------------------------------------------------------------------------------

def _int_key(z: _Zip, entry: str, k: Any) -> int:
    if isinstance(k, str) and k.isdigit() and len(k) < 12:
        return int(k)
    raise z.error(entry, f"instruction id {str(k)[:40]!r} is not a non-negative integer")


def _handles(z: _Zip, entry: str, v: Any) -> int | list[int]:
    if isinstance(v, list):
        if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in v):
            raise z.error(entry, f"handles {str(v)[:80]} are not non-negative integers")
        return v
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    raise z.error(entry, f"debug handle {str(v)[:40]!r} is not a non-negative integer")


def _methods(z: _Zip, entry: str) -> dict[str, dict[int, Any]]:
    doc = z.json(entry) if entry in z.infos else {}
    if not isinstance(doc, dict) or not all(isinstance(m, str) and isinstance(t, dict) for m, t in doc.items()):
        raise z.error(entry, "expected {method: {instruction id: value}}")
    return {m: {_int_key(z, entry, k): v for k, v in t.items()} for m, t in doc.items()}


def read_tables(z: _Zip) -> tuple[dict[str, list], dict[str, dict[int, int]]]:
    """{method: [HandleGroup]} and {method: {delegate call instruction: number of outputs}}."""
    dhm = {m: {i: _handles(z, "debug_handle_map", v) for i, v in t.items()}
           for m, t in _methods(z, "debug_handle_map").items()}
    dmap: dict[str, dict[int, dict]] = {}
    for m, t in _methods(z, "delegate_map").items():
        for i, v in t.items():
            inner = v.get("delegate_map") if isinstance(v, dict) else None
            name = v.get("name") if isinstance(v, dict) else None
            if not isinstance(inner, dict) or not isinstance(name, (str, type(None))):
                raise z.error("delegate_map", f"instruction {i}: expected {{name, delegate_map}}")
            hs = {k: _handles(z, "delegate_map", h) for k, h in inner.items()}
            if not all(isinstance(h, list) for h in hs.values()):
                raise z.error("delegate_map", f"instruction {i}: delegate debug ids must map to handle lists")
            dmap.setdefault(m, {})[i] = {"name": name, "delegate_map": hs}
    outs = _methods(z, "instruction_id_to_num_outs_map")
    for m, t in outs.items():
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 20 for n in t.values()):
            raise z.error("instruction_id_to_num_outs_map", f"method {m!r}: counts must be non-negative integers")
    groups = {}
    for m, t in dhm.items():
        try:
            groups[m] = groups_from_tables(t, dmap.get(m), None)
        except (ValueError, TypeError) as e:
            raise z.error("debug_handle_map", f"method {m!r}: {e}") from None
    return groups, outs


# -- programs ------------------------------------------------------------------------------------------------------

def _check_nodes(z: _Zip, entry: str, x: Any, handles: dict[str, Any], depth: int = 0) -> None:
    """Rewrites edge-op targets to their ATen operators, refuses any other target, and collects each node's
    ``debug_handle`` and ``from_node`` metadata by name (sub-graphs included)."""
    if depth > _MAX_DEPTH:
        raise z.error(entry, "JSON nested too deeply")
    if isinstance(x, list):
        for v in x:
            _check_nodes(z, entry, v, handles, depth + 1)
        return
    if not isinstance(x, dict):
        return
    if "target" in x:  # a node (no other table of the schema has a "target" field)
        if isinstance(x["target"], str) and x["target"].removeprefix(_EDGE_OPS) in _DIM_ORDER_OPS:
            _dim_order_to_aten(x)
        x["target"] = _target(z, entry, x["target"])
        meta = x.get("metadata")
        if isinstance(meta, dict) and isinstance(x.get("name"), str):
            handles[x["name"]] = (meta.get("debug_handle"), meta.get("from_node"))
    for v in x.values():
        _check_nodes(z, entry, v, handles, depth + 1)


#: the reference's dim-order ops (registered by its runtime library, not by torch) and the ATen op computing the
#: same values: their ``dim_order`` argument becomes ATen's ``memory_format``
_DIM_ORDER_OPS = {"dim_order_ops._clone_dim_order.default": "torch.ops.aten.clone.default",
                  "dim_order_ops._to_dim_order_copy.default": "torch.ops.aten._to_copy.default"}
_MEMORY_FORMATS = {4: 2, 5: 3}  # rank -> torch.export's ChannelsLast / ChannelsLast3d code for a channels-last order
_CONTIGUOUS, _PRESERVE = 1, 4


def _dim_order_to_aten(node: dict[str, Any]) -> None:
    """Rewrites a dim-order op node (in place) into its ATen equivalent (see ``_DIM_ORDER_OPS``)."""
    node["target"] = _DIM_ORDER_OPS[node["target"].removeprefix(_EDGE_OPS)]
    inputs = []
    for a in node.get("inputs") or []:
        if not isinstance(a, dict) or a.get("name") != "dim_order":
            if not (node["target"].endswith("clone.default") and isinstance(a, dict)
                    and a.get("name") == "non_blocking"):  # aten.clone has no non_blocking
                inputs.append(a)
            continue
        order = a.get("arg", {}).get("as_ints") if isinstance(a.get("arg"), dict) else None
        if not isinstance(order, list):
            continue  # None: keep the input's layout (ATen's default)
        n = len(order)
        fmt = _CONTIGUOUS if order == list(range(n)) else \
            _MEMORY_FORMATS.get(n, _PRESERVE) if order == [0, *range(2, n), 1] else _PRESERVE
        inputs.append({"name": "memory_format", "arg": {"as_memory_format": fmt}, "kind": 2})
    node["inputs"] = inputs


def _target(z: _Zip, entry: str, t: Any) -> str:
    if not isinstance(t, str):
        raise z.error(entry, f"node target {str(t)[:60]!r} is not a string")
    if t.startswith(_EDGE_OPS):
        t = "torch.ops." + t[len(_EDGE_OPS):]
    m = _TARGET.match(t)
    if m and m.group(1) in _OP_NAMESPACES:
        lib = _OP_LIBRARIES.get(m.group(1))
        if lib is not None:
            import importlib

            importlib.import_module(lib)
        return t
    if t.startswith("_operator.") and t[len("_operator."):] in _OPERATORS:
        return t
    raise z.error(entry, f"unsupported node target {t[:120]!r} (only operators of the torch.ops namespaces "
                         f"{sorted(_OP_NAMESPACES)} are read)")


def _graph_ok(z: _Zip, entry: str, gm: torch.fx.GraphModule) -> None:
    import operator

    for mod in gm.modules():
        for n in getattr(mod, "graph", torch.fx.Graph()).nodes:
            if n.op != "call_function":
                continue
            t = n.target
            ok = (isinstance(t, torch._ops.OpOverload) and t.namespace in _OP_NAMESPACES) or \
                 any(t is getattr(operator, name, None) for name in _OPERATORS)
            if not ok:
                raise z.error(entry, f"node {n.name}: target {t!r} is not an allowed operator")


def read_program_doc(z: _Zip, entry: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checked torch.export document stored under ``entry`` (targets rewritten, verifiers cleared) and
    {node name: (debug handle, from_node JSON)}; its three companion entries must exist."""
    for s in _SUFFIXES:
        if entry + s not in z.infos:
            raise z.error(entry + s, "missing companion entry of the program")
    doc = z.json(entry)
    if not isinstance(doc, dict) or not isinstance(doc.get("graph_module"), dict):
        raise z.error(entry, "not a serialized ExportedProgram (no graph_module)")
    meta: dict[str, Any] = {}
    _check_nodes(z, entry, doc, meta)
    doc["verifiers"] = []  # the edge dialect's verifier is the reference's; the graph is checked above
    doc.pop("dialect", None)
    return doc, meta


def build_program(z: _Zip, entry: str, doc: dict[str, Any]) -> Any:
    """The ``ExportedProgram`` of a checked document (``read_program_doc``) and its companion entries."""
    from torch._export.serde.serialize import SerializedArtifact, deserialize

    state, consts, example = (z.torch_load(entry + s) for s in _SUFFIXES)
    if not isinstance(state, dict) or not isinstance(consts, dict) or not isinstance(example, (tuple, dict)):
        raise z.error(entry, "state dict / constants / example inputs of unexpected types")
    try:
        with converting():  # torch's document conversion with per-class plans (_serde_fast)
            ep = deserialize(SerializedArtifact(json.dumps(doc).encode(), state, consts, example),
                             _unsafe_skip_version_check=True)  # the reference writes an older schema version
    except Exception as e:  # torch's deserializer raises many kinds on malformed documents
        raise z.error(entry, f"cannot be deserialized as an ExportedProgram ({type(e).__name__}: "
                             f"{str(e)[:300]})") from None
    _graph_ok(z, entry, ep.graph_module)
    return ep


def _int_handle(raw: Any) -> Any:
    return int(raw) if isinstance(raw, str) and raw.isdigit() and len(raw) < 12 else raw


def _module_stack(s: Any) -> dict[str, tuple[str, str]] | None:
    """torch.export's ``"key,path,type;key,path,type"`` (commas inside brackets belong to the path)."""
    if not isinstance(s, str) or not s:
        return None
    out: dict[str, tuple[str, str]] = {}
    for item in s.split(";"):
        parts, start, depth = [], 0, 0
        for i, c in enumerate(item):
            depth += c in "[(" and 1 or (-1 if c in ")]" else 0)
            if c == "," and depth == 0:
                parts.append(item[start:i])
                start = i + 1
        parts.append(item[start:])
        if len(parts) != 3:
            return None
        out[parts[0]] = (parts[1], parts[2])
    return out


def handle_table_from_doc(z: _Zip, entry: str, doc: dict[str, Any]) -> dict[int, list[Any]]:
    """{debug handle: [NodeInfo]} of an edge program read from its document, without deserializing it (the
    same rows ``handles_from_program`` gives for the deserialized program)."""
    from edgetorch.devtools.etrecord._reference import NodeInfo
    from edgetorch.exir.op_variants import is_view_op

    table: dict[int, list[Any]] = {}
    for node in doc["graph_module"].get("graph", {}).get("nodes", []) or []:
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise z.error(entry, "a node without a name")
        meta = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
        raw = _int_handle(meta.get("debug_handle"))
        h = parse_handle(raw)
        if raw is not None and h is None and raw != 0:
            raise z.error(entry, f"node {node['name']}: debug handle {str(raw)[:40]!r} is not an integer")
        target = node["target"]
        if h is None or target == "_operator.getitem":
            continue
        if target.startswith("torch.ops."):
            ns, op, overload = target[len("torch.ops."):].split(".")
            packet = getattr(getattr(torch.ops, ns), op, None)
            ovl = getattr(packet, overload, None) if packet is not None else None
            is_view = bool(ovl is not None and is_view_op(ovl))
            name = f"{ns}::{op}"
        else:
            name, is_view = target.split(".")[-1], False
        trace = meta.get("stack_trace")
        table.setdefault(h, []).append(NodeInfo(node["name"], name, trace if isinstance(trace, str) else None,
                                                _module_stack(meta.get("nn_module_stack")), is_view))
    return table


def _edge_handles(z: _Zip, entry: str, meta: dict[str, Any]) -> dict[str, int]:
    """{node name: debug handle} of an edge program's nodes (handle 0, "unset", left out)."""
    out: dict[str, int] = {}
    for name, (raw, _chain) in meta.items():
        if raw is None:
            continue
        h = _int_handle(raw)
        if parse_handle(h) is None and h != 0:
            raise z.error(entry, f"node {name}: debug handle {str(raw)[:40]!r} is not an integer")
        if h:
            out[name] = h
    return out


def _stamp_edge(z: _Zip, entry: str, ep: Any, meta: dict[str, Any]) -> None:
    from edgetorch.exir.debug_handles import set_debug_handle

    handles = _edge_handles(z, entry, meta)
    for n in ep.graph.nodes:
        if n.name in handles:
            set_debug_handle(n, handles[n.name])


# -- the record ----------------------------------------------------------------------------------------------------

def _samples(z: _Zip, value: Any) -> list[tuple]:
    """Representative inputs: a list of input tuples (several samples) or one flat input list."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        return [tuple(v) for v in value]
    if isinstance(value, (list, tuple)):
        return [tuple(value)]
    raise z.error("representative_inputs", f"expected a list of inputs, got {type(value).__name__}")


def _program_entries(z: _Zip) -> tuple[dict[str, str], dict[str, str]]:
    """{method: entry} of the edge programs and {graph_map key: entry} of the extra programs."""
    edge: dict[str, str] = {}
    extra: dict[str, str] = {}
    reserved = {MARKER, _ATEN, *_TABLES, *_DATA}
    for name in z.infos:
        if name in reserved or name.endswith(_SUFFIXES) or name.endswith("/"):
            continue
        if name == _EDGE:
            edge["forward"] = name
        elif name.startswith(_EDGE + "/"):
            edge[name[len(_EDGE) + 1:]] = name
        elif name + "_state_dict" in z.infos:
            extra[name if "/" in name else f"{name}/forward"] = name
        else:
            log.warning("ExecuTorch ETRecord: entry %r not read", name)
    return edge, extra


class ReferenceSource:
    """The lazy program source of a parsed reference record (the interface of ``_archive.ArchiveSource``):
    documents, side tables and handle tables are read and checked at parse time; a program is deserialized
    (weights loaded) on first use only, so the numeric gap, which needs the ATen program, never loads the edge
    program's copy of the weights."""

    def __init__(self, source: Any, path: str | None, entries: dict[str, dict[str, str]],
                 docs: dict[str, dict[str, Any]], metas: dict[str, dict[str, Any]], graph_id: int | None,
                 handle_tables: dict[str, dict[int, list[Any]]]) -> None:
        self._source, self._path = source, path
        self._entries, self._docs, self._metas, self._graph_id = entries, docs, metas, graph_id
        self._tables = handle_tables
        self._programs: dict[tuple[str, str], Any] = {}
        self._bounds: dict[str, set[int]] = {}
        # the reference graphs are built from the documents (_executorch_graph), not from deserialized programs
        self.references = dict(entries["aten"])
        self.edge_references = dict(entries["edge"])
        self.graph_map_references = dict(entries["graph_map"])
        self.handles = dict(entries["edge"])  # handle tables come from the documents

    def keys(self, role: str) -> list[str]:
        return list(self._entries[role])

    def programs(self, role: str) -> dict[str, Any]:
        return {k: self.program(role, k) for k in self._entries[role]}

    def program(self, role: str, key: str) -> Any:
        hit = self._programs.get((role, key))
        if hit is None:
            entry = self._entries[role][key]
            z = _Zip(self._source, self._path)
            with z.zf:
                hit = build_program(z, entry, json.loads(json.dumps(self._docs[entry])))
            if role == "aten":
                self._link_aten(hit)
            else:
                _stamp_edge(z, entry, hit, self._metas[entry])
            self._programs[(role, key)] = hit
        return hit

    def reference_graph(self, method: str) -> Any:
        return self._graph("aten", method)

    def edge_reference_graph(self, method: str) -> Any:
        return self._graph("edge", method)

    def graph_map_reference_graph(self, key: str) -> Any:
        return self._graph("graph_map", key)

    def _graph(self, role: str, key: str) -> Any:
        """The runnable flat reference graph of a program, built from its document and weights
        (``_executorch_graph``); a document that converter cannot express is deserialized by torch instead."""
        from edgetorch.devtools.etrecord._executorch_graph import Unsupported, reference_document
        from edgetorch.devtools.etrecord._reference import GraphDataError, build_reference, reference_from_program
        from edgetorch.devtools.etrecord._tensors import UnsupportedValueError

        entry = self._entries[role][key]
        if (role, key) not in self._programs:
            z = _Zip(self._source, self._path)
            with z.zf:
                state, consts = (z.torch_load(entry + s) for s in _SUFFIXES[:2])
                handles = {} if role == "aten" else _edge_handles(z, entry, self._metas[entry])
            if not isinstance(state, dict) or not isinstance(consts, dict):
                raise z.error(entry, "state dict / constants of unexpected types")
            try:
                with _gc_paused():
                    doc, tensors = reference_document(self._docs[entry], state, consts, key, handles, _module_stack)
                    gm = build_reference(doc, lambda i, what, param, rg: tensors[i])
            except (Unsupported, GraphDataError, KeyError, TypeError, ValueError, AttributeError, IndexError,
                    RecursionError) as e:  # a malformed document: torch's deserializer names the fault
                log.debug("ExecuTorch ETRecord %s: %s; deserializing it with torch", entry, e)
            else:
                if role == "aten":
                    self._link_aten(gm)
                return gm
        try:
            return reference_from_program(self.program(role, key), key)
        except UnsupportedValueError as e:
            log.warning("ExecuTorch ETRecord: no reference graph for %r: %s", entry, e)
            return None

    def _link_aten(self, aten: Any) -> None:
        counts = {h: len(ns) for h, ns in self._tables.get("forward", {}).items()}
        if not propagate_handles(aten, self._metas.get(self._entries["edge"].get("forward", ""), {}),
                                 self._graph_id, counts):
            log.warning("ExecuTorch ETRecord: no ATen node could be linked to a debug handle")

    def aten_handle_bound(self, key: str) -> set[int] | None:
        """A superset of the debug handles the ATen program ``key`` carries once built (``program``), from its
        document alone; None when the record has no such program."""
        entry = self._entries["aten"].get(key)
        if entry is None:
            return None
        if key not in self._bounds:  # the documents never change: computed once
            counts = {h: len(ns) for h, ns in self._tables.get("forward", {}).items()}
            self._bounds[key] = aten_handle_bound(
                self._docs[entry], self._metas.get(self._entries["edge"].get("forward", ""), {}), self._graph_id,
                counts)
        return set(self._bounds[key])

    def is_stored(self, role: str, key: str, ep: Any) -> bool:
        return ep is not None and self._programs.get((role, key)) is ep

    def handle_table(self, method: str) -> dict[int, list[Any]]:
        return self._tables[method]


def read_executorch_etrecord(source: Any, path: str | None = None) -> tuple[dict[str, Any], dict[str, Any],
                                                                          ReferenceSource]:
    """Reads a reference ETRecord (path, bytes or binary file): the keyword arguments of edgetorch's
    ``ETRecord``, its extra attributes (``producer`` "executorch", ``num_outputs`` {method: {delegate call
    instruction: number of outputs}}, ``export_graph_id``) and the lazy program source; ``parse_etrecord``
    builds the record. Programs are deserialized on first use (then a bad weight entry raises)."""
    if hasattr(source, "read"):
        source = source.read()
    z = _Zip(source, path)
    with z.zf, _gc_paused():
        if "debug_handle_map" not in z.infos:  # the reference's save() refuses a record without one
            raise z.error("debug_handle_map", "missing entry (the reference writes it in every ETRecord)")
        groups, num_outs = read_tables(z)
        graph_id = z.json("export_graph_id") if "export_graph_id" in z.infos else None
        if graph_id is not None and (not isinstance(graph_id, int) or isinstance(graph_id, bool)):
            raise z.error("export_graph_id", f"{str(graph_id)[:40]!r} is not an integer")
        edge, extra = _program_entries(z)
        if not edge:
            raise z.error(_EDGE, "missing entry: the record holds no edge program")
        entries = {"edge": edge, "graph_map": extra, "aten": {"forward": _ATEN} if _ATEN in z.infos else {}}
        docs, metas = {}, {}
        for entry in [*edge.values(), *extra.values(), *entries["aten"].values()]:
            docs[entry], metas[entry] = read_program_doc(z, entry)
        tables = {m: handle_table_from_doc(z, e, docs[e]) for m, e in edge.items()}
        reps = z.torch_load("representative_inputs") if "representative_inputs" in z.infos else None
        refs = z.torch_load("reference_outputs") if "reference_outputs" in z.infos else None
    if refs is not None and not (isinstance(refs, dict) and all(isinstance(k, str) and isinstance(v, list)
                                                                for k, v in refs.items())):
        raise z.error("reference_outputs", "expected {method: [outputs per test case]}")
    fields = dict(handle_groups=groups, _reference_outputs=refs,
                  _representative_inputs=None if reps is None else {"forward": _samples(z, reps)})
    extra_attrs = {"producer": PRODUCER, "num_outputs": num_outs, "export_graph_id": graph_id}
    return fields, extra_attrs, ReferenceSource(source, path, entries, docs, metas, graph_id, tables)
