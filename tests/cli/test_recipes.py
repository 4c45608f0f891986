"""`hrl recipes ls`: every bundled recipe, its description in one column; README.md shows the same list."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hrl.recipes import list_recipes, load_recipe

README = Path(__file__).resolve().parents[2] / "README.md"


def _ls() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "hrl.cli", "recipes", "ls"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "NO_COLOR": "1"}, check=True)  # fmt: skip
    return out.stdout.splitlines()


def test_every_recipe_is_listed_with_its_description_in_one_column():
    """Before, names longer than 8 characters pushed their descriptions out of line."""
    lines = _ls()
    names = list_recipes()
    assert [line.split()[0] for line in lines] == names
    columns = {line.index(load_recipe(name)["description"]) for line, name in zip(lines, names, strict=True)}
    assert columns == {max(map(len, names)) + 2}, lines


def test_the_readme_shows_the_real_list():
    """README.md's `hrl recipes ls` block is what the command prints, every recipe (it showed 2 of 6)."""
    block = re.search(r"\$ hrl recipes ls\n(.*?)```", README.read_text(), re.S)
    assert block, "README.md has no `hrl recipes ls` block"
    assert block.group(1).splitlines() == _ls()
