"""Sandbox backends (docker, local). Knows nothing of agents, traces or rewards."""

from __future__ import annotations

from typing import Any

from hrl.registry import lookup
from hrl.sandboxes.base import (
    ExecResult,
    Mount,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    SandboxUnavailableError,
)

__all__ = [
    "SANDBOXES",
    "ExecResult",
    "Mount",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxSpec",
    "SandboxUnavailableError",
    "get_backend",
]

SANDBOXES: dict[str, str] = {
    "docker": "hrl.sandboxes.docker:DockerBackend",
    "local": "hrl.sandboxes.local:LocalBackend",
}


def get_backend(name: str, **options: Any) -> SandboxBackend:
    """A backend by registry name; unknown names raise UnknownNameError listing the valid ones."""
    backend: SandboxBackend = lookup(SANDBOXES, "sandbox", name)(**options)
    return backend
