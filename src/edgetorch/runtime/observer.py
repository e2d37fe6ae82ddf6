"""The hook through which a tool watches a ``Method`` run: ``MethodObserver``, and what delegates may call on it
(``DelegateEvents``).

A ``Method`` runs its instructions in one loop (``Method._run``). With an observer attached (``method.observer =
obs``; a ``Program`` loaded with ``enable_etdump``/``debug_buffer_size``/``debug_buffer_path`` attaches its
``ProgramTracer`` to every method it builds), each ``execute`` calls, in this order and on the calling thread:

* ``begin_run(method)``: the inputs are copied into their slots, no instruction has run (if it raises, the run
  does not start and ``end_run`` is not called: it cleans up after itself);
* ``before_instruction(k)`` / ``after_instruction(k)`` around instruction ``k`` (instruction ids of the plan,
  ascending; VIEW instructions are evaluated once at load and are not run, so they get no calls);
* ``end_run(method, ok)``: after the last instruction (``ok=True``; the outputs are still in the arena), or
  when the run failed (``ok=False``, then the run's exception propagates; ``end_run`` must not raise then).

A hook's own exception ends the run unchanged (after ``end_run(method, False)``); an instruction's is wrapped in
``KernelError`` (except ``DebugBufferOverflowError``, the observer's, raised by a delegate logging too much).

Delegates: the observer is handed to ``BackendRuntime.execute(handle, inputs, outputs, tracer)`` as ``tracer``
(``None`` without one). A backend may call the ``DelegateEvents`` methods it finds on it while its
``DELEGATE_CALL`` runs (it should look them up with ``getattr``: an observer need not implement them).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["MethodObserver", "DelegateEvents"]


@runtime_checkable
class MethodObserver(Protocol):
    """Called by ``Method`` around a run and each of its instructions (see the module docstring)."""

    def begin_run(self, method: Any) -> None:
        """A run of ``method`` starts (inputs copied in)."""

    def before_instruction(self, k: int) -> None:
        """Instruction ``k`` is about to run."""

    def after_instruction(self, k: int) -> None:
        """Instruction ``k`` returned (its outputs are in their slots: ``method.value(vid)``)."""

    def end_run(self, method: Any, ok: bool) -> None:
        """The run ended: every instruction ran (``ok``) or one of them or a hook raised (not ``ok``)."""


class DelegateEvents(Protocol):
    """What a backend may call on the ``tracer`` it is handed, while its ``DELEGATE_CALL`` runs."""

    #: True when intermediate values are recorded (``log_delegate_output`` is not a no-op)
    logs_intermediates: bool

    def log_delegate_profile(self, name_or_id: int | str, start_ns: int, end_ns: int,
                             metadata: bytes = b"") -> None:
        """A timed event inside the delegate."""

    def log_delegate_output(self, name_or_id: int | str, value: Any, *, snapshot: bool = True) -> None:
        """A value computed inside the delegate (``snapshot=False``: its memory stays unchanged until the run
        ends, or it was lent by ``delegate_output_buffer``: no copy is taken)."""

    def delegate_output_buffer(self, shape: list[int] | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """Memory of the debug buffer itself, lent to the delegate to write a value into (then logged with
        ``log_delegate_output(..., snapshot=False)`` at no copy); None when there is nothing to lend."""
