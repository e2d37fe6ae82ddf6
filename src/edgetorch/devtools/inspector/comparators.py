"""Distance metrics for numeric gaps: MSE, L1, SNR (dB), COSINE, MAX_ABS, or a user comparator.

Every metric compares an AOT (reference) tensor ``a`` with a runtime tensor ``b`` as flat vectors of the same
number of elements (shapes may differ when one side is a view of the other), in their common floating precision
(at least float32) with sums accumulated in float64. Elements that are equal (same-signed infinities included)
differ by 0; NaNs count as differences.

Integer and bool tensors are never measured with these metrics (an MSE of raw integers says nothing, and an
index off by one is as wrong as one off by 2**63): the Inspector compares them exactly, as ``EXACT_METRIC``
(``"MISMATCH_FRACTION"``): the fraction of elements that differ, 0.0 when equal, with the count alongside
(``mismatch_count``). Larger is worse, whatever the metric chosen for floating-point rows.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["NumericalComparatorBase", "EXACT_METRIC", "is_exact_dtype", "mismatch_count", "MSEComparator",
           "L1Comparator", "MaxAbsComparator", "SNRComparator", "CosineComparator", "LARGER_IS_WORSE",
           "register_comparator", "metric_names", "larger_is_worse", "get_comparator"]


class NumericalComparatorBase(ABC):
    """Subclass and implement ``element_compare``; optionally ``preprocessing`` (e.g. dequantize, relayout).

    ``preprocessing`` may follow edgetorch's contract, ``preprocessing(a, b) -> (a, b)`` per pair, or the
    reference ExecuTorch's, ``preprocessing(mapping) -> mapping`` with ``mapping`` {(aot handles, aot value):
    (runtime handles, runtime value)}: a one-argument override is called with a one-entry mapping per pair
    (handles ``()`` when unknown) and must return a mapping of the same shape. ``__init__(inspector=None)`` as in
    the reference; the Inspector sets ``inspector`` when it is None."""

    name: str = "custom"
    #: the direction of the metric: True when a larger value is a larger discrepancy (MSE), False for a
    #: similarity (SNR, cosine); the gap table records it (``df.attrs["larger_is_worse"]``) for its readers
    larger_is_worse: bool = True
    inspector: Any = None

    def __init__(self, inspector: Any = None) -> None:
        self.inspector = inspector
    #: the metric of two bit-identical tensors, if known without computing (lets the Inspector skip work)
    identical_value: float | None = None

    @abstractmethod
    def element_compare(self, a: torch.Tensor, b: torch.Tensor) -> float:
        ...

    def preprocessing(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a, b

    def compare(self, a: torch.Tensor, b: torch.Tensor) -> float:
        if _takes_mapping(type(self).preprocessing):
            a, b = _preprocess_mapping(self, a, b)
        else:
            a, b = self.preprocessing(a, b)
        return float(self.element_compare(a, b))


def _takes_mapping(fn: Any) -> bool:
    """Whether a ``preprocessing`` override follows the reference's one-argument (mapping) contract."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())[1:]  # past self
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return len(required) == 1 and not any(p.kind == p.VAR_POSITIONAL for p in params)


def _preprocess_mapping(cmp: NumericalComparatorBase, a: Any, b: Any) -> tuple[Any, Any]:
    out = cmp.preprocessing({((), a): ((), b)})
    if not (isinstance(out, dict) and len(out) == 1):
        raise ValueError(f"{type(cmp).__name__}.preprocessing(mapping) must return a one-entry mapping "
                         f"{{(handles, aot value): (handles, runtime value)}} for a one-entry input, got "
                         f"{type(out).__name__}")
    ((key, val),) = out.items()
    if not (isinstance(key, tuple) and len(key) == 2 and isinstance(val, tuple) and len(val) == 2):
        raise ValueError(f"{type(cmp).__name__}.preprocessing(mapping) must map (handles, value) tuples to "
                         "(handles, value) tuples")
    return key[1], val[1]


#: the metric of integer and bool rows: fraction of mismatching elements (0.0 = identical)
EXACT_METRIC = "MISMATCH_FRACTION"


def is_exact_dtype(dtype: torch.dtype) -> bool:
    """Integer and bool dtypes: compared element by element for equality, never with a distance."""
    return not (dtype.is_floating_point or dtype.is_complex)


