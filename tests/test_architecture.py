"""The import graph of ``src/edgetorch``: no cycles, and every arrow points downstream.

Layers, bottom first: ``errors``/``_fileio``/``_version``/``_hooks``/``formats`` -> ``exir`` (compiler) and
``runtime`` (neither imports the other) -> ``backends`` -> ``export`` -> ``models``, and beside them ``devtools``
(the debugger: it reads the compiler's plain data, never the export session) -> ``workflows`` (what uses both the
export session and the debugger: ``find_fix``, selective fallback) -> ``cli``; the root package
(``edgetorch/__init__.py``) is the application layer that wires them (``_hooks``). Every import is a dependency:
at module level, inside a function, or under ``if TYPE_CHECKING:`` (an annotation still couples the modules;
issue 27). A new cycle or a new upward import fails here with the modules and the kind of each import
named; docs/architecture.md explains the layers and the backend contract.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "edgetorch"

#: top-level sub-package -> the sub-packages it may import (besides itself)
_BOTTOM = {"errors", "_fileio", "_version", "_hooks", "_quiet", "_progress"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_version": set(),
    "_hooks": set(),
    "_quiet": set(),
    "_progress": set(),
    "_fileio": {"errors"},
    "formats": _BOTTOM,
    "exir": _BOTTOM | {"formats"},
    "runtime": _BOTTOM | {"formats"},
    "backends": _BOTTOM | {"formats", "exir", "runtime"},
    "export": _BOTTOM | {"formats", "exir", "runtime", "backends"},
    "models": _BOTTOM | {"formats", "exir", "runtime", "backends", "export"},
    # the debugger reads the compiler's plain data (StageHistory, HandleGroup, exir.quant_annotations), never the
    # export session: what uses both is a workflow
    "devtools": _BOTTOM | {"formats", "exir", "runtime", "backends"},
    # the reference's one-call export helpers (executorch.extension.export_util): the compiler's public API only
    "extension": _BOTTOM | {"formats", "exir", "runtime", "backends"},
    # the reference's executorch.util (the activation memory profiler): reads the compiler's emitted plan
    "util": _BOTTOM | {"formats", "exir"},
    "workflows": _BOTTOM | {"formats", "exir", "runtime", "backends", "export", "models", "devtools"},
    "cli": _BOTTOM | {"formats", "exir", "runtime", "backends", "export", "models", "devtools", "workflows"},
    "__main__": {"cli"},
    # the application layer: fills edgetorch._hooks (the ETRecord builder), so it may import every layer; no
    # layer imports it (the version lives in edgetorch._version)
    "(root)": _BOTTOM | {"formats", "exir", "runtime", "backends", "export", "models", "devtools", "workflows",
                         "cli"},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in SRC.rglob("*.py"):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


#: an import's kind: at module level, inside a function (or lambda), or under ``if TYPE_CHECKING:``
MODULE, FUNCTION, TYPE_CHECKING = "module", "function", "type_checking"
_RANK = {MODULE: 0, FUNCTION: 1, TYPE_CHECKING: 2}  # an edge is as strong as its strongest import


def _import_kinds(tree: ast.AST) -> dict[int, str]:
    """``id(node)`` -> kind, for every node under a ``TYPE_CHECKING`` test or inside a function."""
    kinds: dict[int, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in ast.walk(n):
                if d is not n:
                    kinds.setdefault(id(d), FUNCTION)
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            kinds.update((id(d), TYPE_CHECKING) for c in n.body for d in ast.walk(c))
    return kinds


def _import_edges(name: str, path: Path, mods: dict[str, Path]) -> dict[str, str]:
    """The edgetorch modules ``name`` imports -> the kind of its strongest import of each."""
    tree = ast.parse(path.read_text())
    kinds = _import_kinds(tree)
    raw: dict[str, str] = {}

    def add(m: str, kind: str) -> None:
        if m not in raw or _RANK[kind] < _RANK[raw[m]]:
            raw[m] = kind

    for node in ast.walk(tree):
        kind = kinds.get(id(node), MODULE)
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            for a in node.names:
                add(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base, kind)
        elif isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, kind)
    out: dict[str, str] = {}
    for m, kind in raw.items():
        while m.startswith("edgetorch") and m not in mods:
            m = m.rpartition(".")[0]
        if m.startswith("edgetorch") and m != name and (m not in out or _RANK[kind] < _RANK[out[m]]):
            out[m] = kind
    return out


def _imported(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every edgetorch module ``name`` depends on, whatever the kind of import."""
    return set(_import_edges(name, path, mods))


