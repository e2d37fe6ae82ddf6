"""Lowered partitions: ``LoweredBackendModule`` and the ``edgetorch::call_delegate`` op that calls one.

``call_delegate(Tensor[] inputs, str key) -> Tensor[]`` is a real ATen-style operator so a lowered program is a
valid ExportedProgram: its fake kernel gives the partition's output shapes and its CPU kernel runs the original
(pre-lowering) partition, so the lowered graph stays runnable in eager PyTorch.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram

from edgetorch.exir.debug_handles import nodes_by_handle

__all__ = ["LoweredBackendModule", "lookup", "CALL_DELEGATE"]

_REGISTRY: weakref.WeakValueDictionary[str, LoweredBackendModule] = weakref.WeakValueDictionary()
_COUNTER = itertools.count()
_LOCK = threading.Lock()


@dataclass(eq=False)
class LoweredBackendModule:
    backend_id: str
    processed_bytes: bytes
    compile_specs: list  # list[CompileSpec]
    original_module: ExportedProgram  # the partition as an ExportedProgram (parameters as buffers)
    debug_handle_map: dict = field(default_factory=dict)  # backend op id -> tuple of edge handles
    output_meta: list = field(default_factory=list)  # [(shape, dtype)] of the outputs
    key: str = ""
    debug_buffer_bytes: int | None = None  # what one traced call logs (``PreprocessResult.debug_buffer_bytes``)

    def __post_init__(self) -> None:
        if not self.key:
            with _LOCK:
                self.key = f"{self.backend_id}:{next(_COUNTER)}"
        _REGISTRY[self.key] = self

    def debug_handles(self) -> list[int]:
        """Handles of every op in the partition, in graph order (duplicates removed)."""
        return list(nodes_by_handle(self.original_module.graph))

    @property
    def compile_spec_items(self) -> list[tuple[str, bytes]]:
        return [(c.key, c.value) for c in self.compile_specs]


def lookup(key: str) -> LoweredBackendModule:
    try:
        return _REGISTRY[key]
    except KeyError:
        raise KeyError(f"lowered module '{key}' is no longer alive in this process") from None


_lib = torch.library.Library("edgetorch", "DEF")
_lib.define("call_delegate(Tensor[] inputs, str key) -> Tensor[]")


@torch.library.impl(_lib, "call_delegate", "CompositeExplicitAutograd")
def _call_delegate_cpu(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    lowered = lookup(key)
    out = lowered.original_module.module()(*inputs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


@torch.library.register_fake("edgetorch::call_delegate", lib=_lib)
def _call_delegate_fake(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    lowered = lookup(key)
    return [inputs[0].new_empty(shape, dtype=dtype) if inputs else torch.empty(shape, dtype=dtype)
            for shape, dtype in lowered.output_meta]


CALL_DELEGATE = torch.ops.edgetorch.call_delegate.default
