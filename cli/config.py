"""Recipe + `-c` overrides → one resolved config dict (precedence: flag > -c > env > recipe > default)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from hrl.runners.errors import UsageError

__all__ = ["apply_overrides", "checked", "load_recipe_config", "run_config", "run_settings", "set_dotted"]


def set_dotted(cfg: dict[str, Any], key: str, value: Any) -> None:
    node = cfg
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            where = ".".join(parts[: i + 1])
            raise UsageError(f"cannot set -c {key}: {where} is a value, not a section", hint=f"use -c {where}=VALUE")
    node[parts[-1]] = value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_overrides(
    cfg: dict[str, Any], overrides: list[str], *, engine: str = "", tasks: str | None = None
) -> dict[str, Any]:
    """Each override is `key.path=value` (value parsed as YAML) or a YAML file merged on top. Every key and value
    is checked against the config models (`hrl.cli.keys`) once all are merged: UsageError naming the nearest key.
    `engine` and `tasks` are --engine and --tasks flags that will win over the config: engine_options are that
    engine's, and verifier keys those of the verifier that grades those tasks (a folder of Harbor tasks: harbor's)."""
    from hrl.cli.keys import check_overrides

    out = copy.deepcopy(cfg)
    given: list[tuple[str, Any]] = []
    for item in overrides:
        if "=" in item:
            key, _, raw = item.partition("=")
            try:
                value = yaml.safe_load(raw) if raw.strip() else ""
            except yaml.YAMLError as exc:
                raise UsageError(
                    f"bad -c {item!r}: the value is not YAML ({exc})", hint="quote it: -c 'key=\"text\"'"
                ) from None
            set_dotted(out, key.strip(), value)
            given.append((key.strip(), value))
        elif Path(item).is_file():
            extra = yaml.safe_load(Path(item).read_text()) or {}
            if not isinstance(extra, dict):
                raise UsageError(
                    f"-c {item}: a YAML file of overrides must be a mapping", hint="e.g. trainer: {lr: 1e-5}"
                )
            out = _merge(out, extra)
            given += list(extra.items())
        else:
            raise UsageError(f"bad -c {item!r}: expected key=value or a YAML file", hint="e.g. -c trainer.lr=1e-5")
    check_overrides(given, {**out, **({"engine": engine} if engine else {}), **({"tasks": tasks} if tasks else {})})
    return out


def load_recipe_config(name_or_path: str) -> dict[str, Any]:
    """A recipe by name (shipped in hrl.recipes) or a path to a recipe YAML; relative paths inside it are resolved
    against the recipe's own folder. An unknown name is a usage error listing the bundled recipes; so is an
    unknown key or a value out of bounds at any depth (checked as `-c` is)."""
    from hrl.cli.keys import check_recipe
    from hrl.recipes.loader import RecipeError, load_recipe, recipe_path

    try:
        path = recipe_path(name_or_path)
        recipe = dict(load_recipe(name_or_path))
    except RecipeError as e:
        raise UsageError(
            str(e), hint="`hrl recipes ls` lists the bundled recipes; or give a recipe YAML file"
        ) from None
    check_recipe(recipe, str(path))
    return recipe


def materialize_model(name: str) -> str:
    """`hrl:tiny` / `hrl:tiny-agent` name hrl's own local models: built once (deterministically) into the cache; the
    demo recipe ships its tiny-agent build, which is copied instead. `hrl:NAME` of a pretrained model in `hrl models
    ls` (`hrl:smollm2-135m`) is fetched and converted into the cache on first use (`hrl models get NAME`).
    Anything else is returned as given (an HF id or a path)."""
    if not name.startswith("hrl:"):
        return name
    import os

    from hrl.cli.output import err
    from hrl.train.pretrained import CATALOGUE

    kind = name.removeprefix("hrl:")
    if kind in CATALOGUE:  # a build of any dtype in the default folder will do
        from hrl.cli.pretrained import get_showing_progress

        return str(get_showing_progress(kind, dtype=None)["path"])
    out = Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser() / "models" / kind
    if kind == "tiny-agent":  # a no-op when `out` holds this exact build; rebuilt when the recipe's data changed
        from hrl.cli.models import build_tiny_agent_showing_progress

        return str(build_tiny_agent_showing_progress(out))
    if (out / "config.json").is_file():
        return str(out)
    if kind == "tiny":
        from hrl.train.tiny import build_tiny_model as build
    else:
        valid = ", ".join(f"hrl:{n}" for n in ["tiny", "tiny-agent", *CATALOGUE])
        raise UsageError(f"unknown hrl model {name!r}; valid: {valid}", hint="`hrl models ls` lists them")
    err.print(f"building {name} into {out} (once) …", markup=False)
    tmp = out.with_name(out.name + ".partial")
    build(tmp)
    tmp.rename(out)
    return str(out)


def hide_from_sandboxes(cfg: dict[str, Any], task_file: str, *outputs: Path) -> None:
    """Name in `verifier.hide_paths` what no agent or grading sandbox may read: the task file (hidden tests, gold
    patches; a recipe's whole folder, with its other splits) and the run's outputs (traces); the outputs are also
    recorded among the paths no local sandbox of any run may read (`hrl.sandboxes.hidden`)."""
    import hrl.recipes
    from hrl.sandboxes.hidden import hide as hide_everywhere

    tasks = Path(task_file).resolve()
    recipes = [Path(p).resolve() for p in hrl.recipes.__path__]
    inside = any(tasks.is_relative_to(r) for r in recipes)
    hide = [str(tasks.parent if inside else tasks)] if not str(task_file).startswith("miniwob:") else []  # no file
    hide += [str(Path(o).resolve()) for o in outputs]
    for output in outputs:  # another run's sandboxes: its control token, keys and traces lie in its run directory
        hide_everywhere(output)
    verifier = cfg.setdefault("verifier", {})
    verifier["hide_paths"] = [
        *verifier.get("hide_paths", []),
        *(h for h in hide if h not in verifier.get("hide_paths", [])),
    ]


def run_settings(
    cfg: dict[str, Any], sandbox: str, time_budget: float, model: str, engine: str, tasks: Path | None, example: str
) -> tuple[str, str, str]:
    """What `hrl rollout` and `hrl eval` take from their flags over the recipe: the sandbox and time budget (into
    cfg's rollout section), and the (model, engine, task file) to run; `example` is the model the hint names."""
    roll = cfg.setdefault("rollout", {})
    if sandbox:
        roll["sandbox"] = sandbox
    if time_budget:
        roll["time_budget_s"] = time_budget
    model = model or cfg.get("model") or ""
    if not model:
        raise UsageError("give --model (the recipe names none)", hint=f"e.g. --model {example}")
    engine = engine or cfg.get("engine") or "embedded"
    return model, engine, str(tasks) if tasks else str(cfg.get("tasks") or "")


def checked(kind: Any, /, **values: Any) -> Any:
    """`kind(**values)`, a validation error (a check across fields, a value out of bounds) turned into a usage
    error naming the field: said before anything starts."""
    from pydantic import ValidationError

    try:
        return kind(**values)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise UsageError(
            f"bad config{' ' + where if where else ''}: {problem['msg'].removeprefix('Value error, ')}",
            hint="`hrl recipes show NAME` prints a recipe's settings; -c KEY=VALUE changes one",
        ) from None


def run_config(cfg: dict[str, Any]) -> Any:
    """The resolved config as the typed `RunConfig` runs are stood up from (`hrl.runners.placement`)."""
    from hrl.runners.placement import RunConfig

    return checked(RunConfig, **cfg)
