"""`hrl recipes`: the bundled recipes."""

from __future__ import annotations

from typing import Annotated

import typer

from hrl.cli.output import emit

__all__ = ["app"]

app = typer.Typer(help="Bundled recipes.", no_args_is_help=True)


@app.command("ls", epilog="Examples:\n\n  hrl recipes ls\n\n  hrl recipes ls --json")
def ls(as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False) -> None:
    """List bundled recipes with their descriptions."""
    from hrl.recipes import list_recipes, load_recipe

    rows = [{"name": n, "description": load_recipe(n).get("description", "")} for n in list_recipes()]
    width = max((len(r["name"]) for r in rows), default=0)  # the descriptions in one column, past the longest name
    emit(rows, as_json=as_json, human="\n".join(f"{r['name']:<{width}}  {r['description']}" for r in rows))


app.command("list", hidden=True)(ls)


@app.command("show", epilog="Examples:\n\n  hrl recipes show swe\n\n  hrl recipes show demo --json")
def show(
    name: Annotated[str, typer.Argument(help="Recipe name or YAML path.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Print a recipe resolved (paths absolute), as YAML or JSON."""
    import yaml

    from hrl.runners.recipe_config import load_recipe_config

    data = load_recipe_config(name)
    emit(data, as_json=as_json, human=yaml.safe_dump(data, sort_keys=False).rstrip())
