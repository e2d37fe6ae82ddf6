"""Greedy autoregressive generation over a ``prefill`` and a ``decode`` callable.

Both callables take ``(tokens (1, T) int64, input_pos (T,) int64)`` and return the
logits ``(1, T, vocab)``: eager modules (``Llama``, the Hugging Face wrappers),
``ep.module()`` of exported programs, or runtime methods (``method.execute``).
A return value may be the logits tensor itself or a list/tuple whose first
element is the logits. The KV cache lives inside the callables; the caller
resets it between prompts.

Example::

    result = greedy_generate_with_logits(model.prefill, model.decode, prompt, 8)
    result.tokens, result.step_logits
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["LogitsFn", "GenerationResult", "as_logits", "greedy_generate_with_logits", "greedy_generate",
           "decode_only_generate", "unlifted_methods"]

LogitsFn = Callable[[torch.Tensor, torch.Tensor], object]


@dataclass
class GenerationResult:
    """Output of :func:`greedy_generate_with_logits`.

    ``tokens[i]`` is the ``i``-th generated id, chosen as ``argmax(step_logits[i])``;
    ``step_logits[i]`` is the ``(vocab,)`` logits row it came from (step 0: the last
    prompt position of the prefill). ``prefill_logits`` holds the prefill's full
    ``(1, T, vocab)`` output.
    """

    tokens: list[int] = field(default_factory=list)
    step_logits: list[torch.Tensor] = field(default_factory=list)
    prefill_logits: torch.Tensor | None = None


def as_logits(out: object) -> torch.Tensor:
    """Return the logits tensor of a method's return value (tensor, or first of a list/tuple)."""
    if isinstance(out, (list, tuple)):
        if not out:
            raise ValueError("method returned an empty sequence")
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"expected logits tensor, got {type(out).__name__}")
    return out


def _last_row(logits: torch.Tensor) -> torch.Tensor:
    """``(1, T, vocab)`` -> the float ``(vocab,)`` row of the last position (a copy)."""
    if logits.dim() != 3 or logits.shape[0] != 1:
        raise ValueError(f"expected logits of shape (1, T, vocab), got {tuple(logits.shape)}")
    return logits[0, -1].detach().float().clone()


def _check_inputs(prompt: torch.Tensor, max_new_tokens: int, max_seq_len: int | None) -> None:
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (1, T) with T >= 1, got {tuple(prompt.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    # the last generated token is never fed back, so T + max_new_tokens - 1 positions are written
    if max_seq_len is not None and prompt.shape[1] + max_new_tokens - 1 > max_seq_len:
        raise ValueError(
            f"prompt ({prompt.shape[1]}) + max_new_tokens ({max_new_tokens}) - 1 exceeds max_seq_len {max_seq_len}"
        )


@torch.no_grad()
def greedy_generate_with_logits(
    prefill: LogitsFn,
    decode: LogitsFn,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    max_seq_len: int | None = None,
    eos_token_id: int | None = None,
    on_token: Callable[[int, int], None] | None = None,
) -> GenerationResult:
    """Greedy decoding that also records every step's logits.

    Calls ``prefill(prompt, arange(T))`` once, then ``decode(tok (1, 1), tensor([pos]))``
    for each new token but the last (positions ``T, T+1, ...``). Stops early after
    ``eos_token_id`` if given. ``max_seq_len`` (optional) validates the cache bound.
    ``on_token(k, token)`` (optional) is called as the k-th new token (from 0) is chosen: progress.
    """
    _check_inputs(prompt, max_new_tokens, max_seq_len)
    prompt = prompt.to(torch.long)
    length = prompt.shape[1]
    prefill_logits = as_logits(prefill(prompt, torch.arange(length, dtype=torch.long)))
    result = GenerationResult(prefill_logits=prefill_logits.detach().clone())
    row = _last_row(prefill_logits)
    for step in range(max_new_tokens):
        token = int(row.argmax())
        result.tokens.append(token)
        result.step_logits.append(row)
        if on_token is not None:
            on_token(step, token)
        if step == max_new_tokens - 1 or token == eos_token_id:
            break
        pos = torch.tensor([length + step], dtype=torch.long)
        row = _last_row(as_logits(decode(torch.tensor([[token]], dtype=torch.long), pos)))
    return result


def greedy_generate(
    prefill: LogitsFn,
    decode: LogitsFn,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    max_seq_len: int | None = None,
    eos_token_id: int | None = None,
) -> list[int]:
    """Greedy decoding; returns the generated token ids (prompt excluded).

    See :func:`greedy_generate_with_logits` for the calling convention.
    """
    return greedy_generate_with_logits(
        prefill, decode, prompt, max_new_tokens, max_seq_len=max_seq_len, eos_token_id=eos_token_id
    ).tokens


def decode_only_generate(
    step: LogitsFn,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    max_seq_len: int | None = None,
) -> GenerationResult:
    """Greedy decoding feeding the prompt one token at a time through ``step`` (no prefill).

    A reference path: it must produce the same tokens as a prefill + decode run.
    ``prefill_logits`` stacks the per-prompt-token logits to ``(1, T, vocab)``.
    """

    def prefill_by_steps(tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        rows = [as_logits(step(tokens[:, i : i + 1], input_pos[i : i + 1])) for i in range(tokens.shape[1])]
        return torch.cat(rows, dim=1)

    return greedy_generate_with_logits(prefill_by_steps, step, prompt, max_new_tokens, max_seq_len=max_seq_len)


def unlifted_methods(programs: dict[str, torch.export.ExportedProgram]) -> dict[str, torch.nn.Module]:
    """``ep.module()`` per method, with buffers shared across the methods.

    Every method's module gets the *same* buffer tensors (by name) as the first
    one, so a cache mutated by ``prefill`` is seen by ``decode``: the eager
    stand-in for a runtime program whose methods share mutable state.
    """
    modules = {name: ep.module() for name, ep in programs.items()}
    shared: dict[str, torch.Tensor] = {}
    for module in modules.values():
        for name, buf in list(module.named_buffers()):
            if name not in shared:
                shared[name] = buf
                continue
            owner, _, leaf = name.rpartition(".")
            module.get_submodule(owner)._buffers[leaf] = shared[name]
    return modules
