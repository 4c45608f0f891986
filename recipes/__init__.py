"""Recipes: YAML files plus task data; a data leaf that imports nothing from the layers above."""

__all__: list[str] = []
