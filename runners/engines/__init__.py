"""Inference engines behind one protocol, chosen by name through a lazy registry."""

from __future__ import annotations

from typing import Any

from hrl.registry import load, require
from hrl.runners.engines.base import Engine, Generation, SamplingParams, TokenDelta, collect

__all__ = [
    "ENGINES",
    "Engine",
    "Generation",
    "SamplingParams",
    "TokenDelta",
    "collect",
    "engine_kind",
    "is_server_url",
    "make_engine",
]

# name -> "module:Class", imported only when used; the engine's config is `<Class>Config` in the same module.
ENGINES: dict[str, str] = {
    "embedded": "hrl.runners.engines.embedded:EmbeddedEngine",
    "vllm": "hrl.runners.engines.vllm:VLLMEngine",
    "scripted": "hrl.runners.engines.scripted:ScriptedEngine",
    "remote": "hrl.runners.engines.remote:RemoteEngine",  # any engine served by `engines/remote.py`, over HTTP
    "replicas": "hrl.runners.engines.replicas:ReplicaSet",  # several of the above behind one proxy (sticky routing)
}


def is_server_url(name: str) -> bool:
    """Whether an engine name is the address of a running vLLM server: http(s)://host:port or unix:/path."""
    return name.startswith(("http://", "https://", "unix:"))


def engine_kind(name: str, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The registered engine a name stands for, and its options (a URL means vLLM at that URL); raises on others."""
    options = dict(options or {})
    if is_server_url(name):
        name, options = "vllm", {**options, "url": name}
    require(ENGINES, "engine", name, also="an http:// URL or unix:/path of a vLLM server")
    return name, options


def make_engine(name: str, model: str, **options: Any) -> Engine:
    """Build an engine by name ('embedded', 'vllm') or attach to a running vLLM server given by its address."""
    name, options = engine_kind(name, options)
    ref = ENGINES[name]
    config = load(ref + "Config")(model=model, **options)
    engine: Engine = load(ref)(config)
    return engine
