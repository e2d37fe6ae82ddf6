"""``Inspector.write_tensorboard_artifact``: the profile and the numeric gaps as TensorBoard event files.

The files are written by a real writer library, never by hand: ``tensorboardX`` when it is installed, else
``torch.utils.tensorboard`` (which needs the ``tensorboard`` package). Without either, ``InspectorError`` says what
to install. What is written, under ``path`` (a log directory):

- ``latency_<unit>/<block>/<event>``: each event's average time (the Inspector's target unit), one step per
  occurrence of that name in the block, and ``latency_<unit>/<block>/raw/<event>`` as a histogram of its raw times
  when it ran more than once;
- ``numeric_gap/<method>/<op>`` and ``local_gap/<method>/<op>``: each op's gap (``calculate_numeric_gap``), when
  the Inspector has an ETRecord and the ETDump holds intermediate outputs (or ``gaps=True``); the step is the op's
  row in execution order;
- ``profile`` and ``numeric_gap`` text summaries: the tables as Markdown.
"""

from __future__ import annotations

import math
import os
from typing import Any

from edgetorch.errors import InspectorError

__all__ = ["summary_writer_class", "write_tensorboard_artifact"]

_INSTALL = ("Inspector.write_tensorboard_artifact needs a TensorBoard writer library: pip install tensorboardX "
            "(or tensorboard, for torch.utils.tensorboard)")


def summary_writer_class() -> Any:
    """The ``SummaryWriter`` class of the writer library installed; ``InspectorError`` naming what to install."""
    try:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    except ImportError:
        pass
    try:
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter
    except ImportError:
        raise InspectorError(_INSTALL) from None


def _tag(text: Any) -> str:
    return "".join(c if c.isalnum() or c in "._-:" else "_" for c in str(text)) or "_"


def _markdown(frame: Any) -> str:
    """A table as Markdown TensorBoard renders (a preformatted block: no tabulate dependency)."""
    return "    " + frame.astype(str).to_string(index=False).replace("\n", "\n    ")


def _write_profile(writer: Any, inspector: Any) -> int:
    """Scalars (and histograms) of every event's times; returns how many scalars were written."""
    import numpy as np

    from edgetorch.devtools.inspector.events import FRAMEWORK_EVENTS

    count = 0
    unit = "ms"
    seen: dict[tuple[str, str], int] = {}  # blocks of one name (runs) continue each other's steps
    for block in inspector.event_blocks:
        unit = block.target_time_scale.value
        for ev in block.events:
            if ev.perf_data is None or ev.name in FRAMEWORK_EVENTS:
                continue
            step = seen.get((block.name, ev.name), 0)
            seen[(block.name, ev.name)] = step + 1
            base = f"latency_{unit}/{_tag(block.name)}"
            writer.add_scalar(f"{base}/{_tag(ev.name)}", float(ev.perf_data.avg), step)
            count += 1
            raw = [float(t) for t in ev.perf_data.raw]
            if len(raw) > 1:
                writer.add_histogram(f"{base}/raw/{_tag(ev.name)}", np.asarray(raw), step)
    frame = inspector.to_dataframe()
    if not frame.empty:
        cols = [c for c in ("event_block_name", "event_name", f"avg ({unit})", "avg", f"p50 ({unit})", "op_types")
                if c in frame.columns]
        writer.add_text("profile", _markdown(frame[cols]), 0)
    return count


def _write_gaps(writer: Any, inspector: Any) -> int:
    count = 0
    for method in inspector.methods:
        df = inspector.calculate_numeric_gap("MSE", method=method)
        for step, row in enumerate(df.itertuples(index=False)):
            op = _tag(",".join(map(str, row.aot_ops)) if isinstance(row.aot_ops, (list, tuple)) else row.aot_ops)
            for col in ("gap", "local_gap"):
                value = getattr(row, col)
                value = value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value
                if isinstance(value, (int, float)) and math.isfinite(value):
                    writer.add_scalar(f"{'numeric' if col == 'gap' else 'local'}_gap/{_tag(method)}/{op}",
                                      float(value), step)
                    count += 1
        cols = [c for c in ("aot_ops", "runtime_ops", "gap", "local_gap", "verdict") if c in df.columns]
        writer.add_text(f"numeric_gap/{_tag(method)}", _markdown(df[cols]), 0)
    return count


def write_tensorboard_artifact(inspector: Any, path: str | os.PathLike, gaps: bool | None = None) -> dict[str, int]:
    """Writes ``inspector``'s profile (and numeric gaps, see the module docstring) as TensorBoard event files under
    the directory ``path``; returns how many scalars of each kind were written. ``gaps=None`` writes the gaps when
    the Inspector can compute them; ``gaps=True`` raises its ``InspectorError`` when it cannot."""
    writer_class = summary_writer_class()
    if gaps is None:
        gaps = inspector.etrecord is not None and bool(getattr(inspector, "_has_tensor_data", False))
    os.makedirs(path, exist_ok=True)
    writer = writer_class(os.fspath(path))
    try:
        written = {"latency": _write_profile(writer, inspector), "numeric_gap": 0}
        if gaps:
            written["numeric_gap"] = _write_gaps(writer, inspector)
    finally:
        writer.close()
    return written
