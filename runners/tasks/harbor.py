"""Harbor task directories (the Terminal-Bench 2 format) as a task source: one folder per task, a folder of them a
dataset.

    my-task/
      task.toml            [agent] timeout_sec; [verifier] timeout_sec, env; [environment] build_timeout_sec, cpus,
                           memory_mb (or memory = "2G"), docker_image; [task] name; [metadata] anything
      instruction.md       what the agent is told
      environment/         the Docker build context of the agent's container (Dockerfile)
      tests/test.sh        run after the agent, in a fresh container; writes /logs/verifier/reward.txt or reward.json
      solution/solve.sh    the gold (`hrl tasks validate`)

hrl reads one table Harbor does not (Harbor ignores it): `[browser]`, a task whose environment serves a web app that
the agent uses through a browser. `start` runs in the agent's container before the agent (in the background), the
app listens on 127.0.0.1:`port` in it, and the episode's browser, beside hrl, opens `path` there
(docs/browser.md, "Harbor tasks that serve a web app").

A task loads as a `HarborTask`, a `Task` whose extra fields say where its folder is and what its task.toml sets; the
tests and the solution stay in the folder (the agent's container never holds them). Its image is built from
`environment/` and tagged by the hash of that folder's contents, so an unchanged environment is built once.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hrl.runners.errors import PrerequisiteError
from hrl.runners.tasks.task import Task, TaskFormatError, files_digest
from hrl.sandboxes import SandboxError

__all__ = [
    "HarborBrowser",
    "HarborTask",
    "build_image",
    "image_tag",
    "is_harbor_source",
    "load_harbor_tasks",
    "task_version",
]

TASK_TOML = "task.toml"
REQUIRED = ("instruction.md", "tests/test.sh")
LABEL = "hrl.harbor.env"


class HarborBrowser(BaseModel):
    """`[browser]`: the web app the task's environment serves, opened in the episode's browser."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key is refused, not ignored

    start: str = Field(min_length=1, description="Shell command that starts the app, run in the background in the "
                       "agent's container (as the image's user, at its workdir) before the agent starts.")  # fmt: skip
    port: int = Field(gt=0, lt=65536, description="The app's port inside the container (it listens on 127.0.0.1).")
    path: str = Field("/", pattern=r"^/", description="The page the browser opens.")
    ready_timeout_sec: float = Field(60.0, gt=0, description="How long the app may take to answer its first request.")


class HarborTask(Task):
    """A Harbor task: `problem_statement` is instruction.md; grading is the folder's tests/test.sh."""

    source: str = Field("harbor", description="Where the task comes from: harbor (a task directory).")
    task_dir: str = Field(description="The task's folder (absolute): task.toml, environment/, tests/, solution/.")
    FAIL_TO_PASS: list[str] = Field(default_factory=list, description="Unused: test.sh writes the reward.")
    agent_timeout_s: float | None = Field(
        None, description="[agent] timeout_sec: the agent's wall time; None = the rollout's."
    )
    verifier_timeout_s: float = Field(600.0, description="[verifier] timeout_sec: test.sh's limit; past it, reward 0.")
    verifier_env: dict[str, str] = Field(default_factory=dict, description="[verifier] env: test.sh's environment.")
    build_timeout_s: float = Field(1800.0, description="[environment] build_timeout_sec: the image build's limit.")
    cpus: float = Field(0.0, description="[environment] cpus, for the agent's and the tests' containers; 0 = none.")
    memory_mb: int = Field(0, description="[environment] memory_mb (or memory = '2G'); 0 = none.")
    docker_image: str | None = Field(None, description="[environment] docker_image: a prebuilt image, no Dockerfile.")
    browser: HarborBrowser | None = Field(None, description="[browser]: the web app the agent uses in a browser.")

    @property
    def folder(self) -> Path:
        return Path(self.task_dir)


def is_harbor_source(path: str | Path) -> bool:
    """A folder is a Harbor source: one task (it holds task.toml) or a dataset of them."""
    return Path(path).is_dir()


def load_harbor_tasks(path: str | Path) -> list[HarborTask]:
    """The task of a task folder, or every task folder (one holding task.toml) directly under a dataset folder,
    sorted by name. Raises TaskFormatError naming the folder and what is missing or malformed."""
    path = Path(path).resolve()
    folders = [path] if (path / TASK_TOML).is_file() else sorted(p for p in path.iterdir() if (p / TASK_TOML).is_file())
    if not folders:
        raise TaskFormatError(
            f"{path} holds no Harbor task (no task.toml in it or in its sub-folders)",
            hint="a Harbor task folder holds task.toml, instruction.md, environment/Dockerfile and tests/test.sh",
        )
    return [_load_one(folder) for folder in folders]


