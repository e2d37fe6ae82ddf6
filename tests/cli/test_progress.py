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