def mismatch_count(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of elements that differ between two tensors of the same dtype and element count."""
    if a.dtype != b.dtype or a.numel() != b.numel():
        raise ValueError(f"cannot compare {a.dtype}{list(a.shape)} with {b.dtype}{list(b.shape)} exactly")
    return int(torch.count_nonzero(a.detach().reshape(-1) != b.detach().reshape(-1)))


def _diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a - b`` with equal elements (same-signed infinities too, where ``inf - inf`` is NaN) giving 0."""
    return torch.where(a == b, torch.zeros((), dtype=a.dtype), a - b)


def _reduce_diff(a: torch.Tensor, b: torch.Tensor, reduce: Callable[[torch.Tensor], float]) -> float:
    """``reduce(_diff(a, b))``, from the plain ``a - b`` when that reduces to a finite number (then no element
    was non-finite, and ``_diff``'s masking pass is not needed)."""
    v = reduce(a - b)
    return v if math.isfinite(v) else reduce(_diff(a, b))


def _as_tensor(x: Any, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (bool, int, float)) or (isinstance(x, (list, tuple)) and x):
        try:
            return torch.as_tensor(x, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            pass
    raise ValueError(f"cannot compare {what} of type {type(x).__name__}: expected a tensor or a number")


def _prep(a: Any, b: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat views of both values (tensors, or Python numbers as the reference accepts) in a common floating
    dtype of at least float32 (no copy for float32). ``ValueError`` when the element counts differ."""
    a, b = _as_tensor(a, "the reference value").reshape(-1), _as_tensor(b, "the runtime value").reshape(-1)
    if a.numel() != b.numel():
        raise ValueError(f"cannot compare {a.numel()} reference elements with {b.numel()} runtime elements "
                         "(shape mismatch)")
    dt = torch.promote_types(a.dtype, b.dtype)
    if not dt.is_floating_point or dt.itemsize < 4:
        dt = torch.float32 if dt.is_floating_point else torch.float64
    return a.to(dt), b.to(dt)


def _sq_norm(x: torch.Tensor) -> float:
    """Sum of squares, accumulated in float64 (differences and products stay in the inputs' precision)."""
    return torch.linalg.vector_norm(x, dtype=torch.float64).item() ** 2 if x.numel() else 0.0


class MSEComparator(NumericalComparatorBase):
    name = "MSE"
    identical_value = 0.0  # the value for bit-identical tensors

    def element_compare(self, a, b):
        a, b = _prep(a, b)
        if not a.numel() or torch.equal(a, b):
            return 0.0
        return _reduce_diff(a, b, _sq_norm) / a.numel()


class L1Comparator(NumericalComparatorBase):
    """Sum of absolute differences (as the reference tool defines L1)."""

    name = "L1"
    identical_value = 0.0  # the value for bit-identical tensors

    def element_compare(self, a, b):
        a, b = _prep(a, b)
        if not a.numel() or torch.equal(a, b):
            return 0.0
        return _reduce_diff(a, b, lambda d: torch.linalg.vector_norm(d, ord=1, dtype=torch.float64).item())


class MaxAbsComparator(NumericalComparatorBase):
    name = "MAX_ABS"
    identical_value = 0.0  # the value for bit-identical tensors

    def element_compare(self, a, b):
        a, b = _prep(a, b)
        if not a.numel() or torch.equal(a, b):
            return 0.0
        return _reduce_diff(a, b, lambda d: torch.max(torch.abs(d)).item())


class SNRComparator(NumericalComparatorBase):
    """10·log10(signal power / noise power), signal = the AOT tensor; +inf when identical."""

    name = "SNR"
    larger_is_worse = False
    identical_value = math.inf  # the value for bit-identical tensors

    def element_compare(self, a, b):
        a, b = _prep(a, b)
        if not a.numel() or torch.equal(a, b):
            return math.inf
        noise = _reduce_diff(a, b, _sq_norm)
        signal = _sq_norm(a)
        if noise == 0.0:
            return math.inf
        if signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(signal / noise)


class CosineComparator(NumericalComparatorBase):
    """Cosine similarity (1.0 = same direction); two all-zero tensors count as identical."""

    name = "COSINE"
    larger_is_worse = False
    identical_value = 1.0  # the value for bit-identical tensors

    def element_compare(self, a, b):
        a, b = _prep(a, b)
        if a.dtype == torch.float32:
            a, b = a.double(), b.double()
        na, nb = torch.linalg.vector_norm(a).item(), torch.linalg.vector_norm(b).item()
        if na == 0.0 and nb == 0.0:
            return 1.0
        if na == 0.0 or nb == 0.0:
            return 0.0
        return torch.dot(a, b).item() / (na * nb)


#: the one registry of named metrics (``register_comparator``): the Python API, the CLI's choices and
#: ``LARGER_IS_WORSE`` all read it
_METRICS: dict[str, type[NumericalComparatorBase]] = {}

#: metric name -> whether a larger value means a larger discrepancy (a view of the registry, kept for callers)
LARGER_IS_WORSE: dict[str, bool] = {}


def register_comparator(cls: type[NumericalComparatorBase]) -> type[NumericalComparatorBase]:
    """Registers a comparator class under its ``name`` (upper case) with its ``larger_is_worse`` direction: the
    Inspector's ``distance=`` and the CLI's ``--gap`` / ``--distance`` then accept it. Usable as a decorator."""
    if not (isinstance(cls, type) and issubclass(cls, NumericalComparatorBase)):
        raise TypeError(f"register_comparator expects a NumericalComparatorBase subclass, got {cls!r}")
    key = str(cls.name).strip().upper()
    if not key or key == EXACT_METRIC:
        raise ValueError(f"a comparator needs a name other than {EXACT_METRIC!r}, got {cls.name!r}")
    _METRICS[key] = cls
    LARGER_IS_WORSE[key] = bool(cls.larger_is_worse)
    return cls


def metric_names() -> list[str]:
    """The registered metric names, built-in ones first."""
    return list(_METRICS)


def larger_is_worse(distance: Any, attrs: dict | None = None) -> bool:
    """The direction of ``distance`` (a comparator, its class or a registered name); a gap table's
    ``attrs["larger_is_worse"]`` (written by the Inspector from the comparator itself) wins when given."""
    if attrs is not None and isinstance(attrs.get("larger_is_worse"), bool):
        return attrs["larger_is_worse"]
    if isinstance(distance, NumericalComparatorBase) or (isinstance(distance, type)
                                                          and issubclass(distance, NumericalComparatorBase)):
        return bool(distance.larger_is_worse)
    return LARGER_IS_WORSE.get(str(distance).strip().upper(), True)


for _cls in (MSEComparator, L1Comparator, SNRComparator, CosineComparator, MaxAbsComparator):
    register_comparator(_cls)


def get_comparator(distance: str | NumericalComparatorBase) -> NumericalComparatorBase:
    if isinstance(distance, NumericalComparatorBase):
        return distance
    if isinstance(distance, str):
        key = distance.strip().upper()
        if key in _METRICS:
            return _METRICS[key]()
    raise ValueError(f"unknown distance {distance!r}; use one of {sorted(_METRICS)} or a NumericalComparatorBase")
