"""File formats of edgetorch (program, ETDump, bundled program): schemas, one reader and one writer each.

Schemas live in ``formats/schema/*.fbs``; the Python code in ``formats/_generated`` is produced from them
by ``flatc --python --gen-onefile`` (see ``docs/formats.md`` for the command).
"""

__all__: list[str] = []
