"""The lowered modules of a delegated program, stored beside it in an ETRecord without pickle.

A lowered program holds each partition as a ``LoweredBackendModule`` submodule (``lowered_module_<i>``) that its
delegate calls take as first argument (``exir.backend.lowered``). torch's program serializer writes such an
argument as the string ``"<module name>-<backend id>"`` and nothing else, so the program's tensor index gets a
``lowered_modules`` list: per module its name, backend id, compile specs (values base64), backend op id ->
debug handles map, debug-buffer bytes, blob (``processed_bytes``, in ``tensors.bin`` as uint8), named data
(``named_data``: [key, uint8 tensor] pairs, only when there is some) and its
``original_module`` serialized like any program (graph JSON and tensor index, nested). Reading rebuilds each
module and puts the ``get_attr`` node back in front of its calls.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Any

import torch
from torch.export import ExportedProgram

from edgetorch.devtools.etrecord._tensors import TensorBlobWriter, TensorReader
from edgetorch.exir.backend.lowered import LoweredBackendModule, is_delegate_call, lowered_modules
from edgetorch.exir.backend.partitioner import CompileSpec

__all__ = ["MAX_NESTING", "LoweredDataError", "encode_lowered", "restore_lowered"]

#: a lowered module's original program may itself hold lowered modules, this many levels deep at most
MAX_NESTING = 2
_KEYS = {"name", "backend_id", "processed_bytes", "compile_specs", "debug_handle_map", "debug_buffer_bytes",
         "program"}
_OPTIONAL = {"named_data"}
_NAME_RE = re.compile(r"^lowered_module_\d{1,9}$")
_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


class LoweredDataError(ValueError):
    """A malformed ``lowered_modules`` entry (the caller names the zip entry)."""


def encode_lowered(ep: ExportedProgram, blobs: TensorBlobWriter, what: str,
                   serialize: Callable[[ExportedProgram, str], tuple[Any, Any]]) -> list[dict[str, Any]]:
    """The ``lowered_modules`` list of ``ep`` (empty without delegate calls); ``serialize(program, what)`` gives
    the (graph, index) JSON objects of an original program."""
    out = []
    for name, lm in lowered_modules(ep.graph_module).items():
        lm.module_name = name  # what torch's serializer writes in the call's first argument
        where = f"{what}: lowered module {name!r}"
        graph, index = serialize(lm.original_module, where)
        named = getattr(lm, "named_data", None) or {}
        extra = {"named_data": [[k, blobs.add(_u8(v), f"{where} named data {k!r}")] for k, v in named.items()]} \
            if named else {}
        out.append({**extra, "name": name, "backend_id": lm.backend_id,
                    "processed_bytes": blobs.add(_u8(lm.processed_bytes), where),
                    "compile_specs": [[c.key, base64.b64encode(bytes(c.value)).decode()] for c in lm.compile_specs],
                    "debug_handle_map": [[k, [int(h) for h in v]] for k, v in lm.debug_handle_map.items()],
                    "debug_buffer_bytes": lm.debug_buffer_bytes, "program": {"graph": graph, "index": index}})
    return out


def _u8(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def _bytes(reader: TensorReader, ref: Any, what: str) -> bytes:
    t = reader.read(ref, what)
    if t.dtype != torch.uint8 or t.dim() != 1:
        raise LoweredDataError(f"{what} must be a 1-d uint8 tensor")
    return t.numpy().tobytes()


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _module(item: Any, reader: TensorReader, build: Callable[[Any, Any], ExportedProgram]) -> LoweredBackendModule:
    if not isinstance(item, dict) or not _KEYS <= set(item) <= _KEYS | _OPTIONAL or not isinstance(item["name"], str) \
            or not _NAME_RE.match(item["name"]):
        raise LoweredDataError("a lowered module entry must hold exactly " + ", ".join(sorted(_KEYS))
                               + " (and named_data)")
    name = item["name"]
    if not isinstance(item["backend_id"], str) or not _ID_RE.match(item["backend_id"]):
        raise LoweredDataError(f"lowered module {name!r}: backend_id must be a short identifier")
    specs = item["compile_specs"]
    if not isinstance(specs, list) or not all(isinstance(c, list) and len(c) == 2 and isinstance(c[0], str)
                                              and isinstance(c[1], str) for c in specs):
        raise LoweredDataError(f"lowered module {name!r}: compile_specs must be [key, base64 value] pairs")
    try:
        compile_specs = [CompileSpec(k, base64.b64decode(v, validate=True)) for k, v in specs]
    except (binascii.Error, ValueError):
        raise LoweredDataError(f"lowered module {name!r}: a compile spec value is not base64") from None
    dmap = item["debug_handle_map"]
    if not isinstance(dmap, list) or not all(
            isinstance(e, list) and len(e) == 2 and (_int(e[0]) or isinstance(e[0], str))
            and isinstance(e[1], list) and all(_int(h) for h in e[1]) for e in dmap):
        raise LoweredDataError(f"lowered module {name!r}: debug_handle_map must be [backend id, [handles]] pairs")
    dbb = item["debug_buffer_bytes"]
    if dbb is not None and not (_int(dbb) and dbb >= 0):
        raise LoweredDataError(f"lowered module {name!r}: debug_buffer_bytes must be null or an int >= 0")
    prog = item["program"]
    if not isinstance(prog, dict) or set(prog) != {"graph", "index"}:
        raise LoweredDataError(f"lowered module {name!r}: program must hold graph and index")
    named = item.get("named_data", [])
    if not isinstance(named, list) or not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and e[0]
                                              for e in named) or len({e[0] for e in named}) != len(named):
        raise LoweredDataError(f"lowered module {name!r}: named_data must be [key, tensor] pairs, one per key")
    return LoweredBackendModule(
        item["backend_id"], _bytes(reader, item["processed_bytes"], f"lowered module {name!r} processed_bytes"),
        compile_specs, build(prog["graph"], prog["index"]), {k: tuple(v) for k, v in dmap}, dbb,
        {k: _bytes(reader, ref, f"lowered module {name!r} named data {k!r}") for k, ref in named})


def restore_lowered(ep: ExportedProgram, items: Any, reader: TensorReader,
                    build: Callable[[Any, Any], ExportedProgram]) -> None:
    """Rebuilds the lowered modules of ``items`` on ``ep``'s graph module and makes each delegate call take its
    module from a ``get_attr`` node again; ``build(graph, index)`` rebuilds an original program. Raises
    ``LoweredDataError`` for a malformed entry or a delegate call naming a module the entry does not hold."""
    if not isinstance(items, list):
        raise LoweredDataError("lowered_modules must be a list")
    modules: dict[str, LoweredBackendModule] = {}
    for item in items:
        lm = _module(item, reader, build)
        if item["name"] in modules:
            raise LoweredDataError(f"lowered module {item['name']!r} is stored twice")
        modules[item["name"]] = lm
    gm = ep.graph_module
    attrs: dict[str, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if not is_delegate_call(node) or not node.args or not isinstance(node.args[0], str):
            continue
        name = node.args[0].split("-", 1)[0]
        if name not in modules:
            raise LoweredDataError(f"delegate call {node.name!r} calls lowered module {name!r}, which the record "
                                   "does not hold")
        if name not in attrs:
            lm = modules[name]
            if hasattr(gm, name):
                raise LoweredDataError(f"lowered module {name!r} would shadow an attribute of the graph module")
            gm.add_module(name, lm)
            lm.module_name = name
            with gm.graph.inserting_before(node):
                attrs[name] = gm.graph.get_attr(name)
        node.args = (attrs[name], *node.args[1:])
    if set(attrs) != set(modules):
        raise LoweredDataError(f"lowered modules {sorted(set(modules) - set(attrs))} are called by no delegate call")
    gm.recompile()
