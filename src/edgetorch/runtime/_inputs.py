"""Checks of what a caller passes to ``Method.execute`` that the copy into the arena cannot make itself: keyword
names (bound by name, never by position when they do not match) and tensors the runtime cannot copy from
(sparse, nested, or without the storage their elements need)."""

from __future__ import annotations

from typing import Any

import torch

from edgetorch.errors import RuntimeInputError


def bind_keywords(method: str, args: tuple, kwargs: dict, kwarg_order: list[str] | None,
                  input_names: list[str]) -> tuple[tuple, dict] | list:
    """``(args, kwargs)`` in the order the program was exported with (its keyword inputs, ``kwarg_order``), or
    the flat inputs when every keyword names a flat input (``input_names``) not also given by position.
    ``RuntimeInputError`` for a name the method does not take (naming the names it takes), an input given twice
    or missing."""
    keywords = list(kwarg_order or ())
    known = set(keywords) | set(input_names)
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        raise RuntimeInputError(f"method '{method}' has no input named {unknown}; it takes "
                                f"{keywords or input_names}")
    if kwarg_order is not None and set(kwargs) == set(kwarg_order):
        return args, {k: kwargs[k] for k in kwarg_order}
    if keywords and set(kwargs) <= set(keywords):
        missing = [k for k in keywords if k not in kwargs]
        raise RuntimeInputError(f"method '{method}' was exported with the keyword inputs {keywords}; missing "
                                f"{missing}")
    flat: list[Any] = list(args) + [_MISSING] * (len(input_names) - len(args))
    for name, value in kwargs.items():
        if name not in input_names:
            raise RuntimeInputError(f"method '{method}': input '{name}' is one of the keyword inputs {keywords}, "
                                    "which must be passed together")
        i = input_names.index(name)
        if i >= len(flat) or flat[i] is not _MISSING:
            raise RuntimeInputError(f"method '{method}': input '{name}' is given both by position and by name")
        flat[i] = value
    missing = [input_names[i] for i, v in enumerate(flat) if v is _MISSING]
    if missing or len(flat) != len(input_names):
        raise RuntimeInputError(f"method '{method}' takes the inputs {input_names}; missing {missing}")
    return flat


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def check_tensor_input(method: str, name: str, x: torch.Tensor) -> None:
    """A dense (strided, not nested) tensor whose storage holds every element it addresses."""
    if x.is_nested or x.layout != torch.strided:
        kind = "nested" if x.is_nested else str(x.layout).replace("torch.", "")
        raise RuntimeInputError(f"method '{method}': input '{name}' is a {kind} tensor; the edgetorch runtime takes "
                                "dense (strided) tensors (call .to_dense() first)")
    n = x.numel()
    if n:
        need = (x.storage_offset() + sum((s - 1) * st for s, st in zip(x.shape, x.stride())) + 1) * x.element_size()
        try:
            have = x.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError) as e:  # a tensor subclass or a tensor without data
            raise RuntimeInputError(f"method '{method}': input '{name}' has no readable storage ({e})") from None
        if have < need:
            raise RuntimeInputError(f"method '{method}': input '{name}' addresses {need} bytes but its storage holds "
                                    f"{have} (a resized or freed storage)")
