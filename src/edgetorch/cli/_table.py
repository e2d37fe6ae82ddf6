"""Terminal output shared by ``edgetorch demo`` and ``edgetorch inspect``: the gap table, the culprit lines and
progress for long steps.

- Every value is printed as text, never as rich markup (``torch.cat([cls, x], dim=1)`` stays intact).
- Source locations keep their file name: the directory is dropped (``vit.py:155 in forward: x = ...``) and a
  long line is cut at its end, never at the file name.
- Gaps are in scientific notation (``3.358e-15``; an exact zero is ``0``), so small gaps never read ``0.0``.
- The table fits the console width: wide columns are cut with an ellipsis, and the runtime-ops column is left out
  on narrow terminals.
- ``Steps``: a rich progress line on a terminal; one plain line per step otherwise (logs, CI).
"""

from __future__ import annotations

import math
import os
import sys
import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

SCALE = ("rel_error", "local_rel_error", "noise_floor", "verdict")


def scalar(v: Any) -> float | None:
    """A gap cell (``[x]``, ``x`` or None) as a float, or None."""
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    if v is None or isinstance(v, (list, tuple, str, dict)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def sci(v: Any) -> str:
    """``3.358e-15``; ``0`` for an exact zero; ``""`` when there is no value."""
    f = scalar(v)
    if f is None:
        return ""
    if f == 0:
        return "0"
    return f"{f:.3e}" if math.isfinite(f) else str(f)


def short_source(src: Any, width: int | None = None) -> str:
    """``/long/path/vit.py:155 in forward: code`` -> ``vit.py:155 in forward: code``, cut to ``width`` at the end
    of the code (then without `` in fn``), never into the file name."""
    s = str(src or "")
    path, sep, rest = s.partition(":")
    if sep and (os.sep in path or "/" in path):
        s = os.path.basename(path) + sep + rest
    if width is None or len(s) <= width:
        return s
    head, sep, code = s.partition(": ")
    if sep and len(head) + 3 < width:
        return head + sep + code[:width - len(head) - 3] + "…"
    loc = head.split(" in ")[0]
    return loc if len(loc) >= width - 1 else (loc + " " + head[len(loc):])[:width - 1] + "…"


def ops_text(v: Any, width: int = 60) -> str:
    s = ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v or "")
    return s if len(s) <= width else s[:width - 1] + "…"


def noise_ratio(row: Any) -> float | None:
    lrel, floor = scalar(row.get("local_rel_error")), scalar(row.get("noise_floor"))
    return None if lrel is None or floor is None or floor <= 0 else lrel / floor


def has_scale(df: Any) -> bool:
    return all(c in df.columns for c in SCALE)


