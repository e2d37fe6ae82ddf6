"""The size of the hand-written code under ``src/edgetorch`` (the one line-count script; issue 27).

Counts physical lines of every ``.py`` file except the generated FlatBuffers code (``formats/_generated``), the
modules over the budget (700 lines) and the functions over theirs (80 lines, ``def`` line to last line, a nested
function counted on its own as well as inside its parent), and the longest function per top-level package.
``tests/test_architecture.py`` applies the same budget with these functions.

    python bench/code_size.py [--src DIR] [--git-rev REV]    # REV: measure a commit's tree (git show), no checkout
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "edgetorch"
MODULE_BUDGET = 700
FUNCTION_BUDGET = 80
GENERATED = ("formats/_generated/",)


@dataclass(frozen=True)
class Function:
    module: str  # path relative to src/edgetorch
    qualname: str
    lineno: int
    lines: int


def hand_written(files: dict[str, str]) -> dict[str, str]:
    """Relative path -> text, without the generated code."""
    return {p: t for p, t in files.items() if p.endswith(".py") and not p.startswith(GENERATED)}


def read_tree(src: Path = SRC) -> dict[str, str]:
    """The ``.py`` files under ``src`` (relative path -> text)."""
    return {p.relative_to(src).as_posix(): p.read_text() for p in sorted(src.rglob("*.py"))}


def read_git(rev: str, root: Path = ROOT) -> dict[str, str]:
    """The ``.py`` files under ``src/edgetorch`` at commit ``rev``."""
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "src/edgetorch"], cwd=root, check=True,
                           capture_output=True, text=True).stdout.split()
    out = {}
    for n in names:
        if n.endswith(".py"):
            out[n.removeprefix("src/edgetorch/")] = subprocess.run(
                ["git", "show", f"{rev}:{n}"], cwd=root, check=True, capture_output=True, text=True).stdout
    return out


def line_count(text: str) -> int:
    return len(text.splitlines())


def functions(path: str, text: str) -> Iterator[Function]:
    """Every function and method of one module with its length in lines."""

    def walk(node: ast.AST, prefix: str) -> Iterator[Function]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield Function(path, name, child.lineno, child.end_lineno - child.lineno + 1)
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(text, filename=path), "")


def over_budget(files: dict[str, str]) -> tuple[dict[str, int], list[Function]]:
    """Modules over :data:`MODULE_BUDGET` lines and functions over :data:`FUNCTION_BUDGET` lines."""
    files = hand_written(files)
    mods = {p: line_count(t) for p, t in files.items() if line_count(t) > MODULE_BUDGET}
    funcs = [f for p, t in files.items() for f in functions(p, t) if f.lines > FUNCTION_BUDGET]
    return mods, sorted(funcs, key=lambda f: -f.lines)


def report(files: dict[str, str]) -> str:
    files = hand_written(files)
    total = sum(line_count(t) for t in files.values())
    lines = [f"hand-written lines of src/edgetorch: {total} in {len(files)} modules "
             f"(generated code excluded)"]
    mods, funcs = over_budget(files)
    lines.append(f"modules over {MODULE_BUDGET} lines: {len(mods)}")
    lines += [f"  {n:5d}  {p}" for p, n in sorted(mods.items(), key=lambda kv: -kv[1])]
    lines.append(f"functions over {FUNCTION_BUDGET} lines: {len(funcs)}")
    lines += [f"  {f.lines:5d}  {f.module}:{f.lineno} {f.qualname}" for f in funcs]
    per_pkg: dict[str, tuple[int, Function | None]] = {}
    pkg_lines: dict[str, int] = {}
    for p, t in files.items():
        pkg = p.split("/")[0] if "/" in p else "(root)"
        pkg_lines[pkg] = pkg_lines.get(pkg, 0) + line_count(t)
        for f in functions(p, t):
            if f.lines > per_pkg.get(pkg, (0, None))[0]:
                per_pkg[pkg] = (f.lines, f)
    lines.append("per package: lines, longest function")
    for pkg in sorted(pkg_lines, key=lambda k: -pkg_lines[k]):
        n, f = per_pkg.get(pkg, (0, None))
        where = f"{f.module}:{f.lineno} {f.qualname}" if f else "-"
        lines.append(f"  {pkg:12s} {pkg_lines[pkg]:6d}  {n:4d}  {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=SRC)
    ap.add_argument("--git-rev", help="measure this commit's src/edgetorch instead of the working tree")
    args = ap.parse_args(argv)
    files = read_git(args.git_rev) if args.git_rev else read_tree(args.src)
    print(report(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
