"""Test helpers for dynamic shapes and mutable buffers in ORT delegates.

* ``lowering_examples_keep_strides`` makes lowering re-export partitions from example inputs with the strides
  of the values they stand for (``edgetorch.exir.backend.lowering._example`` drops them: a partition viewing
  SDPA's permuted output then fails to re-export, static shapes too).
* ``run_lowered`` runs a lowered program in eager PyTorch with each delegate called the way the runtime calls
  it (outputs: views at this run's shapes of memory planned at the upper bounds), carrying mutated buffers.
* ``LendingTracer`` stands for the runtime tracer in debug runs (lent debug-buffer memory, logged values).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind


def _hint(size: object) -> int:
    if isinstance(size, int):
        return size
    hint = size.node.hint
    if hint is None:
        raise ValueError(f"size {size} has no example value")
    return int(hint)


def hinted_example(val: torch.Tensor) -> torch.Tensor:
    """A random tensor of ``val``'s dtype at its example (hint) shape and strides (a permuted layout, such as
    SDPA's output, must stay viewable the way the graph views it)."""
    t = torch.empty_strided(tuple(_hint(s) for s in val.shape), tuple(_hint(s) for s in val.stride()),
                            dtype=val.dtype)
    if val.dtype.is_floating_point:
        return t.normal_()
    return t.zero_()


@contextlib.contextmanager
def lowering_examples_keep_strides() -> Iterator[None]:
    """Within the block, lowering re-exports partitions from example inputs with the strides of the values they
    stand for (``hinted_example``). ``lowering._example`` makes contiguous ones, so a partition that views a
    permuted input (SDPA's output, left to the portable backend) fails to re-export, static shapes too."""
    from edgetorch.exir.backend import lowering

    real = lowering._example
    lowering._example = lambda val: hinted_example(val) if isinstance(val, torch.Tensor) else real(val)
    try:
        yield
    finally:
        lowering._example = real


def upper_bound_storage(h: Any) -> list[torch.Tensor]:
    """One flat tensor per output of delegate ``h`` holding its largest shape (every symbol at its max)."""
    from edgetorch.backends.onnxruntime import _shapes
    from edgetorch.backends.onnxruntime.runtime import _TORCH_DTYPES

    env = {k: v[1] for k, v in h.dim_bounds.items()}
    return [torch.empty(math.prod(_shapes.resolve(o["shape"], env)), dtype=_TORCH_DTYPES[np.dtype(o["dtype"])])
            for o in h.header["outputs"]]


def run_lowered(ep: ExportedProgram, inputs: tuple, buffers: dict[str, torch.Tensor] | None = None,
                handles: dict[str, Any] | None = None, tracer: Any = None) -> tuple[list, dict[str, torch.Tensor]]:
    """Runs a lowered edge program in eager PyTorch, each delegate call by its ORT delegate as the runtime
    calls it: outputs are views, shaped for this run (sizes evaluated from the input sizes), of memory sized at
    the upper bounds (the same addresses every run). ``buffers`` overrides buffer values; ``handles`` caches
    delegates by key. Returns the user outputs and ``{buffer: new value}`` of the mutated buffers."""
    from edgetorch.backends.onnxruntime import _shapes
    from edgetorch.backends.onnxruntime.runtime import OrtDelegate, OrtRuntime
    from edgetorch.exir.backend import CALL_DELEGATE

    handles = {} if handles is None else handles
    storage: dict[str, list[torch.Tensor]] = {}
    args, user = [], iter(inputs)
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        elif buffers is not None and spec.target in buffers:
            args.append(buffers[spec.target])
        else:
            args.append(ep.state_dict.get(spec.target, ep.constants.get(spec.target)))

    class Run(torch.fx.Interpreter):
        def call_function(self, target: Any, a: tuple, kw: dict) -> Any:
            if target is not CALL_DELEGATE:
                return super().call_function(target, a, kw)
            lm, ins = a[0], list(a[1:])  # the get_attr of the lowered module, then the inputs
            key = f"{lm.module_name}@{id(lm)}"
            h = handles.setdefault(key, OrtDelegate(lm.processed_bytes, dict(lm.compile_spec_items),
                                                      getattr(lm, "named_data", None)))
            env = h.symbols(ins)  # this run's shapes, as the runtime computes them from the input sizes
            shapes = [_shapes.resolve(o["shape"], env) for o in h.header["outputs"]]
            flat = storage.setdefault(key, upper_bound_storage(h))
            outs = [f[:math.prod(shape)].view(shape) for f, shape in zip(flat, shapes)]
            OrtRuntime().execute(h, ins, outs, tracer)
            return outs

    with torch.no_grad():
        flat_out = Run(ep.graph_module).run(*args)
    flat_out = list(flat_out) if isinstance(flat_out, (list, tuple)) else [flat_out]
    user_out, mutated = [], {}
    for spec, v in zip(ep.graph_signature.output_specs, flat_out):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            mutated[spec.target] = v.clone()
        elif spec.kind == OutputKind.USER_OUTPUT:
            user_out.append(v.clone() if isinstance(v, torch.Tensor) else v)
    return user_out, mutated


class LendingTracer:
    """The part of the runtime's tracer a delegate sees in a debug run: lends memory of a debug buffer
    (recording each request's shape) and records what the delegate logs."""

    logs_intermediates = True

    def __init__(self, nbytes: int = 64 << 20) -> None:
        self.buffer = torch.zeros(nbytes, dtype=torch.uint8)
        self.used = 0
        self.requests: list[tuple[tuple[int, ...], torch.dtype]] = []
        self.logged: list[tuple[Any, Any]] = []

    def delegate_output_buffer(self, shape: Any, dtype: torch.dtype) -> torch.Tensor | None:
        shape = tuple(int(s) for s in shape)
        self.requests.append((shape, dtype))
        n = torch.empty(shape, dtype=dtype).nbytes
        if n == 0:
            return None
        t = self.buffer[self.used:self.used + n].view(dtype).view(shape)
        self.used += (n + 63) // 64 * 64
        return t

    def log_delegate_output(self, name: Any, value: Any, *, snapshot: bool = True) -> None:  # noqa: ARG002
        self.logged.append((name, value))

    def logged_bytes(self) -> int:
        """Bytes the logged tensors take in a debug buffer (each 64-byte aligned)."""
        tensors = [t for _, v in self.logged for t in (v if isinstance(v, list) else [v])
                   if isinstance(t, torch.Tensor)]
        return sum((t.nbytes + 63) // 64 * 64 for t in tensors)

    def reset(self) -> None:
        self.used, self.requests, self.logged = 0, [], []
