"""Recipes: YAML files plus task data; a data leaf that imports nothing from the layers above."""

from hrl.recipes.loader import list_recipes, load_recipe

__all__ = ["list_recipes", "load_recipe"]
