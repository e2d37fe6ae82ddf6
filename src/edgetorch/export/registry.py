"""Recipe providers per backend and the process-wide registry that ``ExportRecipe.get_recipe`` asks.

Adding a backend's recipes is one module: define a ``RecipeType`` enum whose ``get_backend_name()`` returns
the backend name, a ``BackendRecipeProvider`` subclass, and at the bottom of the module call
``register_backend_recipe_provider(MyProvider())``. Importing the enum's module registers the provider, so
``ExportRecipe.get_recipe(MyRecipeType.X)`` works wherever the enum can be named.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edgetorch.errors import RecipeError

if TYPE_CHECKING:  # annotations only: recipe.py imports this module when a recipe is asked for
    from edgetorch.export.recipe import ExportRecipe, RecipeType

__all__ = ["BackendRecipeProvider", "RecipeRegistry", "recipe_registry", "register_backend_recipe_provider"]


class BackendRecipeProvider(ABC):
    """Builds the export recipes of one backend."""

    @property
    @abstractmethod
    def backend_name(self) -> str:
        """The name ``RecipeType.get_backend_name()`` returns for this backend's recipe types."""

    @abstractmethod
    def get_supported_recipes(self) -> Sequence[RecipeType]:
        """Every recipe type ``create_recipe`` can build."""

    @abstractmethod
    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe | None:
        """The recipe for ``recipe_type``, or None when this provider does not support it."""

    def supports_recipe(self, recipe_type: RecipeType) -> bool:
        return recipe_type in self.get_supported_recipes()


class RecipeRegistry:
    """Backend name -> provider; registering the same backend again replaces its provider."""

    def __init__(self) -> None:
        self._providers: dict[str, BackendRecipeProvider] = {}
        self._lock = threading.Lock()

    def register_backend_recipe_provider(self, provider: BackendRecipeProvider) -> None:
        if not isinstance(provider, BackendRecipeProvider):
            raise RecipeError(f"expected a BackendRecipeProvider, got {type(provider).__name__}")
        with self._lock:
            self._providers[provider.backend_name] = provider

    def get_provider(self, backend: str) -> BackendRecipeProvider:
        with self._lock:
            provider = self._providers.get(backend)
            known = sorted(self._providers)
        if provider is None:
            raise RecipeError(f"no recipe provider is registered for backend '{backend}'; registered backends: "
                              f"{known}. Import the module that defines the backend's recipe types (it registers "
                              "the provider), or call register_backend_recipe_provider().")
        return provider

    def create_recipe(self, recipe_type: RecipeType, backend: str, **kwargs: Any) -> ExportRecipe | None:
        provider = self.get_provider(backend)
        if not provider.supports_recipe(recipe_type):
            return None
        recipe = provider.create_recipe(recipe_type, **kwargs)
        if recipe is not None and recipe.backend is None:
            recipe.backend = backend
        return recipe

    def get_supported_recipes(self, backend: str) -> list[RecipeType]:
        return list(self.get_provider(backend).get_supported_recipes())

    def list_backends(self) -> list[str]:
        with self._lock:
            return sorted(self._providers)


#: The process-wide registry.
recipe_registry = RecipeRegistry()


def register_backend_recipe_provider(provider: BackendRecipeProvider) -> None:
    """Registers ``provider`` in the process-wide registry (call it once, at import of the backend's module)."""
    recipe_registry.register_backend_recipe_provider(provider)