def _load_one(folder: Path) -> HarborTask:
    for name in REQUIRED:
        if not (folder / name).is_file():
            raise TaskFormatError(f"{folder}: Harbor task has no {name}", hint=f"add {folder / name}")
    try:
        config = tomllib.loads((folder / TASK_TOML).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskFormatError(f"{folder / TASK_TOML}: not TOML: {exc}") from exc
    agent, verifier, env = (_section(config, k, folder) for k in ("agent", "verifier", "environment"))
    if not (folder / "environment" / "Dockerfile").is_file() and not env.get("docker_image"):
        raise TaskFormatError(f"{folder}: no environment/Dockerfile and no [environment] docker_image")
    fields: dict[str, Any] = {
        "instance_id": folder.name,
        "repo": str(_section(config, "task", folder).get("name") or ""),
        "problem_statement": (folder / "instruction.md").read_text(),
        "task_dir": str(folder),
        "agent_timeout_s": agent.get("timeout_sec"),
        "verifier_timeout_s": verifier.get("timeout_sec", 600.0),
        "verifier_env": {str(k): str(v) for k, v in (verifier.get("env") or {}).items()},
        "build_timeout_s": env.get("build_timeout_sec", 1800.0),
        "cpus": env.get("cpus", 0.0),
        "memory_mb": env["memory_mb"] if "memory_mb" in env else _megabytes(env.get("memory"), folder),
        "docker_image": env.get("docker_image"),
        "browser": _section(config, "browser", folder) or None,
        "metadata": config.get("metadata") or {},
    }
    try:
        return HarborTask.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise TaskFormatError(f"{folder / TASK_TOML}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from exc


def _section(config: dict[str, Any], name: str, folder: Path) -> dict[str, Any]:
    value = config.get(name) or {}
    if not isinstance(value, dict):
        raise TaskFormatError(f"{folder / TASK_TOML}: [{name}] is not a table")
    return value


def _megabytes(memory: Any, folder: Path) -> int:
    """Older task.toml files say `memory = "2G"` (or "512M")."""
    if memory is None:
        return 0
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(memory), re.I)
    if not m:
        raise TaskFormatError(f"{folder / TASK_TOML}: [environment] memory {memory!r} is not a size such as '2G'")
    scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


# --------------------------------------------------------------------------------------------------------------
# The environment's image
# --------------------------------------------------------------------------------------------------------------


def image_tag(task: HarborTask) -> str:
    """`[environment] docker_image`, else `hrl/harbor-<task>:<hash of environment/>` (every file's path and bytes)."""
    env_dir = task.folder / "environment"
    if task.docker_image and not (env_dir / "Dockerfile").is_file():
        return task.docker_image
    digest = hashlib.sha256()
    for file in sorted(p for p in env_dir.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(env_dir)).encode() + b"\0" + file.read_bytes() + b"\0")
    name = re.sub(r"[^a-z0-9._-]+", "-", task.instance_id.lower()).strip("-._")[:60] or "task"
    return f"hrl/harbor-{name}:{digest.hexdigest()[:16]}"


def task_version(task: HarborTask) -> str:
    """The environment version of a Harbor task: the content hash of its folder (task.toml, instruction.md,
    environment/, tests/), all but solution/, which no episode sees."""
    files = [
        (str(p.relative_to(task.folder)), p.read_bytes())
        for p in task.folder.rglob("*")
        if p.is_file() and p.relative_to(task.folder).parts[0] != "solution"
    ]
    return files_digest(files)


def build_image(task: HarborTask, on_event: Callable[[dict[str, Any]], None] | None = None) -> tuple[str, str]:
    """The task's image, built from environment/ unless an image of that tag exists; (tag, its working directory).
    Blocking (call it from a thread). Raises PrerequisiteError without Docker, SandboxError when the build fails
    or the image cannot be had (the episode's sandbox_error)."""
    import docker
    import docker.errors

    emit = on_event or (lambda event: None)
    tag = image_tag(task)
    try:
        client = docker.from_env(timeout=int(max(task.build_timeout_s, 60)))
    except docker.errors.DockerException as exc:
        raise PrerequisiteError(f"cannot reach the Docker daemon: {exc}", hint="start dockerd (.ci/setup.sh)") from exc
    try:
        try:
            image = client.images.get(tag)
            emit({"event": "image_cached", "tag": tag})
        except docker.errors.ImageNotFound:
            if tag == task.docker_image:
                raise SandboxError(
                    f"image {tag!r} of Harbor task {task.instance_id} is not here",
                    hint=f"docker pull {tag} (or docker load it), or give the task an environment/Dockerfile",
                ) from None
            emit({"event": "image_build", "tag": tag, "task": task.instance_id})
            try:
                image, _ = client.images.build(
                    path=str(task.folder / "environment"), tag=tag, rm=True, forcerm=True, network_mode="host",
                    labels={LABEL: task.instance_id}, timeout=int(task.build_timeout_s),
                )  # fmt: skip
            except docker.errors.BuildError as exc:
                log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
                raise SandboxError(
                    f"building the environment of Harbor task {task.instance_id} failed: {exc}\n{log[-1500:]}",
                    hint=f"docker build {task.folder / 'environment'} shows the whole log",
                ) from exc
            except (docker.errors.APIError, OSError) as exc:
                raise SandboxError(f"building the environment of Harbor task {task.instance_id} failed: {exc}") from exc
            emit({"event": "image_built", "tag": tag})
        workdir = str((image.attrs.get("Config") or {}).get("WorkingDir") or "/app")
        return tag, workdir
    finally:
        client.close()
