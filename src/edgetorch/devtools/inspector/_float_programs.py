"""The float programs an ETRecord holds (``graph_map["float/<method>"]``, recorded by a torchao-recipe export) run
as the float reference of a low-bit generation (``quantized_generation``), in place of an eager float model.

Each method's program is unlifted (``ExportedProgram.module()``) and the methods share their buffers by name, so
a KV cache written by ``prefill`` is read by ``decode`` as in the runtime program. The programs run through an FX
interpreter that keeps the output of every ``aten.linear`` op of a watched module path (its last output per call)
and can add an error to one of them (``inject``); ``reset`` puts every buffer the programs mutate back to the
value it was recorded with (the state the runtime program starts from).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from edgetorch.errors import InspectorError

__all__ = ["FLOAT_PREFIX", "RecordedFloat"]

FLOAT_PREFIX = "float"
_LINEAR = torch.ops.aten.linear.default


def _attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class _Run(torch.fx.Interpreter):
    """One call of an unlifted float program: watched linear outputs kept, one optionally perturbed."""

    def __init__(self, gm: torch.fx.GraphModule, watched: dict[torch.fx.Node, str], outputs: dict[str, Any],
                 inject: tuple[str, torch.Tensor] | None, inputs: dict[str, Any] | None = None) -> None:
        super().__init__(gm)
        self._watched, self._outputs, self._inject, self._inputs = watched, outputs, inject, inputs

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        path = self._watched.get(n)
        if path is None or not isinstance(out, torch.Tensor):
            return out
        if self._inject is not None and self._inject[0] == path and self._inject[1].numel() == out.numel():
            out = out + self._inject[1].reshape(out.shape).to(out.dtype)
        self._outputs[path] = out.detach()
        x = self.env.get(n.args[0]) if n.args and isinstance(n.args[0], torch.fx.Node) else None
        if self._inputs is not None and isinstance(x, torch.Tensor):
            self._inputs[path] = x.detach()
        return out


class RecordedFloat:
    """The recorded float programs of ``methods`` with the interface ``quantized_generation`` runs its float
    reference through (``reset``, ``linear``, ``call``, ``outputs``, ``remove``)."""

    def __init__(self, programs: dict[str, Any], module_path: Callable[[torch.fx.Node], str]) -> None:
        self.outputs: dict[str, torch.Tensor] = {}
        self.inputs: dict[str, torch.Tensor] = {}  # each watched linear's input, last call
        self._modules: dict[str, torch.fx.GraphModule] = {}
        shared: dict[str, torch.Tensor] = {}
        mutated: set[str] = set()
        for method, ep in programs.items():
            gm = ep.module()
            for name, buf in list(gm.named_buffers()):
                owner, _, leaf = name.rpartition(".")
                if name in shared:
                    gm.get_submodule(owner)._buffers[leaf] = shared[name]
                else:
                    shared[name] = buf
            mutated |= set(ep.graph_signature.buffers_to_mutate.values())
            self._modules[method] = gm
        self._initial = {n: shared[n].detach().clone() for n in sorted(mutated) if n in shared}
        self._shared = shared
        self._watched: dict[str, dict[torch.fx.Node, str]] = {}
        self._linears: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for method, gm in self._modules.items():
            watched = self._watched.setdefault(method, {})
            for n in gm.graph.nodes:
                if n.op != "call_function" or n.target is not _LINEAR:
                    continue
                path = module_path(n)
                if not path:
                    continue
                watched[n] = path
                w = n.args[1]
                b = n.args[2] if len(n.args) > 2 else None
                if path not in self._linears and getattr(w, "op", None) == "get_attr" \
                        and (b is None or getattr(b, "op", None) == "get_attr"):
                    self._linears[path] = (_attr(gm, w.target), None if b is None else _attr(gm, b.target))

    @classmethod
    def from_inspector(cls, inspector: Any, methods: list[str],
                       module_path: Callable[[torch.fx.Node], str]) -> RecordedFloat:
        rec = inspector.etrecord
        if rec is None:
            raise InspectorError("a low-bit generation is compared with the float model: pass float_model=... "
                                 "(the model it was quantized from), or an ETRecord that holds its float program")
        names = set(rec.graph_map_names())
        missing = [m for m in methods if f"{FLOAT_PREFIX}/{m}" not in names]
        if missing:
            raise InspectorError(f"the ETRecord holds no float program for methods {missing} (graph_map['"
                                 f"{FLOAT_PREFIX}/<method>']): export with a torchao recipe and "
                                 "generate_etrecord=True, or pass the float model (float_model=... / --float-model)")
        return cls({m: rec.graph_map[f"{FLOAT_PREFIX}/{m}"] for m in methods}, module_path)

    def reset(self) -> None:
        with torch.no_grad():
            for name, value in self._initial.items():
                self._shared[name].copy_(value)

    def linear(self, path: str) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        return self._linears.get(path)

    def call(self, method: str, inputs: list[Any], inject: tuple[str, torch.Tensor] | None = None) -> Any:
        gm = self._modules.get(method)
        if gm is None:
            raise InspectorError(f"the ETRecord holds no float program for method '{method}'")
        return _Run(gm, self._watched[method], self.outputs, inject, self.inputs).run(*inputs)

    def remove(self) -> None:
        """Nothing to undo (no hook was installed on a user's module)."""
