"""Find and read recipes: `recipes/<name>/recipe.yaml` (bundled) or any YAML file or folder holding one.

A recipe is plain data. `load_recipe` returns it as a dict with two keys added — `name` (when absent) and
`recipe_dir` (the folder it came from) — and with relative paths under PATH_KEYS (`tasks`, `eval_tasks`) resolved against
that folder, so `tasks: tasks.jsonl` works from any working directory. Merging `-c key=value` overrides is the
caller's job. This module imports nothing from the rest of hrl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["RECIPES_DIR", "RecipeError", "list_recipes", "load_recipe", "recipe_path"]

RECIPES_DIR = Path(__file__).resolve().parent
RECIPE_FILE = "recipe.yaml"
PATH_KEYS = ("tasks", "eval_tasks")  # values that are file paths, relative to the recipe's folder (not `miniwob:…`)


class RecipeError(ValueError):
    """A recipe does not exist or is not a YAML mapping; the message names it and the valid choices."""


def list_recipes() -> list[str]:
    """Names of the bundled recipes."""
    return sorted(p.parent.name for p in RECIPES_DIR.glob(f"*/{RECIPE_FILE}"))


def recipe_path(name_or_path: str | Path) -> Path:
    """The recipe file for a bundled name, a YAML file, or a folder holding recipe.yaml."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.is_dir() and (path / RECIPE_FILE).is_file():
        return path / RECIPE_FILE
    bundled = RECIPES_DIR / str(name_or_path) / RECIPE_FILE
    if "/" not in str(name_or_path) and bundled.is_file():
        return bundled
    raise RecipeError(
        f"no recipe {str(name_or_path)!r}: not a bundled recipe ({', '.join(list_recipes()) or 'none'}), "
        f"nor a YAML file or a folder with {RECIPE_FILE}"
    )


def load_recipe(name_or_path: str | Path) -> dict[str, Any]:
    """Read a recipe (see the module docstring). Raises RecipeError."""
    path = recipe_path(name_or_path)
    try:
        import yaml
    except ImportError as exc:
        raise RecipeError("reading recipes needs PyYAML (pip install pyyaml)") from exc
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a YAML mapping, not {type(data).__name__}")
    folder = path.resolve().parent
    data.setdefault("name", folder.name if path.name == RECIPE_FILE else path.stem)
    data["recipe_dir"] = str(folder)
    for key in PATH_KEYS:
        value = data.get(key)
        if isinstance(value, str) and value and ":" not in value and not Path(value).expanduser().is_absolute():
            data[key] = str(folder / value)
    return data
