"""A test-only backend whose blob is an edgetorch .pte of the partition, run by the edgetorch runtime.

It exercises the whole delegation path (partitioner, preprocess, delegate blob in segments, runtime backend
registry, debug-handle maps) with a kernel set whose numbers are known: the portable one.
"""

from __future__ import annotations

import torch

from edgetorch.exir.backend import (
    BackendDetails,
    CompileSpec,
    DelegationSpec,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    register_backend_details,
)
from edgetorch.exir.debug_handles import get_debug_handle
from edgetorch.runtime import Runtime
from edgetorch.runtime.backend_registry import register_backend

NAME = "nested_portable"


@register_backend_details
class NestedBackend(BackendDetails):
    backend_id = NAME

    @classmethod
    def preprocess(cls, edge_program, compile_specs):
        from edgetorch.exir.program import EdgeProgramManager

        et = EdgeProgramManager({"forward": edge_program}, None).to_executorch()
        # backend op id = instruction index of the nested program
        dmap = {i: (h,) for i, h in et.debug_handle_map["forward"].items() if isinstance(h, int) and h}
        return PreprocessResult(et.buffer, dmap)


class NestedRuntime:
    name = NAME

    def init(self, processed, compile_specs):
        assert compile_specs.get("marker") == b"ok"
        return Runtime.get().load_program(bytes(processed)).load_method("forward")

    def execute(self, handle, inputs, outputs, tracer=None):
        res = handle.execute(*inputs)
        res = res if isinstance(res, (list, tuple)) else [res]
        for o, r in zip(outputs, res):
            o.copy_(r)


register_backend(NestedRuntime())


class OpTypePartitioner(Partitioner):
    """Delegates maximal runs of consecutive nodes whose op is in ``ops`` (each run one partition)."""

    def __init__(self, ops: set) -> None:
        self.ops = ops

    def partition(self, exported_program):
        tags = {}
        run = None
        for n in exported_program.graph.nodes:
            if n.op == "call_function" and n.target in self.ops and get_debug_handle(n) is not None:
                if run is None:
                    run = f"p{len(tags)}"
                    tags[run] = DelegationSpec(NAME, [CompileSpec("marker", b"ok")])
                n.meta["delegation_tag"] = run
            elif n.op == "call_function" and n.target.__name__ == "getitem":
                continue
            else:
                run = None
        return PartitionResult(exported_program, tags)


ADD_MUL = {torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.relu.default}
