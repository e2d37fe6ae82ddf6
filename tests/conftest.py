"""Shared fixtures: compile helpers and a private TMPDIR (TorchInductor writes ~150 MB of headers there)."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

pytest_plugins = ["tests._memory_guard"]  # the suite's memory bound: growth guard + large-model isolation

_PRIVATE_TMP = tempfile.mkdtemp(prefix="edgetorch-tests-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_PRIVATE_TMP, "inductor"))


def lower(model: torch.nn.Module, inputs: tuple, **to_edge_kwargs):
    """export -> to_edge -> to_executorch for one forward method."""
    from edgetorch.exir import to_edge

    ep = torch.export.export(model, inputs)
    return to_edge(ep, **to_edge_kwargs).to_executorch()


def load(et, **kwargs):
    from edgetorch.runtime import Runtime

    return Runtime.get().load_program(et.buffer, **kwargs)


def max_rel_err(got, want) -> float:
    got, want = got.double(), want.double()
    scale = max(want.abs().max().item(), 1e-12)
    return (got - want).abs().max().item() / scale


@pytest.fixture
def tmp_dir(tmp_path):
    return str(tmp_path)