def table_console(stderr: bool = False) -> Console:
    """A console for tables: the terminal's width on a terminal; else ``$COLUMNS`` or 160 columns (logs and
    pipes are read wide, and a table wrapped at 80 columns is unreadable)."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=int(os.environ.get("COLUMNS", "0") or 0) or 160)


def _columns(width: int, scaled: bool) -> list[str]:
    """The columns that fit ``width``: all from 140, without runtime_ops from 100, the essentials below."""
    extra = ["rel_error", "×noise", "verdict"] if scaled else []
    if width >= 140:
        return ["#", "aot_ops", "runtime_ops", "gap", "local_gap", *extra, "source"]
    if width >= 100:
        return ["#", "aot_ops", "gap", "local_gap", *extra, "source"]
    return ["#", "aot_ops", "local_gap", "verdict", "source"] if scaled else ["#", "aot_ops", "gap", "local_gap",
                                                                             "source"]


_MIN = {"culprit%": 8, "aot_ops": 10, "runtime_ops": 10, "gap": 9, "local_gap": 9, "rel_error": 9, "×noise": 6,
        "verdict": 7, "source": 16}
_MAX = {"aot_ops": 40, "runtime_ops": 26}


def _percent(v: Any) -> str:
    f = scalar(v)
    return "" if f is None else f"{f:.0%}"


def _cells(i: Any, row: Any, cols: list[str]) -> list[str]:
    ratio = noise_ratio(row) if "×noise" in cols else None
    values = {"#": str(i), "aot_ops": escape(ops_text(row["aot_ops"])),
              "runtime_ops": escape(ops_text(row.get("runtime_ops"), 40)), "gap": sci(row["gap"]),
              "local_gap": sci(row.get("local_gap")), "rel_error": sci(row.get("rel_error")),
              "×noise": "" if ratio is None else f"{ratio:.3g}", "verdict": escape(str(row.get("verdict") or "")),
              "source": escape(short_source(row.get("source"))),
              "culprit%": _percent(row.get("culprit_frequency"))}
    return [values[c] for c in cols]


def gap_table(df: Any, title: str, rows: int, console: Console) -> Table:
    """The first ``rows`` rows (0: all) of a gap table as a rich ``Table`` fitting ``console``'s width: the
    source column takes the room left and is cut at its end (the file name stays)."""
    shown = df if rows <= 0 else df.head(rows)
    cols = _columns(console.width, has_scale(df))
    if "culprit_frequency" in df.columns and console.width >= 120:  # a multi-sample table
        cols.insert(cols.index("source"), "culprit%")
    table = Table(title=escape(title), title_justify="left", expand=True, pad_edge=False)
    for c in cols:
        right = c in ("#", "gap", "local_gap", "rel_error", "×noise", "culprit%")
        table.add_column(c, justify="right" if right else "left", no_wrap=True, overflow="ellipsis",
                         min_width=_MIN.get(c, len(str(max(len(shown) - 1, 0)))),
                         max_width=max(10, min(_MAX[c], console.width // 6)) if c in _MAX else None,
                         ratio=1 if c == "source" else None)
    for i, row in shown.iterrows():
        table.add_row(*_cells(i, row, cols))
    return table


def print_gap_table(console: Console, df: Any, title: str, rows: int, more_hint: str) -> None:
    console.print(gap_table(df, title, rows, console), highlight=False)
    if 0 < rows < len(df):
        console.print(f"... {len(df) - rows} more rows ({more_hint})", highlight=False, markup=False)


def culprit_lines(df: Any, culprits: Any, distance: str) -> list[str]:
    """One line per culprit (an op adding error beyond its rounding noise), or the reason there is none. Without
    the scale-aware columns, the largest local gaps, saying that nothing tells noise from error."""
    if not has_scale(df):
        top = [(i, r) for i, r in (culprits.iterrows() if culprits is not None else []) if scalar(r["local_gap"])]
        if not top:
            return ["no op adds error of its own (every local gap is 0 or unavailable)"]
        return ["largest local gaps (no noise scale in this table: they may all be rounding noise):"] + [
            f"  row {i} {ops_text(r['aot_ops'])}: local {distance} {sci(r['local_gap'])} at "
            f"{short_source(r.get('source'), 80)}" for i, r in top]
    real = [(i, r) for i, r in (culprits.iterrows() if culprits is not None else []) if r.get("verdict") == "real"]
    if not real:
        counts = df["verdict"].value_counts()
        return [f"no op adds error of its own beyond its rounding noise ({counts.get('noise', 0)} rows within noise, "
                f"{counts.get('exact', 0)} exact)"]
    out = ["culprits (ops adding error beyond their rounding noise):"]
    for i, r in real:
        ratio = noise_ratio(r)
        where = f" inside {r.get('delegate')}" if r.get("delegate") else ""
        out.append(f"  row {i} {ops_text(r['aot_ops'])}: local error {sci(r.get('local_rel_error'))} = "
                   f"{'' if ratio is None else f'{ratio:.3g}'} × noise, accumulated {sci(r.get('rel_error'))}{where} "
                   f"at {short_source(r.get('source'), 80)}")
    return out


def sample_lines(df: Any) -> list[str]:
    """For a multi-sample table (``df.attrs["samples"]`` > 1): how stable the culprit ranking is."""
    a = getattr(df, "attrs", {})
    n = a.get("samples")
    if not isinstance(n, int) or n < 2:
        return []
    line = f"over {n} samples (gap columns: the worst sample; *_mean / *_max / *_p99 in the table)"
    if a.get("rank_stability") is not None:
        line += f"; culprit-set stability {a['rank_stability']:.2f}"
    if a.get("top1_agreement") is not None:
        line += f", top-1 agreement {a['top1_agreement']:.0%}"
    return [line]


def print_culprits(console: Console, df: Any, culprits: Any, distance: str) -> None:
    for line in sample_lines(df) + culprit_lines(df, culprits, distance):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


class Steps:
    """Progress of a sequence of long steps: ``with Steps(console, total) as s: s.next("torch.export")``. On a
    terminal a transient rich progress line; otherwise one ``[k/total] step (elapsed)`` line per step on
    ``console`` (the output's own stream: stderr keeps nothing but warnings and the ``error:`` line)."""

    def __init__(self, console: Console, total: int) -> None:
        self.console, self.total, self.k = console, total, 0
        self._progress: Any = None
        self._task: Any = None
        self._t0 = self._last_line = time.perf_counter()
        self._label = ""
        self._listening: Any = None

    def _sub_step(self, message: str) -> None:
        """A library ``edgetorch._progress.note`` inside the current step: beside its label on a terminal; a
        plain indented line elsewhere, at most one a second (a fast step adds nothing)."""
        if self._progress is not None:
            self._progress.update(self._task, description=escape(f"{self._label}: {message}"))
            return
        now = time.perf_counter()
        if now - self._last_line >= 1.0:
            self._last_line = now
            self.console.print(f"    {message} ({now - self._t0:.1f} s)", highlight=False, markup=False)

    def __enter__(self) -> Steps:
        from edgetorch import _progress

        self._listening = _progress.listening(self._sub_step)
        self._listening.__enter__()
        if self.console.is_terminal:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=self.console, transient=True)
            self._progress.start()
            self._task = self._progress.add_task("", total=self.total)
        return self

    def next(self, what: str) -> None:
        self.k += 1
        label = self._label = f"[{self.k}/{self.total}] {what}"
        self._last_line = time.perf_counter()
        if self._progress is not None:
            self._progress.update(self._task, completed=self.k - 1, description=escape(label))
        else:
            self.console.print(f"{label} ({time.perf_counter() - self._t0:.1f} s)", highlight=False, markup=False)
            if self.console.file is sys.stderr or self.console.file is sys.stdout:
                self.console.file.flush()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._listening is not None:
            self._listening.__exit__(et, ev, tb)
        if self._progress is not None:
            self._progress.stop()


class Ticker:
    """Progress inside one long step, k of ``total`` (tokens, partitions): ``with Ticker(console, 32, "token") as
    t: ... t.tick(k)``. On a terminal a transient rich line; elsewhere a plain ``  token 12/32 (3.1 s)`` line at
    most every ``every_s`` seconds, so a step shorter than that prints nothing more (logs stay as they were)."""

    def __init__(self, console: Console, total: int, what: str, every_s: float = 2.0) -> None:
        self.console, self.total, self.what, self.every_s = console, total, what, every_s
        self._progress: Any = None
        self._task: Any = None
        self._t0 = self._last = time.perf_counter()

    def __enter__(self) -> Ticker:
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn(escape(f"  {self.what}")), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=self.console, transient=True)
            self._progress.start()
            self._task = self._progress.add_task("", total=self.total)
        return self

    def tick(self, k: int) -> None:
        """The k-th item (from 0) is done."""
        if self._progress is not None:
            self._progress.update(self._task, completed=k + 1)
            return
        now = time.perf_counter()
        if now - self._last >= self.every_s and k + 1 < self.total:
            self._last = now
            self.console.print(f"  {self.what} {k + 1}/{self.total} ({now - self._t0:.1f} s)", highlight=False,
                               markup=False)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

