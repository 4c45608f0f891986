"""Sandbox backends (docker, local). Knows nothing of agents, traces or rewards."""

from __future__ import annotations

import importlib
from typing import Any

from hrl.sandboxes.base import ExecResult, Mount, Sandbox, SandboxBackend, SandboxError, SandboxSpec

__all__ = [
    "SANDBOXES",
    "ExecResult",
    "Mount",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxSpec",
    "get_backend",
]

SANDBOXES: dict[str, str] = {
    "docker": "hrl.sandboxes.docker:DockerBackend",
    "local": "hrl.sandboxes.local:LocalBackend",
}


def get_backend(name: str, **options: Any) -> SandboxBackend:
    if name not in SANDBOXES:
        raise SandboxError(f"unknown sandbox {name!r}; valid: {', '.join(sorted(SANDBOXES))}")
    module, _, attr = SANDBOXES[name].partition(":")
    return getattr(importlib.import_module(module), attr)(**options)  # type: ignore[no-any-return]
