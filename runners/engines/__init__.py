"""Inference engines behind one protocol, chosen by name through a lazy registry."""

from __future__ import annotations

import importlib
from typing import Any

from hrl.runners.engines.base import Engine, Generation, SamplingParams, TokenDelta, collect
from hrl.runners.errors import UnknownNameError

__all__ = ["ENGINES", "Engine", "Generation", "SamplingParams", "TokenDelta", "collect", "engine_kind", "make_engine"]

# name -> "module:Class" (engine) and "module:Class" (its config); imported only when used.
ENGINES: dict[str, tuple[str, str]] = {
    "embedded": ("hrl.runners.engines.embedded:EmbeddedEngine", "hrl.runners.engines.embedded:EmbeddedEngineConfig"),
    "vllm": ("hrl.runners.engines.vllm:VLLMEngine", "hrl.runners.engines.vllm:VLLMEngineConfig"),
    "scripted": ("hrl.runners.engines.scripted:ScriptedEngine", "hrl.runners.engines.scripted:ScriptedEngineConfig"),
}


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def engine_kind(name: str, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The registered engine a name stands for, and its options (a URL means vLLM at that URL); raises on others."""
    options = dict(options or {})
    if name.startswith(("http://", "https://")):
        name, options = "vllm", {**options, "url": name}
    if name not in ENGINES:
        raise UnknownNameError(f"unknown engine {name!r}; valid: {', '.join(sorted(ENGINES))} or an http:// URL")
    return name, options


def make_engine(name: str, model: str, **options: Any) -> Engine:
    """Build an engine by name ('embedded', 'vllm') or attach to a running vLLM server given as an http(s) URL."""
    name, options = engine_kind(name, options)
    engine_ref, config_ref = ENGINES[name]
    config = _load(config_ref)(model=model, **options)
    return _load(engine_ref)(config)
