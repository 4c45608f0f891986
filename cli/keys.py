"""Which `-c key=value` overrides a recipe accepts, read from the config models themselves.

`RecipeKeys` is the recipe's top level; each section names the pydantic model of the component that reads it
("module:Class", imported only when a key under that section is checked, so `hrl rollout -c rollout.x=1` never
imports torch). A dotted key walks the models' fields: a field whose type is a model goes one level down, a
free-form `dict` field (engine_options, rollout.agent_options, …) takes any sub-key, anything else is a leaf.
A field added to any of these models is a valid key at once; nothing here lists them.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from hrl.runners.errors import UsageError

__all__ = ["RecipeKeys", "check_key", "check_overrides"]


def _section(ref: str, description: str, **extra: str) -> Any:
    """A recipe section checked against the model `ref` ("module:Class"; "engine" / "verifier": the config of
    the engine or verifier the recipe names); `extra` names keys the CLI itself reads there, with their type."""
    return Field(default_factory=dict, description=description, json_schema_extra={"model": ref, "extra": extra})


class RecipeKeys(BaseModel):
    """The top-level keys of a recipe (and of a run's config.json)."""

    name: str = Field("", description="The recipe's name (default: its folder's).")
    description: str = Field("", description="One line for `hrl recipes ls`.")
    recipe_dir: str = Field("", description="Set by the loader: the folder relative paths are resolved against.")
    recipe: str = Field("", description="Set by `hrl train`: the recipe name or path the run was made from.")
    model: str = Field("", description="HF model id, local dir, LoRA checkpoint, or hrl:tiny / hrl:tiny-agent.")
    engine: str = Field("embedded", description="embedded | vllm | URL of a running vLLM server.")
    tasks: str = Field("", description="Task file (SWE-bench JSONL, JSON or Parquet), relative to the recipe.")
    eval_tasks: str = Field("", description="Held-out task file, never trained on.")
    max_error_rate: float = Field(0.25, description="`hrl rollout` exits 3 above this share of infra failures.")
    engine_options: dict[str, Any] = _section("engine", "Options of the engine's config (EmbeddedEngineConfig, …).")
    rollout: dict[str, Any] = _section("hrl.runners.rollout:RolloutConfig", "Agent, sandbox, time budget.")
    proxy: dict[str, Any] = _section("hrl.runners.proxy.proxy:ProxyConfig", "The recording proxy.")
    train: dict[str, Any] = _section("hrl.train.loop:LoopConfig", "The outer loop: iterations, batch, advantage.")
    trainer: dict[str, Any] = _section("hrl.train.trainer:TrainerConfig", "The update: LoRA/full, lr, clipping.")
    async_: dict[str, Any] = Field(
        default_factory=dict,
        alias="async",
        description="The asynchronous loop (`enabled` turns it on).",
        json_schema_extra={"model": "hrl.train.async_loop:AsyncConfig", "extra": {"enabled": "bool"}},
    )
    placement: dict[str, Any] = _section("hrl.runners.placement:PlacementConfig", "Where it runs: local, or Ray.")
    verifier: dict[str, Any] = _section("verifier", "The verifier (`name`) and its config.", name="str")


def _model_of(ref: str, cfg: dict[str, Any]) -> type[BaseModel]:
    """The config model a section's `ref` stands for, given the whole config (for the engine's and verifier's)."""
    from hrl.sandboxes.registry import load

    if ref == "engine":
        from hrl.runners.engines import ENGINES, engine_kind

        name, _ = engine_kind(str(cfg.get("engine") or "embedded"))
        return load(ENGINES[name] + "Config")  # type: ignore[no-any-return]
    if ref == "verifier":
        from hrl.runners.tasks import VERIFIERS
        from hrl.sandboxes.registry import require

        name = str((cfg.get("verifier") or {}).get("name") or "tests")
        return load(require(VERIFIERS, "verifier", name) + "Config")  # type: ignore[no-any-return]
    return load(ref)  # type: ignore[no-any-return]


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """name → field of a model, by the name a recipe uses (its alias: `async`). In a section, a field that is a
    top-level section too (LoopConfig.trainer) is filled from that section, so it is no key of its own there."""
    top = set() if model is RecipeKeys else set(_fields(RecipeKeys))
    return {
        field.alias or name: field for name, field in model.model_fields.items() if (field.alias or name) not in top
    }


def _unknown(key: str, prefix: str, valid: list[str]) -> UsageError:
    near = difflib.get_close_matches(key, [prefix + v for v in valid], n=1, cutoff=0.6)
    guess = f"; did you mean {near[0]!r}?" if near else ""
    shown = ", ".join(sorted(valid))
    return UsageError(
        f"unknown -c key {key!r}{guess}",
        hint=f"valid keys{' under ' + prefix.rstrip('.') if prefix else ''}: {shown}",
    )


def check_key(key: str, value: Any, cfg: dict[str, Any]) -> None:
    """Raise UsageError unless `key` (dotted) names a config field and `value` is valid for it."""
    parts, model, prefix = key.split("."), RecipeKeys, ""
    while parts:
        part, rest = parts[0], parts[1:]
        fields = _fields(model)
        if part not in fields:
            raise _unknown(key, prefix, list(fields))
        field, prefix, parts = fields[part], prefix + part + ".", rest
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        own: dict[str, str] = extra.get("extra") or {}  # type: ignore[assignment]
        if "model" in extra:  # a section: the component's model, plus keys the CLI itself reads there
            if len(rest) == 1 and rest[0] in own:
                _check_value(key, value, {"bool": bool, "str": str}[own[rest[0]]], "")
                return
            model = _model_of(str(extra["model"]), cfg)
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):  # a nested model
            model = field.annotation
        elif not rest:
            _check_value(key, value, field.annotation, field.description or "")
        elif not _is_dict(field.annotation):
            raise UsageError(
                f"-c key {key!r}: {prefix[:-1]} is a value, not a section", hint=f"use -c {prefix[:-1]}=VALUE"
            )
        else:
            return  # a free-form dict field (rollout.agent_options, …): any sub-key; the component checks it


def _is_dict(annotation: Any) -> bool:
    return annotation is dict or getattr(annotation, "__origin__", None) is dict


def _check_value(key: str, value: Any, annotation: Any, description: str) -> None:
    try:
        TypeAdapter(annotation).validate_python(value)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"]
        raise UsageError(
            f"bad -c {key}={value!r}: {problem}",
            hint=f"{key}: {description}" if description else f"{key} takes a {annotation}",
        ) from None


def _flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def check_overrides(pairs: list[tuple[str, Any]], cfg: dict[str, Any]) -> None:
    """Check every `-c` key and value (a YAML file's too, flattened) against the models; `cfg` is the merged config
    (it says which engine and verifier the keys under engine_options / verifier belong to)."""
    for key, value in pairs:
        if isinstance(value, dict) and value:
            check_overrides(_flatten(value, key + "."), cfg)
        else:
            check_key(key, value, cfg)
