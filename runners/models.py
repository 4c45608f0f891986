"""Resolve a model name (local dir or HF id) to something transformers / vLLM can load, or fail clearly."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from hrl.runners.errors import ModelNotFoundError

__all__ = ["peft_quietly", "resolve_model", "split_adapter"]


@contextlib.contextmanager
def peft_quietly() -> Iterator[None]:
    """peft wraps a model by asking transformers a name it deprecated (`is_gradient_checkpointing`); the call is
    fine, so its FutureWarning stays out of what users read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name in {".", ".."} or name.count("/") > 1


def resolve_model(name: str) -> str:
    """Return a local directory for `name`, or the HF id itself when it may be downloaded or is cached.

    A path that does not exist, a directory without config.json, or an uncached id with HF_HUB_OFFLINE=1 raises
    ModelNotFoundError naming the model.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model dir {name} has no config.json", hint="point --model at a HF model dir")
        return str(path.resolve())
    if path.exists() or _looks_like_path(name):
        raise ModelNotFoundError(f"model not found: {name}")
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
    except Exception:
        cached = None
    if isinstance(cached, str):
        return name
    if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0"):
        raise ModelNotFoundError(
            f"model {name} is not in the local HF cache and HF_HUB_OFFLINE is set",
            hint="download it first, pass a local dir, or build one with `hrl models tiny DIR`",
        )
    return name


def split_adapter(name: str) -> tuple[str, str | None]:
    """`(base model, adapter dir)` for a peft adapter dir (a LoRA checkpoint of `hrl train`), else `(model, None)`.

    The base is the adapter's `base_model_name_or_path`, resolved like any model; a LoRA checkpoint can thus be
    served or evaluated wherever a model is accepted (the engine loads the base, then publishes the adapter).
    """
    path = Path(name).expanduser()
    config = path / "adapter_config.json"
    if not (path.is_dir() and config.is_file() and not (path / "config.json").is_file()):
        return resolve_model(name), None
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"adapter dir {name}: unreadable adapter_config.json ({e})") from None
    if not base:
        raise ModelNotFoundError(
            f"adapter dir {name} does not name its base model",
            hint="set base_model_name_or_path in adapter_config.json",
        )
    return resolve_model(base), str(path.resolve())
