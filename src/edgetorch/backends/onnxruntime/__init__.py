"""ONNX Runtime delegate backend: ``OrtPartitioner`` picks the edge ops ORT supports, ``OrtBackend`` exports each
partition to ONNX, and ``edgetorch.backends.onnxruntime.runtime`` runs it in an ``onnxruntime.InferenceSession``.

Example::

    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.exir import to_edge_transform_and_lower

    et = to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[OrtPartitioner()]).to_executorch()

The compiler side is imported lazily so that the runtime (``.runtime``) loads without the compiler stack;
the AOT side registers itself as soon as the compiler is present.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["OrtBackend", "OrtPartitioner"]

if "edgetorch.exir.backend.backend_details" in sys.modules:  # lowering is under way: register OrtBackend now
    from edgetorch.backends.onnxruntime import preprocess as _preprocess  # noqa: F401


def __getattr__(name: str) -> Any:
    if name == "OrtPartitioner":
        from edgetorch.backends.onnxruntime.partitioner import OrtPartitioner

        return OrtPartitioner
    if name == "OrtBackend":
        from edgetorch.backends.onnxruntime.preprocess import OrtBackend

        return OrtBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
