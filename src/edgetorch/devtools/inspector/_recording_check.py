"""Checks every value an edgetorch ETDump describes before the Inspector reads it (issue 23): the ETDump has no
checksum of its own, so an edited dtype, shape, stride or instruction id would otherwise be read as the recording
of another computation and change the gap table with no error.

* every logged tensor has the contiguous strides of its sizes (the runtime's tracer stores every tensor
  contiguously and records exactly those strides), and bytes of its own (a kernel's value may be named again by
  the method's output or a delegate's log, never by another kernel's);
* a run that logged its instructions' values logged one for every instruction it profiled, and none for an
  instruction it did not (a view, evaluated at load);
* an event of no instruction is a method input (named ``input:...``, and only then), an output or a delegate's;
* with an ETRecord: a portable kernel's event (an instruction id, no delegate id) that names an op of the
  ETRecord's edge graph is logged once per run and output, under an instruction whose debug handles include that
  op's, and its value is what the op produces: a tensor (or tensor list) of the op's dtype and rank, of its size
  in every static dimension.

``ETDumpFormatError`` names the run, event and field at fault. ExecuTorch's ETDumps (``producer ==
"executorch"``) are read as they are. ``check_node_value``: a reference-graph node computes the value its
metadata records (``ETRecordFormatError`` otherwise), checked as the gap walk runs it.
"""

from __future__ import annotations

from typing import Any

import torch

from edgetorch.errors import ETDumpFormatError, ETRecordFormatError
from edgetorch.formats import etdump as ed


