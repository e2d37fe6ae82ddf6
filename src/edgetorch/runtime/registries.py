"""What this runtime can run, as the reference's ``Runtime.operator_registry`` / ``Runtime.backend_registry``
report it: the operator names a program's kernel calls may resolve to, and the delegate backends it can execute.

The operator names are exactly those ``runtime.ops.resolve_operator`` accepts: the allow-list of
``edgetorch.formats.operators`` (the zero-filled allocations included), less the ``torchao::`` names when torchao is
not installed (their kernels live there), plus the operators the user registered in Python
(``runtime.ops.register_operator``), read afresh on every access.
"""

from __future__ import annotations

import importlib.util
import pkgutil

from edgetorch.formats.operators import ZERO_FILLED_ALLOCATIONS, allowed_operators
from edgetorch.runtime import ops as _ops
from edgetorch.runtime.backend_registry import _REGISTRY, BackendNotFoundError, get_backend

__all__ = ["BackendRegistry", "OperatorRegistry"]


def _canonical(name: str) -> str:
    """``"aten::add.out"`` as is; ``"aten::relu"`` (no overload) -> ``"aten::relu.default"``."""
    if not isinstance(name, str) or "::" not in name:
        raise TypeError(f"an operator name is a string 'namespace::name.overload' (e.g. 'aten::add.out'), got "
                        f"{name!r}")
    return name if "." in name.partition("::")[2] else f"{name}.default"


class OperatorRegistry:
    """The operators this runtime runs (``Runtime.get().operator_registry``)."""

    @property
    def operator_names(self) -> set[str]:
        """Every ``"namespace::name.overload"`` a program may call (``"aten::add.out"``, ``"aten::relu.default"``):
        the allow-list and the user-registered operators."""
        names = set(allowed_operators()) | set(ZERO_FILLED_ALLOCATIONS)
        if importlib.util.find_spec("torchao") is None:
            names = {n for n in names if not n.startswith("torchao::")}
        with _ops._REGISTRY_LOCK:
            names.update(_ops._REGISTERED)
        return names

    def has_operator(self, name: str) -> bool:
        """Whether ``name`` (``"aten::add.out"``; without an overload, ``.default``) is one this runtime runs."""
        return _canonical(name) in self.operator_names

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and "::" in name and self.has_operator(name)

    def __len__(self) -> int:
        return len(self.operator_names)

    def __repr__(self) -> str:
        return f"OperatorRegistry({len(self)} operators)"


class BackendRegistry:
    """The delegate backends this runtime executes (``Runtime.get().backend_registry``): those registered and
    those an ``edgetorch.backends.<name>.runtime`` module provides (imported on first use)."""

    @property
    def registered_backend_names(self) -> list[str]:
        """The names a program's delegate calls may name, whose runtime loads here (sorted)."""
        spec = importlib.util.find_spec("edgetorch.backends")
        found = set(_REGISTRY)
        for mod in pkgutil.iter_modules(list(spec.submodule_search_locations or []) if spec else []):
            if mod.ispkg and self.is_available(mod.name):
                found.add(mod.name)
        return sorted(found)

    def is_available(self, backend_name: str) -> bool:
        """Whether a delegate of ``backend_name`` can run here (its runtime module imports, e.g. its engine is
        installed)."""
        try:
            get_backend(backend_name)
        except BackendNotFoundError:
            return False
        return True

    def __repr__(self) -> str:
        return f"BackendRegistry({self.registered_backend_names})"
