"""The recipe registry's former home: ``BackendRecipeProvider``, ``RecipeRegistry``, ``recipe_registry`` and
``register_backend_recipe_provider`` live in :mod:`edgetorch.export.recipe` beside the recipes they build (one
module, no import cycle); this path re-exports them."""

from edgetorch.export.recipe import (
    BackendRecipeProvider,
    RecipeRegistry,
    recipe_registry,
    register_backend_recipe_provider,
)

__all__ = ["BackendRecipeProvider", "RecipeRegistry", "recipe_registry", "register_backend_recipe_provider"]
