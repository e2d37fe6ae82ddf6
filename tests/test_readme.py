"""The README's Python examples run as written."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has no Python example"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        code = code.replace("/tmp/", str(tmp_path) + "/")
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})


def test_readme_starts_with_the_two_commands():
    head = open(os.path.join(ROOT, "README.md")).read().split("\n")[:8]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "make test" in ci
