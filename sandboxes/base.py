"""The sandbox protocol: somewhere to run an agent CLI on a task's files, with time limits, always cleaned up.

Backends (`docker`, `local`) implement `SandboxBackend.create`; sandboxes are async context managers that remove
everything they created on exit, whatever happened. The layer knows nothing of agents, traces or rewards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from hrl.errors import HrlError

__all__ = ["ExecResult", "Mount", "Sandbox", "SandboxBackend", "SandboxError", "SandboxSpec", "SandboxUnavailableError"]


class SandboxError(HrlError):
    """A sandbox could not be created or used (not: the command inside failed — that is an ExecResult)."""


class SandboxUnavailableError(SandboxError):
    """The backend cannot be used at all: no Docker daemon to reach, or no base image to start from. A missing
    prerequisite rather than a failure of one sandbox."""


class Mount(BaseModel):
    source: str = Field(description="Host path.")
    target: str = Field(description="Path inside the sandbox.")
    read_only: bool = True


class SandboxSpec(BaseModel):
    image: str = Field("hrl/base:bookworm", description="Docker image (ignored by the local backend).")
    workdir: str = Field("/work", description="Where the task's files live inside the sandbox.")
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    network: Literal["none", "proxy", "host"] = Field(
        "proxy",
        description="none: no network. proxy: only the hrl proxy (proxy_socket), as 127.0.0.1:proxy_port. "
        "host: the host's network (for installs only).",
    )
    pull: bool = Field(
        False,
        description="Pull the image when it is not present (the per-instance images of SWE-bench-family datasets); "
        "False: a missing image fails the sandbox (hrl's own images are built, never pulled).",
    )
    registry: str = Field(
        "", description="With pull: take a missing image from this registry (HOST:PORT) and tag it with its name."
    )
    proxy_socket: str | None = Field(None, description="Host path of the proxy's unix socket (network='proxy').")
    proxy_port: int = Field(8000, description="Port the proxy appears on inside the sandbox (network='proxy').")
    forwards: dict[int, str] = Field(
        default_factory=dict,
        description="More host unix sockets the sandbox reaches, each as 127.0.0.1:PORT inside (port -> socket path; "
        "network 'none' or 'proxy'): an episode's own browser endpoint. Each socket's folder is made visible to the "
        "sandbox read-only, so it must be the episode's own.",
    )
    exposes: dict[int, str] = Field(
        default_factory=dict,
        description="Ports inside the sandbox that hrl reaches from the host (port -> path of a unix socket hrl "
        "listens on; docker only): the sandbox keeps connections open to that socket and carries each one hrl "
        "starts to 127.0.0.1:PORT inside (a task's web app, for the episode's browser). The socket's folder is made "
        "visible to the sandbox read-only, so it must be the episode's own.",
    )
    cpus: float = Field(0.0, description="CPU limit; 0 = none.")
    memory_mb: int = Field(0, description="Memory limit in MiB; 0 = none.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels (run and episode ids are added).")
    hidden_paths: list[str] = Field(
        default_factory=list,
        description="Host files or folders the sandbox's commands must not see (the task files that hold hidden "
        "tests and gold patches, the run directory). Docker sees no host path anyway; local hides them (bwrap).",
    )


@dataclass
class ExecResult:
    exit_code: int  # -1 when killed by the timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Sandbox(Protocol):
    """What every sandbox is; the backends' sandboxes inherit it (the members with a body are defaults)."""

    id: str
    workdir: str
    spec: SandboxSpec  # what it was made from
    hrl_warm: Any = None  # what was started in it ahead (a warm harness's launcher), stopped after its close

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout_s: float = 0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        """Run a command (a list, or a string for `bash -c`); timeout_s 0 = none. Kills the whole process tree
        on timeout."""
        ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def copy_in(self, host_dir: str, target: str) -> None:
        """Copy a host directory's contents into the sandbox at `target`."""
        ...

    async def close(self) -> None:
        """Remove everything this sandbox created. Idempotent."""
        ...

    async def commit(self, labels: dict[str, str] | None = None) -> str:
        """Save the sandbox's files as an image labelled `labels`; its id. Raises SandboxError where the backend
        has no images (only docker's has)."""
        raise SandboxError(f"a {type(self).__name__} cannot be saved as an image: only a docker sandbox can")

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SandboxBackend(Protocol):
    """What every backend is; the backends inherit it (the members with a body are defaults)."""

    name: str
    isolate: bool = False  # local: its sandboxes run in namespaces of their own (bubblewrap), their own network too

    async def create(self, spec: SandboxSpec, run_id: str, episode_id: str) -> Sandbox:
        """Create and start a sandbox labelled hrl.run=<run_id>, hrl.episode=<episode_id>. Raises SandboxError."""
        ...

    async def image_digest(self, image: str) -> str | None:
        """The digest of `image` as the backend has it (Docker: the image ID), None when it has no such image (a
        local sandbox has none). A trace's `env.version`. Raises SandboxError when the backend cannot say."""
        ...

    async def prune(self, run_id: str | None = None) -> int:
        """Remove leftovers of crashed runs (all hrl sandboxes, or one run's). Returns how many were removed."""
        ...

    async def remove_image(self, image: str) -> None:
        """Remove an image its sandboxes made (`Sandbox.commit`); nothing where the backend has no images. Raises
        SandboxError."""
        return
