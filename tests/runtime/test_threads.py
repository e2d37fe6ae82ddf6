"""A Method shared by several threads: calls are serialised by the method's lock, so every output is the one its
own inputs give (4 threads x 200 calls, each output checked against a serial run of the same input)."""

from __future__ import annotations

import threading

import pytest
import torch

from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.models import get_model
from edgetorch.runtime import Runtime


@pytest.mark.parametrize("name,ort", [("mlp", False), ("small_cnn", False), ("small_cnn", True)],
                         ids=["mlp", "small_cnn", "small_cnn-ort"])
def test_four_threads_share_one_method(name, ort):
    model, inputs = get_model(name)
    parts = None
    if ort:
        from edgetorch.backends.onnxruntime import OrtPartitioner

        parts = [OrtPartitioner()]
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=parts).to_executorch()
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(inputs[0].shape, generator=g) for _ in range(8)]
    want = [method.execute(x)[0] for x in xs]
    bad: list[tuple[int, int]] = []

    def worker(t: int) -> None:
        for i in range(200):
            k = (t + i) % len(xs)
            (out,) = method.execute(xs[k])
            if not torch.equal(out, want[k]):
                bad.append((t, i))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert bad == []
