"""Progress inside long steps (issue 24): the per-token ticker of ``edgetorch generate``."""

from __future__ import annotations

import io

import torch
from rich.console import Console

from edgetorch.cli._table import Ticker
from edgetorch.models.generation import greedy_generate_with_logits


def _plain_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=120, force_terminal=False), buf


def test_ticker_prints_plain_lines_when_due_but_never_the_last() -> None:
    console, buf = _plain_console()
    with Ticker(console, 3, "token", every_s=0.0) as t:
        for k in range(3):
            t.tick(k)
    lines = buf.getvalue().splitlines()
    assert [line.split(" (")[0].strip() for line in lines] == ["token 1/3", "token 2/3"]


def test_ticker_is_silent_for_a_short_step() -> None:
    console, buf = _plain_console()
    with Ticker(console, 4, "token", every_s=3600.0) as t:
        for k in range(4):
            t.tick(k)
    assert buf.getvalue() == ""


def test_on_token_sees_every_token_in_order() -> None:
    vocab = 11
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))

    def prefill(tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return table[tokens[0]].unsqueeze(0)

    def decode(token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return table[token[0]].unsqueeze(0)

    seen: list[tuple[int, int]] = []
    res = greedy_generate_with_logits(prefill, decode, torch.tensor([[3, 5]]), 6,
                                      on_token=lambda k, tok: seen.append((k, tok)))
    assert seen == list(enumerate(res.tokens))
    assert len(seen) == 6
    # the chosen tokens are the argmax chain of the table (an independent computation)
    want, tok = [], int(table[5].argmax())
    for _ in range(6):
        want.append(tok)
        tok = int(table[tok].argmax())
    assert res.tokens == want


def test_library_notes_reach_the_cli_step_and_the_progress_logger(caplog) -> None:  # noqa: ANN001
    import logging
    import time

    from edgetorch import _progress
    from edgetorch.cli._table import Steps

    console, buf = _plain_console()
    with caplog.at_level(logging.INFO, logger=_progress.LOGGER_NAME):
        with Steps(console, total=1) as steps:
            steps.next("lowering")
            _progress.note("too soon to show")  # within a second of the step's own line
            steps._last_line = time.perf_counter() - 5.0  # the step has been quiet for a while
            _progress.note("partition 1/2: ONNX export")
        _progress.note("after the block")  # no listener left
    lines = [line.strip() for line in buf.getvalue().splitlines()]
    assert lines[0].startswith("[1/1] lowering")
    assert len(lines) == 2 and lines[1].startswith("partition 1/2: ONNX export (")
    assert [r.getMessage() for r in caplog.records if r.name == _progress.LOGGER_NAME] == [
        "too soon to show", "partition 1/2: ONNX export", "after the block"]


def test_a_failing_listener_is_dropped_not_the_step() -> None:
    from edgetorch import _progress

    calls: list[str] = []

    def broken(message: str) -> None:
        calls.append(message)
        raise RuntimeError("listener bug")

    with _progress.listening(broken):
        _progress.note("one")
        _progress.note("two")
    assert calls == ["one"]


def test_lowering_and_emission_announce_their_steps() -> None:
    """The compiler's long steps announce themselves (what the CLI's Steps shows inside `to_edge_transform_and_lower`
    and `to_executorch`): decomposition, partitioning, each partition's re-export and preprocess, emission."""
    from edgetorch import _progress
    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.models import get_model

    model, inputs = get_model("mlp")
    notes: list[str] = []
    with _progress.listening(notes.append):
        epm = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[OrtPartitioner()])
        epm.to_executorch()
    assert notes[0].startswith("'forward': decomposing to core ATen (")
    assert "'forward': partitioning (OrtPartitioner)" in notes
    i = next(k for k, n in enumerate(notes) if n.startswith("'forward': partition 1/1 ("))
    assert notes[i].endswith("to onnxruntime: re-export") and notes[i + 1].endswith("to onnxruntime: preprocess")
    assert notes[-1] == "'forward': planning memory and emitting"