def _graph(kinds: frozenset[str] = frozenset(_RANK)) -> dict[str, dict[str, str]]:
    """module -> {imported module: kind}, keeping the imports of the given kinds (default: all)."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        graph[name] = {m: k for m, k in _import_edges(name, path, mods).items() if k in kinds}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def _cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
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


#: cycles tolerated as known exceptions: none. The three annotation-only ones found when the check began counting
#: ``TYPE_CHECKING`` imports (``_archive <-> _etrecord``, ``generation <-> inspector``, ``recipe <-> registry``) are
#: broken (issue 27); a cycle of any kind of import fails.
KNOWN_CYCLES: list[set[str]] = []


def _describe(cycle: list[str], graph: dict[str, dict[str, str]]) -> str:
    """A cycle's modules and the imports between them, each with its kind."""
    edges = [f"    {a} -> {b} ({graph[a][b]})" for a in cycle for b in sorted(graph[a]) if b in cycle]
    return "  " + " <-> ".join(cycle) + "\n" + "\n".join(edges)


def test_no_import_cycles():
    """No cycle counting every import (module level, in functions, under TYPE_CHECKING) but the known ones."""
    graph = _graph()
    cycles = _cycles(graph)
    new = [c for c in cycles if set(c) not in KNOWN_CYCLES]
    assert new == [], "import cycles (see docs/architecture.md):\n" + "\n".join(_describe(c, graph) for c in new)
    gone = [sorted(k) for k in KNOWN_CYCLES if sorted(k) not in cycles]
    assert gone == [], f"these cycles are broken now: remove them from KNOWN_CYCLES: {gone}"


def test_no_import_cycles_at_run_time():
    """The known cycles are annotation-only: the imports that execute (module level, in functions) have none."""
    graph = _graph(frozenset({MODULE, FUNCTION}))
    cycles = _cycles(graph)
    assert cycles == [], "\n".join(_describe(c, graph) for c in cycles)


