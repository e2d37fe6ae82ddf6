"""The import graph of ``src/edgetorch``: no cycles, and every arrow points downstream.

Layers, bottom first: ``errors``/``_fileio``/``_version``/``_hooks``/``formats`` -> ``exir`` (compiler) and
``runtime`` (neither imports the other) -> ``backends`` -> ``export`` -> ``models`` -> ``devtools`` -> ``cli``; the
root package (``edgetorch/__init__.py``) is the application layer that wires them (``_hooks``). Imports under
``if TYPE_CHECKING:`` are annotations, not dependencies; imports inside functions are dependencies. A new cycle or
a new upward import fails here with the modules named; docs/architecture.md explains the layers.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "edgetorch"

#: top-level sub-package -> the sub-packages it may import (besides itself)
_BOTTOM = {"errors", "_fileio", "_version", "_hooks", "_quiet"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_version": set(),
    "_hooks": set(),
    "_quiet": set(),
    "_fileio": {"errors"},
    "formats": _BOTTOM,
    "exir": _BOTTOM | {"formats"},
    "runtime": _BOTTOM | {"formats"},
    "backends": _BOTTOM | {"formats", "exir", "runtime"},
    "export": _BOTTOM | {"formats", "exir", "runtime", "backends"},
    "models": _BOTTOM | {"formats", "exir", "runtime", "backends", "export"},
    "devtools": _BOTTOM | {"formats", "exir", "runtime", "backends", "export", "models"},
    "cli": _BOTTOM | {"formats", "exir", "runtime", "backends", "export", "models", "devtools"},
    "__main__": {"cli"},
    # the application layer: fills edgetorch._hooks (the ETRecord builder), so it may import every layer; no
    # layer imports it (the version lives in edgetorch._version)
    "(root)": _BOTTOM | {"formats", "exir", "runtime", "backends", "export", "models", "devtools", "cli"},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in SRC.rglob("*.py"):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            skip.update(id(d) for c in n.body for d in ast.walk(c))
    return skip


def _imported(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    raw: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            raw.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
        elif isinstance(node, ast.Import):
            raw.update(a.name for a in node.names)
    out = set()
    for m in raw:
        while m.startswith("edgetorch") and m not in mods:
            m = m.rpartition(".")[0]
        if m.startswith("edgetorch") and m != name:
            out.add(m)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imported(name, path, mods) for name, path in mods.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in graph:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_every_import_points_downstream():
    upward = []
    for a, deps in _graph().items():
        for b in deps:
            la, lb = _layer(a), _layer(b)
            if la != lb and lb not in ALLOWED.get(la, set()):
                upward.append(f"{a} -> {b}")
    assert upward == [], "imports against the layering (see docs/architecture.md):\n" + "\n".join(sorted(upward))


def test_the_compiler_does_not_reach_the_developer_tools():
    """The compiler keeps its stage history as plain data; the devtools build the ETRecord from it."""
    graph = _graph()
    assert not [(a, b) for a, deps in graph.items() if _layer(a) == "exir" for b in deps if _layer(b) == "devtools"]
    assert "edgetorch.devtools.etrecord" in graph["edgetorch"]  # the root wires the ETRecord builder
    assert not [b for b in graph["edgetorch.exir.passes"] if b.startswith("edgetorch.exir.backend")]


def test_the_checker_sees_cycles_and_type_checking_imports(tmp_path):
    """The analysis itself: a planted cycle is found; an annotation-only import is not a dependency."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    mods = {"edgetorch.x": tmp_path / "x.py", "edgetorch.y": tmp_path / "y.py"}
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edgetorch.y import Y\n"
    mods["edgetorch.x"].write_text(src)
    assert _imported("edgetorch.x", mods["edgetorch.x"], mods) == set()
    mods["edgetorch.x"].write_text("def f():\n    from edgetorch import y\n")
    assert _imported("edgetorch.x", mods["edgetorch.x"], mods) == {"edgetorch.y"}