def _contiguous(sizes: list[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= max(s, 1)
    return out[::-1]


def _tensors(v: ed.Value) -> list[ed.Tensor]:
    if v.val == ed.ValueType.Tensor and v.tensor is not None:
        return [v.tensor]
    if v.val == ed.ValueType.TensorList:
        return list(v.tensor_list or ())
    return []


def _fail(msg: str, fld: str) -> ETDumpFormatError:
    return ETDumpFormatError(f"{msg} (the ETDump is inconsistent: corrupted or edited?)", field=fld)


def _check_ranges(spans: list[tuple[int, int, bool, str]]) -> None:
    """(offset, nbytes, kernel event, where) of every stored tensor: the ranges are disjoint, or one range logged
    by a kernel and named again by the method's output or a delegate that wrote into memory the tracer lent it
    (never by two kernel events: each logs a copy of its own)."""
    spans.sort()
    for (a, na, ka, wa), (b, nb, kb, wb) in zip(spans, spans[1:]):
        if b < a + na and ((a, na) != (b, nb) or (ka and kb)):
            raise _fail(f"{wb}: debug buffer bytes [{b}, {b + nb}) overlap bytes [{a}, {a + na}) of {wa}",
                        f"{wb}.offset")


def _check_identity(d: ed.DebugEvent, where: str, fld: str) -> None:
    """An event of no instruction is a method input, a method output or a delegate's own log; an input's event
    names no instruction."""
    delegated = d.delegate_debug_id_int != -1 or bool(d.delegate_debug_id_str)
    named_input = d.name.startswith(ed.INPUT_EVENT_PREFIX) and not d.debug_entry.output
    if named_input and d.instruction_id != ed.INPUT_INSTRUCTION_ID:
        raise _fail(f"{where} is named as a method input but logged under instruction {d.instruction_id}",
                    f"{fld}.instruction_id")
    if d.instruction_id < 0 and not (named_input or d.debug_entry.output or delegated):
        raise _fail(f"{where} names no instruction (instruction id {d.instruction_id}) and is neither a method "
                    "input nor an output", f"{fld}.instruction_id")


#: the profile events of control-flow instructions (torch.cond's jumps and moves), which log no value
_CONTROL = frozenset({"JF_CALL", "MOVE_CALL"})


def _check_complete(r: int, run: ed.RunData) -> None:
    """A run that logged its instructions' values logged one for every instruction it profiled (the tracer logs
    every output of every step it times): a dropped event would hide its row from the gap table."""
    def plain(e: ed.ProfileEvent | ed.DebugEvent) -> bool:
        return e.instruction_id >= 0 and e.delegate_debug_id_int == -1 and not e.delegate_debug_id_str

    logged = {e.debug_event.instruction_id for e in run.events if e.debug_event is not None
              and plain(e.debug_event) and not e.debug_event.debug_entry.output}
    if not logged:
        return
    profiled = {e.profile_event.instruction_id for e in run.events if e.profile_event is not None
                and plain(e.profile_event)}
    for i, e in enumerate(run.events):
        p, d = e.profile_event, e.debug_event
        if p is not None and plain(p) and p.instruction_id not in logged and p.name not in _CONTROL:
            raise _fail(f"run {r}: instruction {p.instruction_id} ('{p.name}') ran but logged no value, while the "
                        "run logged its other instructions' values (an event dropped?)",
                        f"run_data[{r}].events[{i}].profile_event.instruction_id")
        if profiled and d is not None and plain(d) and not d.debug_entry.output and d.instruction_id not in profiled:
            raise _fail(f"run {r} event {i} ('{d.name}') is logged under instruction {d.instruction_id}, which the run "
                        "never timed (a view, or no instruction of the method)",
                        f"run_data[{r}].events[{i}].debug_event.instruction_id")


def _check_layouts(etdump: ed.ETDump) -> None:
    spans: list[tuple[int, int, bool, str]] = []
    for r, run in enumerate(etdump.run_data):
        for i, e in enumerate(run.events):
            d = e.debug_event
            if d is None:
                continue
            _check_identity(d, f"run {r} event {i} ('{d.name}')", f"run_data[{r}].events[{i}].debug_event")
            for j, t in enumerate(_tensors(d.debug_entry)):
                if len(t.strides) != len(t.sizes) or any(
                        s != c for s, c, n in zip(t.strides, _contiguous(t.sizes), t.sizes) if n > 1):
                    raise _fail(f"run {r} event {i} ('{d.name}'): tensor {j} has sizes {t.sizes} and strides "
                                f"{t.strides}, but the runtime stores every tensor contiguously",
                                f"run_data[{r}].events[{i}].debug_event.debug_entry.strides")
                if t.offset >= 0 and t.nbytes > 0:
                    kernel = d.instruction_id >= 0 and not d.debug_entry.output and d.delegate_debug_id_int == -1 \
                        and not d.delegate_debug_id_str
                    spans.append((t.offset, t.nbytes, kernel, f"run_data[{r}].events[{i}].tensor[{j}]"))
    _check_ranges(spans)


def _op_tables(etrecord: Any, method: str) -> tuple[dict[int, tuple[int, ...]], dict[str, tuple[int, Any]]] | None:
    """(kernel instruction -> its debug handles, edge op name -> (handle, value)) of ``method``, or None."""
    from edgetorch.exir.debug_handles import nodes_by_handle

    groups = (getattr(etrecord, "handle_groups", None) or {}).get(method)
    if not groups:
        return None
    try:
        gm = etrecord.edge_reference_graph(method)
    except Exception:  # noqa: BLE001 - an unreadable graph is reported where the gap reads it
        return None
    if gm is None:
        return None
    kernels = {g.instruction_id: tuple(g.handles) for g in groups if g.kind == "kernel"}
    ops = {n.name: (h, n.meta.get("val")) for h, ns in nodes_by_handle(gm.graph).items() for n in ns}
    return kernels, ops


def _want(val: Any, index: int) -> Any:
    if isinstance(val, (list, tuple)):
        return val[index] if 0 <= index < len(val) else None
    return val if index == 0 else None


def _check_value(d: ed.DebugEvent, want: torch.Tensor, where: str, fld: str) -> None:
    ts = _tensors(d.debug_entry)
    if len(ts) != 1 or d.debug_entry.val != ed.ValueType.Tensor:
        raise _fail(f"{where} logs a {ed.ValueType(d.debug_entry.val).name} value where the ETRecord's op produces "
                    "a tensor", f"{fld}.debug_entry.val")
    t = ts[0]
    try:
        dtype = t.dtype
    except Exception:  # noqa: BLE001 - an unknown code is refused by the reader; be safe here too
        dtype = None
    shape = list(want.shape)
    static = [(k, int(s)) for k, s in enumerate(shape) if isinstance(s, int)]
    if dtype != want.dtype or len(t.sizes) != len(shape) or any(t.sizes[k] != s for k, s in static):
        got = f"{str(dtype).removeprefix('torch.')}{t.sizes}"
        raise _fail(f"{where} logs a {got} tensor, but the ETRecord's op produces "
                    f"{str(want.dtype).removeprefix('torch.')}{[str(s) for s in shape]}", f"{fld}.debug_entry.tensor")


def _check_against_etrecord(etdump: ed.ETDump, etrecord: Any) -> None:
    tables: dict[str, Any] = {}
    for r, run in enumerate(etdump.run_data):
        method = run.method or "forward"
        if method not in tables:
            tables[method] = _op_tables(etrecord, method)
        if tables[method] is None:
            continue
        kernels, ops = tables[method]
        seen: set[tuple[int, int, int]] = set()
        for i, e in enumerate(run.events):
            d = e.debug_event
            if d is None or d.instruction_id < 0 or d.debug_entry.output:
                continue
            fld = f"run_data[{r}].events[{i}].debug_event"
            where = f"run {r} event {i} ('{d.name}', instruction {d.instruction_id}, output {d.output_index})"
            if d.delegate_debug_id_int != -1 or d.delegate_debug_id_str:
                if d.instruction_id in kernels:
                    raise _fail(f"{where} carries a delegate debug id, but the ETRecord says instruction "
                                f"{d.instruction_id} is a kernel", f"{fld}.delegate_debug_id_int")
                continue
            if d.name not in ops:
                continue
            key = (d.chain_index, d.instruction_id, d.output_index)
            if key in seen:
                raise _fail(f"{where} is logged twice in one run", f"{fld}.instruction_id")
            seen.add(key)
            handle, val = ops[d.name]
            handles = kernels.get(d.instruction_id)
            if handles is None or handle not in handles:
                what = "no kernel" if handles is None else f"of handles {list(handles)}"
                raise _fail(f"{where}: the ETRecord's op '{d.name}' has debug handle {handle}, but instruction "
                            f"{d.instruction_id} is {what}", f"{fld}.instruction_id")
            want = _want(val, d.output_index)
            if isinstance(want, torch.Tensor):
                _check_value(d, want, where, fld)


def check_recording(etdump: ed.ETDump, etrecord: Any = None) -> None:
    """Refuses (``ETDumpFormatError``) an edgetorch ETDump whose logged values contradict how the runtime writes
    them or, with ``etrecord``, what the recorded program's ops produce."""
    if etdump.producer != "edgetorch":
        return
    _check_layouts(etdump)
    if etrecord is not None:
        _check_against_etrecord(etdump, etrecord)
    for r, run in enumerate(etdump.run_data):
        _check_complete(r, run)


def check_node_value(n: torch.fx.Node, out: Any) -> None:
    """A reference-graph node computes the value its metadata records (dtype, rank, static sizes): the gap walk
    pairs runtime values by that metadata, so an edited record would pair them wrongly. ``ETRecordFormatError``
    names the node."""
    want = n.meta.get("val")
    if not (isinstance(want, torch.Tensor) and isinstance(out, torch.Tensor)):
        return
    shape = list(want.shape)
    if out.dtype != want.dtype or out.dim() != len(shape) or any(
            isinstance(s, int) and out.shape[k] != s for k, s in enumerate(shape)):
        raise ETRecordFormatError(
            f"the ETRecord's reference graph is inconsistent: node '{n.name}' ({n.target}) computes "
            f"{str(out.dtype).removeprefix('torch.')}{list(out.shape)}, its record says "
            f"{str(want.dtype).removeprefix('torch.')}{[str(s) for s in shape]}",
            field=f"reference graph node {n.name}")
