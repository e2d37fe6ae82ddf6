"""Helpers of the onnxruntime backend tests: lowering, an independent eager capture of edge-op outputs, ETDump
reading."""

from __future__ import annotations

import contextlib
import operator
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from edgetorch.backends.onnxruntime import OrtPartitioner, _blob
from edgetorch.exir import to_edge
from edgetorch.exir.backend import CALL_DELEGATE
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.runtime import Runtime


@dataclass
class Lowered:
    model: torch.nn.Module
    inputs: tuple
    edge: ExportedProgram  # before lowering
    lowered: ExportedProgram
    et: Any  # ExecutorchProgramManager

    def method(self, **load_kwargs: Any) -> Any:
        return Runtime.get().load_program(self.et.buffer, **load_kwargs).load_method("forward")


def lower_ort(model: torch.nn.Module, inputs: tuple, **partitioner_kwargs: Any) -> Lowered:
    """export -> to_edge -> to_backend(OrtPartitioner(...)) -> to_executorch."""
    epm = to_edge(torch.export.export(model, inputs))
    lowered = epm.to_backend(OrtPartitioner(**partitioner_kwargs))
    return Lowered(model, inputs, epm.exported_program(), lowered.exported_program(), lowered.to_executorch())


def delegate_calls(ep: ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target is CALL_DELEGATE]


def compute_nodes(ep: ExportedProgram) -> list[torch.fx.Node]:
    """call_function nodes other than delegate calls and getitems."""
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target not in (CALL_DELEGATE, operator.getitem)]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert tuple(got.shape) == tuple(want.shape), (tuple(got.shape), tuple(want.shape))
    got, want = got.detach().double(), want.detach().double()
    if want.numel() == 0:
        return 0.0
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12)


def edge_group_outputs(ep: ExportedProgram, inputs: tuple) -> dict[int, list[torch.Tensor]]:
    """Runs the (not lowered) edge program node by node in eager PyTorch and returns, per debug handle, the
    outputs of the group's terminal nodes (those read outside the group or returned), in graph order."""
    args: list[Any] = []
    user = iter(inputs)
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            args.append(ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target])
        else:
            args.append(ep.constants[spec.target])
    out: dict[int, list[torch.Tensor]] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            r = super().run_node(n)
            h = get_debug_handle(n) if n.op == "call_function" else None
            if h is not None and any(u.op == "output" or get_debug_handle(u) != h for u in n.users):
                out.setdefault(h, []).append(r[0] if isinstance(r, (list, tuple)) else r)
            return r

    with torch.no_grad():
        Capture(ep.graph_module).run(*args)
    return out


@contextlib.contextmanager
def runtime_options(**options: object) -> Iterator[None]:
    """ONNX Runtime delegate options overridden for the programs loaded inside the block."""
    from edgetorch.backends.onnxruntime.runtime import set_runtime_options

    set_runtime_options(**options)
    try:
        yield
    finally:
        set_runtime_options(**{k: None for k in options})


def traced_delegate_outputs(et: Any, inputs: tuple, tmp: str, name: str = "run") -> list[tuple[str, Any]]:
    """Runs ``et`` once with an ETDump and a debug buffer; returns (delegate debug id, value) of every
    delegate-internal debug event, in logging order."""
    from edgetorch.devtools.etdump import DebugBuffer, read_etdump

    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(*inputs)
    dump, dbg = os.path.join(tmp, f"{name}.etdp"), os.path.join(tmp, f"{name}.bin")
    prog.write_etdump_result_to_file(dump, dbg)
    etdump = read_etdump(dump)
    buf = DebugBuffer(dbg)
    out = []
    for run in etdump.run_data:
        for ev in run.events:
            d = ev.debug_event
            if d is not None and (d.delegate_debug_id_str or d.delegate_debug_id_int >= 0):
                did = d.delegate_debug_id_str or d.delegate_debug_id_int
                out.append((did, buf.value(d.debug_entry)))
    return out


def delegate_profile_events(prog: Any) -> list[Any]:
    """Delegate-internal profile events recorded by ``prog``'s tracer so far."""
    out = []
    for run in prog.tracer.etdump().run_data:
        for ev in run.events:
            p = ev.profile_event
            if p is not None and (p.delegate_debug_id_str or p.delegate_debug_id_int >= 0):
                out.append(p)
    return out


def tensors_of(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def standalone_blob(lowered: Any) -> bytes:
    """A lowered module's blob with every weight inline (container version 1): what a test hands ``OrtDelegate``
    or ``_blob.unpack`` on its own, without the program whose named data holds the large weights."""
    u = _blob.unpack(lowered.processed_bytes, named_data=getattr(lowered, "named_data", None))
    header = {k: v for k, v in u.header.items() if k not in ("model", "initializers")}
    return _blob.pack(header, bytes(u.model), list(u.initializers.items()))


def perturb_blob(blob: bytes, named_data: dict | None = None) -> tuple[bytes, str, str]:
    """Scales one external initializer (the weight read by a node in the middle of the ONNX graph) by 1.1;
    returns the new blob (every weight inline: it no longer reads ``named_data``, the lowered module's), the
    initializer name and the ONNX node reading it."""
    u = _blob.unpack(blob, named_data=named_data)
    proto = onnx.ModelProto.FromString(bytes(u.model))
    readers = [(n, i) for n in proto.graph.node for i in n.input if i in u.initializers
               and u.initializers[i].dtype == np.float32 and u.initializers[i].ndim >= 2]
    node, name = readers[len(readers) // 2]
    inits = dict(u.initializers)
    inits[name] = (inits[name] * np.float32(1.1)).astype(np.float32)
    header = {k: v for k, v in u.header.items() if k not in ("model", "initializers")}
    return _blob.pack(header, bytes(u.model), list(inits.items())), name, node.name
