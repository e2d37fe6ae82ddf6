"""How a delegate's large weights reach ONNX Runtime (runtime side; needs onnx only when a model is rewritten).

ORT copies every weight handed to a session as an initializer (``add_external_initializers``), per session:
a multi-method program (an LLM's prefill and decode) holds one copy per method. That copy pays off where ORT
prepacks the weight (``MatMulNBits``, ``MatMul``, ``Conv``...: the packed form replaces it), not where a kernel
only reads it: a weight whose every consumer is in ``IN_PLACE_OPS`` (``Gather``: an embedding table reads a few
rows per token) is turned into a graph input of the plain model and bound, in each run, to the program's mapped
bytes (``OrtValue`` over the named data: no copy, and only the pages of the rows read become resident, shared by
every method). The weights ORT does prepack are packed once per session: ``shared_session`` gives delegates
that read the same stored blob one session. Measured on llama_100m 8da4w (docs/performance.md, *ORT resident
memory*): the 94 MiB float embedding was copied, and 60 MiB of int4 weights packed, by each method's sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["IN_PLACE_OPS", "in_place_weights", "rewrite", "inline", "shared_session"]

#: ops that read a weight without ORT prepacking it (the ``in_place_ops`` runtime option overrides it)
IN_PLACE_OPS = frozenset({"Gather"})


def in_place_weights(proto: object, names: Iterable[str], ops: frozenset[str]) -> list[str]:
    """The weights among ``names`` (initializers of ``proto``, an ``onnx.ModelProto``) that every node of the
    main graph consuming them is one of ``ops``, and no subgraph or graph output uses."""
    wanted = set(names)
    if not wanted or not ops:
        return []
    users: dict[str, set[str]] = {}
    for node in proto.graph.node:  # type: ignore[attr-defined]
        if any(a.g.node or a.graphs for a in node.attribute):  # a subgraph may read any weight: keep them all
            return []
        for x in node.input:
            if x in wanted:
                users.setdefault(x, set()).add(node.op_type)
    outputs = {o.name for o in proto.graph.output}  # type: ignore[attr-defined]
    return sorted(n for n, used in users.items() if used <= ops and n not in outputs)


def rewrite(proto: object, bound: Iterable[str]) -> bool:
    """Turns the initializers named in ``bound`` into graph inputs of ``proto`` (in place); True if any was."""
    import onnx

    bound = set(bound)
    g = proto.graph  # type: ignore[attr-defined]
    moved = [t for t in g.initializer if t.name in bound]
    if not moved:
        return False
    kept = [t for t in g.initializer if t.name not in bound]
    del g.initializer[:]
    g.initializer.extend(kept)
    g.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved)
    return True


def inline(model: bytes, arrays: Mapping[str, np.ndarray]) -> bytes:
    """``model`` with its external initializers found in ``arrays`` inline (a transient copy: ORT accepts
    ``add_initializer`` only for an initializer whose data the model holds, then uses the caller's buffer)."""
    import onnx

    proto = onnx.ModelProto()
    proto.ParseFromString(model)
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL and t.name in arrays:
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = arrays[t.name].tobytes()
    return proto.SerializeToString()


def shared_session(named_data: object, blob: memoryview | bytes, options: Mapping[str, str],
                   build: Callable[[], Any]) -> Any:
    """The plain session of a delegate, shared by every delegate of the same program that reads the same stored
    blob (emission stores identical blobs once) with the same runtime options (``build()`` makes it the first
    time). Keyed on the blob's place in the loaded program, not its content: nothing to hash at load.

    A multi-method program whose methods lower the same graph (an LLM's prefill and decode exported from one
    dynamic-length graph) stores the blob once and both methods' delegates point at it: one ORT session, one
    copy of the prepacked weights (``MatMulNBits`` packs its own per session, and ORT's Python API cannot share
    prepacked weights between sessions). The cache lives on the loaded program (the owner of ``named_data``):
    it goes with it. Without a program (``named_data`` not a bound method of one), nothing is shared."""
    owner = getattr(named_data, "__self__", None)
    if owner is None or not hasattr(owner, "__dict__"):
        return build()
    view = np.frombuffer(blob, dtype=np.uint8)
    key = (view.ctypes.data, view.nbytes, tuple(sorted(options.items())))
    cache = owner.__dict__.setdefault("_onnxruntime_sessions", {})
    if key not in cache:
        cache[key] = build()
    return cache[key]
