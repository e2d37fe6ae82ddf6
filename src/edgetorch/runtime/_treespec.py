"""The input/output structure a program stores (torch pytree ``treespec_dumps`` JSON), read without importing
anything it names.

``Method.execute`` takes and returns flat lists, so a program runs without the model's Python classes. The
structure is needed only to order keyword inputs and, on request, to rebuild the model's own output object:
that uses torch's pytree registry of the running process (the class must already be imported; a .pte never
makes the runtime import a module).
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import torch.utils._pytree as pytree

from edgetorch.errors import ProgramFormatError, RuntimeInputError

_BUILTIN = {"builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict"}
_NEVER = {"collections.defaultdict", "collections.deque", "NO_SERIALIZED_TYPE_NAME_FOUND"}  # may import on load
MAX_NODES = 1 << 16


def parse(text: str, field: str) -> dict | None:
    """The root node of a stored spec (``None`` when the program has none), checked for shape."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ProgramFormatError(f"{field} is not valid JSON ({e})", field=field) from None
    if not (isinstance(doc, list) and len(doc) == 2 and isinstance(doc[1], dict)):
        raise ProgramFormatError(f"{field} is not a [protocol, tree] pair", field=field)
    count = 0
    stack = [doc[1]]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ProgramFormatError(f"{field} has more than {MAX_NODES} nodes", field=field)
        if not isinstance(node, dict) or not isinstance(node.get("children_spec"), list) \
                or not (node.get("type") is None or isinstance(node.get("type"), str)):
            raise ProgramFormatError(f"{field} has a malformed node", field=field)
        stack.extend(node["children_spec"])
    return doc[1]


def num_leaves(node: dict) -> int:
    if node["type"] is None:
        return 1
    return sum(num_leaves(c) for c in node["children_spec"])


def type_names(node: dict) -> set[str]:
    names = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n["type"] is not None:
            names.add(n["type"])
        stack.extend(n["children_spec"])
    return names


def kwarg_order(root: dict | None) -> list[str] | None:
    """Keyword-input names in the order the program was exported with (``(args, kwargs)`` spec)."""
    if root is None or root["type"] != "builtins.tuple" or len(root["children_spec"]) != 2:
        return None
    kw = root["children_spec"][1]
    if kw["type"] != "builtins.dict":
        return None
    try:
        keys = json.loads(kw["context"])
    except (TypeError, ValueError):
        return None
    return keys if isinstance(keys, list) and all(isinstance(k, str) for k in keys) else None


def unflatten(text: str, root: dict | None, flat: list, method: str) -> Any:
    """The model's own output structure around ``flat``; the classes it names must be imported already."""
    if root is None:
        return flat
    unknown = sorted(t for t in type_names(root) if t not in _BUILTIN
                     and (t in _NEVER or t not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE))
    if unknown:
        raise RuntimeInputError(
            f"method '{method}': its outputs are structured as {', '.join(unknown)}, which is not registered with "
            "torch.utils._pytree in this process; import the module that defines it (e.g. transformers) to get "
            "that structure, or use execute() for the flat list of outputs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        spec = pytree.treespec_loads(text)
    return pytree.tree_unflatten(flat, spec)
