"""Recipe + `-c` overrides + flags → one resolved, typed config (precedence: flag > -c > env > recipe > default)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from hrl.config import RunConfig
from hrl.runners.errors import UsageError

__all__ = [
    "apply_overrides",
    "checked",
    "from_overrides",
    "hide_from_sandboxes",
    "load_recipe_config",
    "require_model",
    "resolve",
    "resumed",
    "set_dotted",
]


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
    is checked against the config models (`hrl.runners.recipe_keys`) once all are merged: UsageError naming the nearest key.
    `engine` and `tasks` are --engine and --tasks flags that will win over the config: engine_options are that
    engine's, and verifier keys those of the verifier that grades those tasks (a folder of Harbor tasks: harbor's)."""
    from hrl.runners.recipe_keys import check_overrides

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
    from hrl.recipes.loader import RecipeError, load_recipe, recipe_path
    from hrl.runners.recipe_keys import check_recipe

    try:
        path = recipe_path(name_or_path)
        recipe = dict(load_recipe(name_or_path))
    except RecipeError as e:
        raise UsageError(
            str(e), hint="`hrl recipes ls` lists the bundled recipes; or give a recipe YAML file"
        ) from None
    check_recipe(recipe, str(path))
    return recipe


def resolve(recipe: str, overrides: list[str], flags: dict[str, Any], *, tasks: str | None = None) -> RunConfig:
    """The run's typed config, built before anything else: the recipe (none: the defaults), then `-c`, then the
    flags given (`flags`: dotted key → value; None, "" and False are flags not given) as the last layer, then
    validated whole, the rules across fields included. Nothing heavy is imported, so a refusal is said at once."""
    engine = str(flags.get("engine") or "")
    cfg = apply_overrides(load_recipe_config(recipe) if recipe else {}, overrides, engine=engine, tasks=tasks)
    for key, value in flags.items():
        if value not in (None, "", False):
            set_dotted(cfg, key, value)
    return checked(RunConfig, **cfg)


def resumed(config: dict[str, Any], iterations: int, wandb: bool, otlp: str) -> RunConfig:
    """A resumed run's own config (its config.json), checked again (a run written before a rule existed is refused
    now), extended to `iterations` steps (finished or not), or to logging to W&B or over OTLP, where given."""
    cfg = checked(RunConfig, **config).for_training()
    if iterations:
        cfg.train.iterations = iterations
    if wandb:
        cfg.train.wandb = True
    if otlp:
        cfg.telemetry.otlp_endpoint = otlp
    return cfg


def require_model(cfg: RunConfig, example: str) -> str:
    """The run's model (a flag or the recipe's); a usage error naming `example` when neither gives one."""
    if not cfg.model:
        raise UsageError("give --model (the recipe names none)", hint=f"e.g. --model {example}")
    return cfg.model


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


def hide_from_sandboxes(cfg: RunConfig, task_file: str, *outputs: Path) -> None:
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
    hidden = list(cfg.verifier.get("hide_paths", []))
    cfg.verifier = {**cfg.verifier, "hide_paths": [*hidden, *(h for h in hide if h not in hidden)]}


def from_overrides(kind: Any, overrides: list[str], example: str, /, **values: Any) -> Any:
    """`kind` (a config model) from `-c KEY=VALUE` items (values read as YAML, dotted keys into sections) and `values`
    over them; an unknown key or a bad value is a usage error naming it, its hint `-c example`."""
    given: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad -c {item!r}: expected KEY=VALUE", hint=f"e.g. -c {example}")
        try:
            set_dotted(given, key.strip(), yaml.safe_load(raw) if raw.strip() else "")
        except yaml.YAMLError as exc:
            raise UsageError(f"bad -c {item!r}: the value is not YAML ({exc})", hint=f"e.g. -c {example}") from None
    return checked(kind, **{**given, **values})
