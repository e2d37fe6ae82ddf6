"""ONNX Runtime delegate backend: ``OrtPartitioner`` picks the edge ops ORT supports, ``OrtBackend`` exports each
partition to ONNX, and ``edgetorch.backends.onnxruntime.runtime`` runs it in an ``onnxruntime.InferenceSession``.

Example::

    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.exir import to_edge_transform_and_lower

    et = to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[OrtPartitioner()]).to_executorch()

This package imports neither side eagerly (the backend contract, docs/architecture.md): the runtime loads
``.runtime`` alone, without the compiler stack, and the compiler imports ``.preprocess`` (which registers
``OrtBackend``) when it first looks the backend up (``exir.backend.get_backend_details``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["OrtBackend", "OrtPartitioner"]


def __getattr__(name: str) -> Any:
    if name == "OrtPartitioner":
        from edgetorch.backends.onnxruntime.partitioner import OrtPartitioner

        return OrtPartitioner
    if name == "OrtBackend":
        from edgetorch.backends.onnxruntime.preprocess import OrtBackend

        return OrtBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