def _upward(graph: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Every import against ``ALLOWED``, with its kind (module, function or type_checking)."""
    out = []
    for a, deps in graph.items():
        for b, kind in deps.items():
            la, lb = _layer(a), _layer(b)
            if la != lb and lb not in ALLOWED.get(la, set()):
                out.append(f"{a} -> {b} ({kind})")
    return sorted(out)


def test_every_import_points_downstream():
    """No upward import of any kind: at module level, inside a function or under ``TYPE_CHECKING``."""
    upward = _upward(_graph())
    assert upward == [], "imports against the layering (see docs/architecture.md):\n" + "\n".join(upward)


def test_the_compiler_does_not_reach_the_developer_tools():
    """The compiler keeps its stage history as plain data; the devtools build the ETRecord from it."""
    graph = _graph()
    assert not [(a, b) for a, deps in graph.items() if _layer(a) == "exir" for b in deps if _layer(b) == "devtools"]
    assert "edgetorch.devtools.etrecord" in graph["edgetorch"]  # the root wires the ETRecord builder
    assert not [b for b in graph["edgetorch.exir.passes"] if b.startswith("edgetorch.exir.backend")]


def test_the_debugger_does_not_reach_the_export_session():
    """``devtools`` imports neither ``export`` nor ``models`` (at module level, in a function or for annotations):
    the quantizer's annotation tables it reads live in ``exir.quant_annotations``; ``find_fix`` and selective
    fallback, which re-export, live in ``workflows``."""
    graph = _graph()
    assert not [(a, b) for a, deps in graph.items() if _layer(a) == "devtools" for b in deps
                if _layer(b) in ("export", "models", "workflows", "cli")]
    assert not [(a, b) for a, deps in graph.items() if _layer(a) in ("export", "models") for b in deps
                if _layer(b) in ("devtools", "workflows")]


def _closure(roots: Iterable[str], graph: Mapping[str, Iterable[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def test_a_backend_runtime_side_imports_only_the_runtime_and_below():
    """The backend contract (docs/architecture.md): ``backends/<name>/runtime.py`` and everything it imports, in
    any function, plus what its package ``__init__``s import at module level (a package's lazy ``__getattr__``
    loads the AOT side only when asked), reach only the bottom modules, ``formats``, ``runtime`` and the
    backend's own runtime helpers, never its ahead-of-time side (tests/test_backend_contract.py runs it)."""
    allowed = _BOTTOM | {"formats", "runtime"}
    full = _graph()
    for folder in sorted(p for p in (SRC / "backends").iterdir() if (p / "__init__.py").is_file()):
        pkg = f"edgetorch.backends.{folder.name}"
        graph = dict(full)
        for init in ("edgetorch.backends", pkg):
            graph[init] = {m: k for m, k in graph[init].items() if k == MODULE}
        reach = _closure(["edgetorch.backends", pkg, f"{pkg}.runtime"], graph)
        bad = sorted(m for m in reach if _layer(m) not in allowed
                     and not (m in ("edgetorch.backends", pkg) or m.startswith(f"{pkg}.")))
        assert bad == [], f"{pkg}.runtime reaches {bad}"
        aot = sorted(m for m in reach if m.startswith(f"{pkg}.") and m.rpartition(".")[2] in
                     ("preprocess", "partitioner", "ops"))
        assert aot == [], f"{pkg}.runtime reaches its ahead-of-time side {aot}"


def test_the_checker_sees_cycles_and_every_kind_of_import(tmp_path):
    """The analysis itself: a planted cycle is found; module-level, function-level and annotation-only imports
    are all dependencies, each with its kind, and a module imported both ways counts as its strongest."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    mods = {"edgetorch.x": tmp_path / "x.py", "edgetorch.y": tmp_path / "y.py", "edgetorch.z": tmp_path / "z.py"}
    x = mods["edgetorch.x"]
    x.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edgetorch.y import Y\n")
    assert _import_edges("edgetorch.x", x, mods) == {"edgetorch.y": TYPE_CHECKING}
    x.write_text("def f():\n    from edgetorch import y\n    g = lambda: __import__('os')\n")
    assert _import_edges("edgetorch.x", x, mods) == {"edgetorch.y": FUNCTION}
    x.write_text("import edgetorch.z\nclass C:\n    def m(self):\n        import edgetorch.y\n"
                 "        import edgetorch.z\n")
    assert _import_edges("edgetorch.x", x, mods) == {"edgetorch.y": FUNCTION, "edgetorch.z": MODULE}
    assert _imported("edgetorch.x", x, mods) == {"edgetorch.y", "edgetorch.z"}
    graph = {"edgetorch.x": {"edgetorch.y": TYPE_CHECKING}, "edgetorch.y": {"edgetorch.x": FUNCTION}}
    assert "edgetorch.x -> edgetorch.y (type_checking)" in _describe(["edgetorch.x", "edgetorch.y"], graph)
    assert _cycles(graph) == [["edgetorch.x", "edgetorch.y"]]  # an annotation-only cycle is a cycle
    # the layering check counts every kind too: an annotation or a function-level import upward fails as one at
    # module level does, and the graph it reads keeps all three kinds
    layered = {"edgetorch.exir.a": {"edgetorch.devtools.b": TYPE_CHECKING},
               "edgetorch.runtime.c": {"edgetorch.exir.d": FUNCTION},
               "edgetorch.devtools.e": {"edgetorch.export.f": MODULE},
               "edgetorch.devtools.b": {"edgetorch.exir.a": MODULE}}
    assert _upward(layered) == ["edgetorch.devtools.e -> edgetorch.export.f (module)",
                                "edgetorch.exir.a -> edgetorch.devtools.b (type_checking)",
                                "edgetorch.runtime.c -> edgetorch.exir.d (function)"]
    assert _graph.__defaults__ == (frozenset({MODULE, FUNCTION, TYPE_CHECKING}),)


def _code_size():
    """``bench/code_size.py``, the one line-count script (loaded by path: bench/ is no package)."""
    import importlib.util

    path = SRC.parents[1] / "bench" / "code_size.py"
    spec = importlib.util.spec_from_file_location("edgetorch_bench_code_size", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


#: over-budget items being split (issue 27), by path relative to src/edgetorch and ``path:qualname``; the list only
#: shrinks: an entry back under budget fails until it is removed from here, and anything else over budget fails
OVER_BUDGET_MODULES: set[str] = set()
OVER_BUDGET_FUNCTIONS: set[str] = set()


def test_size_budget():
    """tinygrad-style budget on the hand-written code (``formats/_generated`` excluded): no module over 700 lines,
    no function over 80 (``def`` to last line; ``python bench/code_size.py`` prints the figures)."""
    cs = _code_size()
    mods, funcs = cs.over_budget(cs.read_tree(SRC))
    fnames = {f"{f.module}:{f.qualname}": f.lines for f in funcs}
    new_mods = {p: n for p, n in mods.items() if p not in OVER_BUDGET_MODULES}
    new_funcs = {q: n for q, n in fnames.items() if q not in OVER_BUDGET_FUNCTIONS}
    assert not new_mods, f"modules over {cs.MODULE_BUDGET} lines: split them by concern: {new_mods}"
    assert not new_funcs, f"functions over {cs.FUNCTION_BUDGET} lines: split them into their steps: {new_funcs}"
    stale = sorted(OVER_BUDGET_MODULES - set(mods)) + sorted(OVER_BUDGET_FUNCTIONS - set(fnames))
    assert not stale, f"back under budget: remove from OVER_BUDGET_MODULES/FUNCTIONS: {stale}"


def test_the_size_checker_counts_functions_and_skips_generated_code():
    cs = _code_size()
    body = "\n".join(f"    x{i} = {i}" for i in range(cs.FUNCTION_BUDGET))
    text = f"class C:\n    def m(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n\n\ndef ok():\n    pass\n"
    mods, funcs = cs.over_budget({"a.py": text, "formats/_generated/big.py": "x = 1\n" * 5000})
    assert mods == {} and [(f.qualname, f.lines) for f in funcs] == [("C.m", cs.FUNCTION_BUDGET + 1)]
    mods, _ = cs.over_budget({"b.py": "x = 1\n" * (cs.MODULE_BUDGET + 1)})
    assert mods == {"b.py": cs.MODULE_BUDGET + 1}


def _public_modules() -> dict[str, Path]:
    """Every public module: no part of its dotted name starts with ``_`` (a package is its ``__init__``)."""
    return {m: p for m, p in _modules().items() if not any(part.startswith("_") for part in m.split("."))}


def test_every_public_module_declares_all():
    """Each public module states its API in ``__all__`` (issue 27): every name in it exists once the module is
    imported, none twice, and every public class or function the module defines at top level is in it."""
    import importlib

    missing, absent, unlisted = [], [], []
    for name, path in sorted(_public_modules().items()):
        mod = importlib.import_module(name)
        names = getattr(mod, "__all__", None)
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            missing.append(name)
            continue
        assert len(set(names)) == len(names), f"{name}.__all__ lists a name twice"
        absent += [f"{name}.{n}" for n in names if not hasattr(mod, n)]
        defined = [n.name for n in ast.parse(path.read_text()).body
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        unlisted += [f"{name}.{n}" for n in defined if not n.startswith("_") and n not in names]
    assert missing == [], f"public modules without __all__: {missing}"
    assert absent == [], f"__all__ names that do not exist: {absent}"
    assert unlisted == [], f"public classes/functions missing from their module's __all__: {unlisted}"
