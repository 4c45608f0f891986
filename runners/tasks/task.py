"""The task format: a SWE-bench instance, plus what hrl needs to run it offline.

One task per JSONL line (or Parquet row). SWE-bench fields keep their names and meaning:

- `instance_id`, `repo`, `base_commit`, `problem_statement`, `version`, `hints_text`, `created_at`, …
- `FAIL_TO_PASS` / `PASS_TO_PASS`: test ids (pytest node ids for pytest tasks) that the fix must make pass / must
  keep passing. A JSON-encoded string (as in the SWE-bench datasets) is accepted too.
- `test_patch`: a unified (git) diff that adds the hidden tests; the agent never sees it.
- `patch`: the gold fix, a unified (git) diff.

hrl adds:

- `repo_snapshot`: the repository at its base state, so a task works with no git host and no network. Either
  a string — base64 of a gzip-compressed tar whose members are paths relative to the repository root — or a
  dict {relative path: UTF-8 text}. Without a snapshot, the image must already hold the repository at
  `workdir` (SWE-bench instance images do), checked out at `base_commit` when that is given.
- `image`, `workdir`, `env`, `setup_cmd`, `test_cmd`, `test_timeout_s`, `grader`: how to grade it (see the fields).

Rows of SWE-bench, SWE-Gym, SWE-smith and R2E-Gym load as they are (`load.load_tasks`): `swebench.adapt_row` picks
their grader and per-instance image (see `runners/tasks/swebench.py`).

Unknown fields are kept (and written back) untouched.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import posixpath
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hrl.runners.durable import write_atomically
from hrl.runners.errors import HrlError

__all__ = [
    "Task",
    "TaskFormatError",
    "files_digest",
    "pack_snapshot",
    "snapshot_files",
    "snapshot_version",
    "unpack_snapshot",
    "write_tasks",
]

DEFAULT_IMAGE = "hrl/swe-py:bookworm"
PYTEST = "python -m pytest -rA -v --tb=short -p no:cacheprovider -o addopts=''"  # -v: skipped tests' ids


class TaskFormatError(HrlError):
    """A task file or one of its tasks is malformed; the message names the file, line and instance."""


class Task(BaseModel):
    model_config = ConfigDict(extra="allow")

    instance_id: str = Field(description="Unique id, e.g. 'pypi__toolz-1.2.0-3f2a9c1d'.")
    repo: str = Field("", description="Where the code comes from: 'owner/name' on GitHub or 'pypi/<package>'.")
    base_commit: str | None = Field(None, description="Commit the task starts from (None for snapshot-only tasks).")
    repo_snapshot: str | dict[str, str] | None = Field(
        None, description="The repository at its base state: base64 tar.gz, or {path: text}. None: in the image."
    )
    problem_statement: str = Field(description="What the agent is told.")
    FAIL_TO_PASS: list[str] = Field(description="Tests that fail at the base state and must pass after the fix.")
    PASS_TO_PASS: list[str] = Field(default_factory=list, description="Tests that pass and must keep passing.")
    test_patch: str = Field("", description="Unified diff adding the hidden tests (applied only when grading).")
    patch: str = Field("", description="The gold fix, a unified diff.")
    version: str | None = Field(None, description="Version of the code base (SWE-bench: the repo's release).")
    image: str | None = Field(None, description=f"Grading image; None = the verifier's default ({DEFAULT_IMAGE}).")
    workdir: str = Field("/testbed", description="Repository root inside the sandbox.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment for the tests (and the agent).")
    setup_cmd: str | None = Field(None, description="bash run in the grading sandbox before the tests (no network).")
    test_cmd: str | None = Field(
        None, description=f"bash that runs the tests and prints pytest's -rA summary; None = `{PYTEST} <test files>`."
    )
    test_timeout_s: float | None = Field(None, description="Limit for test_cmd in seconds; None = the verifier's.")
    grader: Literal["pytest", "swebench", "swesmith", "r2egym"] = Field(
        "pytest",
        description="pytest: `resolved_test_cmd()` read by its -rA summary. swebench: the official swebench "
        "package's eval script and log parser for `repo`/`version` (set on loading SWE-bench-family rows). "
        "swesmith: `patch` is the bug (applied to the image for the base state, the gold is its reverse), graded "
        "by the swesmith package's profile for `repo` (set on loading SWE-smith rows). r2egym: the image's "
        "run_tests.sh, scored against `expected_output_json` (set on loading R2E-Gym rows).",
    )

    @property
    def gold_patch(self) -> str:
        """The diff that solves the task: `patch`, or for a SWE-smith task (whose `patch` is the bug) its reverse."""
        if self.grader == "swesmith":
            from hrl.runners.tasks.swesmith import reverse_diff

            return reverse_diff(self.patch)
        return self.patch

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """SWE-bench datasets store the test lists as JSON-encoded strings."""
        if isinstance(value, str):
            return json.loads(value) if value.strip() else []
        return value

    @field_validator("repo_snapshot")
    @classmethod
    def _snapshot_has_content(cls, value: Any) -> Any:
        """An empty string is no archive: said when the task is read, not when a sandbox unpacks it."""
        if isinstance(value, str) and not value.strip():
            raise ValueError(
                "is an empty string: give base64 of a tar.gz of the repository, a {path: text} mapping, or leave "
                "the field out (the image holds the repository)"
            )
        return value

    def resolved_test_cmd(self) -> str:
        """The command that runs this task's tests: `test_cmd`, or pytest on the test patch's test files."""
        if self.test_cmd:
            return self.test_cmd
        from hrl.runners.tasks.patches import patch_paths

        files = sorted({t.split("::", 1)[0] for t in self.FAIL_TO_PASS + self.PASS_TO_PASS if "::" in t})
        files = files or [p for p in patch_paths(self.test_patch) if p.endswith(".py")]
        return " ".join([PYTEST, *(_quote(f) for f in files)])


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


# --------------------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------------------


def write_tasks(tasks: Iterable[Task], path: str | Path) -> Path:
    """Write tasks as JSONL (one compact object per line), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps(t.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")) + "\n" for t in tasks)
    write_atomically(path, "".join(lines))
    return path


# --------------------------------------------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------------------------------------------


def pack_snapshot(files: dict[str, bytes]) -> str:
    """Base64 of a deterministic tar.gz of {relative path: bytes} (sorted, mtime 0, root-owned, 0644)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(_safe_path(name))
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    return base64.b64encode(gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)).decode()


def snapshot_files(snapshot: str | dict[str, str]) -> dict[str, bytes]:
    """The files of a snapshot as {relative path: bytes} (regular files only)."""
    if isinstance(snapshot, dict):
        return {_safe_path(k): v.encode() for k, v in snapshot.items()}
    try:
        data = gzip.decompress(base64.b64decode(snapshot, validate=True))
    except (ValueError, OSError) as exc:
        raise TaskFormatError(f"repo_snapshot is not base64 tar.gz: {exc}") from exc
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                files[_safe_path(member.name)] = extracted.read()
    return files


def unpack_snapshot(snapshot: str | dict[str, str], dest: Path) -> list[str]:
    """Write a snapshot's files under `dest`; returns their relative paths."""
    files = snapshot_files(snapshot)
    for name, data in files.items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return sorted(files)


def files_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """`sha256:…` of files as (relative path, bytes), whatever order they come in: the content hash of a tree."""
    digest = hashlib.sha256()
    for name, data in sorted(files):
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    return f"sha256:{digest.hexdigest()}"


def snapshot_version(task: Task) -> str:
    """The environment version of a task that runs from its repository snapshot: the snapshot's content hash (the
    same for a tar.gz and a {path: text} of the same files). A task without one (its repository is an image's, at
    `base_commit`) gets the hash of its record."""
    if task.repo_snapshot is None:
        return files_digest([("task.json", task.model_dump_json().encode())])
    return files_digest(snapshot_files(task.repo_snapshot).items())


def _safe_path(name: str) -> str:
    norm = posixpath.normpath(name.removeprefix("./"))
    if norm.startswith(("/", "../")) or norm in ("..", ".", "") or "/../" in f"/{norm}/":
        raise TaskFormatError(f"repo_snapshot holds an unsafe path {name!r}")
    return norm
