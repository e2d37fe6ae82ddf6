"""A faster stand-in for torch's ``torch._export.serde.serialize._dict_to_dataclass`` during one deserialization.

torch converts a program document (JSON) to its schema dataclasses with a recursive function that, at every
node, argument and tensor, resolves the class again, asks ``typing.get_type_hints`` of it and lists its fields
(~14,000 calls for a ViT-S edge program: a third to a half of its deserialization). ``converting()`` replaces that
module function, for the duration of one call, by the same conversion with each class's plan (its kind, its type
hints, its fields) computed once: the same objects come out, the same ``AssertionError``s for malformed input.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import types
import typing
from collections.abc import Callable, Iterator
from typing import Annotated, Any

_OPTIONAL, _UNION, _DATACLASS, _ANNOTATED, _OTHER = range(5)


def _plan(serde: Any, cls: Any) -> tuple:
    cls = serde._resolve_schema_cls(cls)
    if isinstance(cls, str):
        raise AssertionError(f"Unresolved class type: '{cls}'.")
    schema = serde.schema
    if typing.get_origin(cls) is Annotated:
        return (_ANNOTATED, cls.__origin__)
    if typing.get_origin(cls) in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        return (_OPTIONAL, typing.get_args(cls))
    if isinstance(cls, type) and issubclass(cls, serde._Union):
        return (_UNION, cls, typing.get_type_hints(cls, globalns=vars(schema)))
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, globalns=vars(schema))
        return (_DATACLASS, cls, tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls)))
    return (_OTHER, cls, typing.get_args(cls))


def _converter(serde: Any) -> Callable[[Any, Any], Any]:
    plans: dict[Any, tuple] = {}
    original = serde._dict_to_dataclass

    def convert(cls: Any, data: Any) -> Any:
        try:
            p = plans.get(cls)
        except TypeError:  # an unhashable annotation: torch's own conversion
            return original(cls, data)
        if p is None:
            p = plans[cls] = _plan(serde, cls)
        kind = p[0]
        if kind == _DATACLASS:
            return p[1](**{name: convert(ft, data[name]) for name, ft in p[2] if name in data})
        if kind == _ANNOTATED:
            return convert(p[1], data)
        if kind == _OPTIONAL:
            if data is None:
                return None
            if len(p[1]) != 2:
                raise AssertionError(f"expected 2 type args, got {len(p[1])}")
            return convert(p[1][0], data)
        if kind == _UNION:
            if not isinstance(data, dict):
                raise AssertionError(f"expected dict, got {type(data).__name__}")
            if len(data) != 1:
                raise AssertionError(f"expected dict with 1 key, got {len(data)}")
            _type, _value = next(iter(data.keys())), next(iter(data.values()))
            if not isinstance(_type, str):
                raise AssertionError(f"expected str key, got {type(_type).__name__}")
            return p[1].create(**{_type: convert(p[2][_type], _value)})
        cls, args = p[1], p[2]
        if isinstance(data, list):
            return data if not data else [convert(args[0], d) for d in data]
        if isinstance(data, dict):
            return {k: convert(args[1], v) for k, v in data.items()}
        if cls is float:
            return float(data)
        return data

    return convert


_SWAP_LOCK = threading.Lock()
_active = 0  # nested or concurrent ``converting()`` blocks: torch's function is put back when the last one ends
_saved: Any = None


@contextlib.contextmanager
def converting() -> Iterator[None]:
    """torch's serde module converts documents with the planned conversion inside the ``with`` block (safe across
    threads and nesting: the original is restored once, when no block is left)."""
    import torch._export.serde.serialize as serde

    global _active, _saved
    with _SWAP_LOCK:
        if _active == 0:
            _saved = serde._dict_to_dataclass
            serde._dict_to_dataclass = _converter(serde)
        _active += 1
    try:
        yield
    finally:
        with _SWAP_LOCK:
            _active -= 1
            if _active == 0:
                serde._dict_to_dataclass = _saved
