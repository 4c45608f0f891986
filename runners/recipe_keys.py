"""Which `-c key=value` overrides a recipe accepts, read from the config models themselves.

`RunConfig` (hrl.config) is the recipe's top level, every section a typed model of its own; the two sections that
belong to a component chosen by name (engine_options: the engine's, verifier: the verifier's) name it ("engine",
"verifier"), and its config model is imported only when a key under that section is checked. A dotted key walks the
models' fields: a field whose type is a model goes one level down, a free-form `dict` field (rollout.agent_options,
…) takes any sub-key, anything else is a leaf. Nothing checked here imports torch.
A field added to any of these models is a valid key at once; nothing here lists them.
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, TypeAdapter, ValidationError

from hrl.config import DEFAULT_VERIFIER, RunConfig
from hrl.runners.errors import UsageError

__all__ = ["check_key", "check_overrides", "check_recipe"]


def _model_of(ref: str, cfg: dict[str, Any]) -> type[BaseModel]:
    """The config model a section's `ref` stands for, given the whole config (for the engine's and verifier's)."""
    from hrl.registry import load

    if ref == "engine":
        from hrl.runners.engines import ENGINES, engine_kind

        name, _ = engine_kind(str(cfg.get("engine") or RunConfig.model_fields["engine"].default))
        return load(ENGINES[name] + "Config")  # type: ignore[no-any-return]
    if ref == "verifier":
        from hrl.registry import require
        from hrl.runners.tasks import VERIFIERS

        name = str((cfg.get("verifier") or {}).get("name") or DEFAULT_VERIFIER)
        if name == DEFAULT_VERIFIER and cfg.get(
            "tasks"
        ):  # a folder of Harbor tasks, miniwob: pages: graded by their own
            from hrl.runners.tasks import verifier_for

            name = verifier_for(str(cfg["tasks"]))
        if name == "python":  # a white-box agent's scoring function: no verifier class, only its options
            return load("hrl.runners.tasks.verifier:PythonVerifierConfig")  # type: ignore[no-any-return]
        return load(require(VERIFIERS, "verifier", name) + "Config")  # type: ignore[no-any-return]
    return load(ref)  # type: ignore[no-any-return]


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """name → field of a model, by the name a recipe uses (its alias: `async`). In a section, a field that is a
    top-level section of the same model (LoopConfig.trainer) is filled from that section, so it is no key of its own
    there; one that only shares the name (PlacementConfig.trainer, a choice) is."""
    top = {} if model is RunConfig else _fields(RunConfig)
    return {
        field.alias or name: field
        for name, field in model.model_fields.items()
        if (field.alias or name) not in top or top[field.alias or name].annotation != field.annotation
    }


def _unknown(key: str, prefix: str, part: str, valid: list[str], source: str) -> UsageError:
    """The key is unknown from `prefix + part` on: that is what is named, and matched against the valid keys."""
    wrong = prefix + part
    near = difflib.get_close_matches(wrong, [prefix + v for v in valid], n=2, cutoff=0.6)
    near = [n for n in near if _likeness(wrong, n) >= _likeness(wrong, near[0]) - 0.05]  # a tie: name both
    guess = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
    shown, within = ", ".join(sorted(valid)), f" (in {key!r})" if key != wrong else ""
    return UsageError(
        f"unknown {_said(source)} key {wrong!r}{within}{_where(source)}{guess}",
        hint=f"valid keys{' under ' + prefix.rstrip('.') if prefix else ''}: {shown}",
    )


def _likeness(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _said(source: str) -> str:
    """How a message names the key's origin: `-c`, or `recipe` for a recipe file (named by `_where`)."""
    return "-c" if source == "-c" else "recipe"


def _where(source: str) -> str:
    return "" if source == "-c" else f" in {source}"


def check_key(key: str, value: Any, cfg: dict[str, Any], source: str = "-c") -> None:
    """Raise UsageError unless `key` (dotted) names a config field and `value` is valid for it (bounds included).
    `source` is where the key was given: `-c`, or the path of a recipe file."""
    parts, model, prefix = key.split("."), RunConfig, ""
    while parts:
        part, rest = parts[0], parts[1:]
        fields = _fields(model)
        if part not in fields:
            raise _unknown(key, prefix, part, list(fields), source)
        field, prefix, parts = fields[part], prefix + part + ".", rest
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        own: dict[str, str] = extra.get("extra") or {}  # type: ignore[assignment]
        if "model" in extra:  # a section: the component's model, plus keys the CLI itself reads there
            if len(rest) == 1 and rest[0] in own:
                _check_value(key, value, {"bool": bool, "str": str}[own[rest[0]]], "", source)
                return
            model = _model_of(str(extra["model"]), cfg)
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):  # a nested model
            model = field.annotation
        elif not rest:  # the field's bounds (ge=1, …) too: a value the component would refuse is refused here
            bounded = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            finite = _finite(model, field)
            _check_value(key, value, bounded, field.description or "", source, finite=finite)
        elif not _is_dict(field.annotation):
            raise UsageError(
                f"{_said(source)} key {key!r}{_where(source)}: {prefix[:-1]} is a value, not a section",
                hint=f"use -c {prefix[:-1]}=VALUE" if source == "-c" else f"give {prefix[:-1]} one value",
            )
        else:
            return  # a free-form dict field (rollout.agent_options, …): any sub-key; the component checks it


def _is_dict(annotation: Any) -> bool:
    return annotation is dict or get_origin(annotation) is dict


def _finite(model: type[BaseModel], field: Any) -> bool:
    """Whether the field takes finite numbers only: it has a bound (`gt=0` alone lets inf through), or its model
    refuses inf and nan (`allow_inf_nan=False`)."""
    bounded = any(isinstance(m, Gt | Ge | Lt | Le) for m in field.metadata)
    return bounded or model.model_config.get("allow_inf_nan") is False


def _not_finite(value: Any) -> bool:
    try:
        return not isinstance(value, bool) and not math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def _check_value(key: str, value: Any, annotation: Any, description: str, source: str, *, finite: bool = False) -> None:
    def bad(problem: str) -> UsageError:
        return UsageError(
            f"bad {_said(source)} {key}={value!r}{_where(source)}: {problem}",
            hint=f"{key}: {description}" if description else f"{key} takes a {annotation}",
        )

    try:
        checked = TypeAdapter(annotation).validate_python(value)
    except ValidationError as exc:
        if finite and _not_finite(value):  # nan fails a bound's comparison first: say what is wrong with it
            raise bad("Input should be a finite number") from None
        raise bad(exc.errors()[0]["msg"]) from None
    if finite and isinstance(checked, float) and not math.isfinite(checked):
        raise bad("Input should be a finite number")


def _flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def check_overrides(pairs: list[tuple[str, Any]], cfg: dict[str, Any], source: str = "-c") -> None:
    """Check every `-c` key and value (a YAML file's too, flattened) against the models; `cfg` is the merged config
    (it says which engine and verifier the keys under engine_options / verifier belong to)."""
    for key, value in pairs:
        if isinstance(value, dict) and value:
            check_overrides(_flatten(value, key + "."), cfg, source)
        else:
            check_key(key, value, cfg, source)


def check_recipe(recipe: dict[str, Any], path: str) -> None:
    """A recipe file is checked as `-c` is: every key at any depth and its value, against its own engine and
    verifier. A misspelt key would otherwise be ignored, and the run would fall back to the default."""
    check_overrides(list(recipe.items()), recipe, source=path)
