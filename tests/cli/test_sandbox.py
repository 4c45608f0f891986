"""`hrl sandbox ls`: local sandboxes (temp folders with a marker) beside docker's containers, each with its run and
episode; a local one is `live` while the process that made it runs and `orphaned` once it is gone (what
`hrl sandbox prune` removes)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.sandboxes import SandboxSpec
from hrl.sandboxes.local import MARKER, PREFIX, LocalBackend


def _ls(root: Path, *args: str, docker: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(root), "NO_COLOR": "1"}
    if not docker:
        env["DOCKER_HOST"] = "unix:///nonexistent"
    return subprocess.run([sys.executable, "-m", "hrl.cli", "sandbox", "ls", *args], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def _orphan(root: Path) -> None:
    """A sandbox left by a process that is gone (killed before it could close it)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = root / f"{PREFIX}run-gone-abc"
    folder.mkdir()
    info = {"run_id": "run-gone", "episode_id": "it0:t#1", "pid": int(gone.stdout), "created": 1.0}
    (folder / MARKER).write_text(json.dumps(info))


def _with_live(root: Path, check) -> None:
    async def main() -> None:
        async with await LocalBackend(root=str(root), isolate=False).create(SandboxSpec(), "run-live", "it0:t#0"):
            await asyncio.to_thread(check)

    asyncio.run(main())


def test_ls_lists_local_sandboxes_and_then_says_docker_is_missing(tmp_path: Path) -> None:
    _orphan(tmp_path)

    def check() -> None:
        out = _ls(tmp_path, "--json")
        assert out.returncode == 4, out.stderr  # the containers could not be listed: a prerequisite is missing
        lines = out.stderr.splitlines()
        assert len(lines) == 2 and lines[0].startswith("Error: no Docker daemon") and lines[1].startswith("Hint: ")
        rows = json.loads(out.stdout)
        assert [(r["backend"], r["run"], r["episode"], r["status"]) for r in rows] == [
            ("local", "run-gone", "it0:t#1", "orphaned"),  # oldest first
            ("local", "run-live", "it0:t#0", "live"),  # made by this process
        ]
        assert all(Path(r["path"]).parent == tmp_path and r["id"] == Path(r["path"]).name for r in rows)
        human = _ls(tmp_path).stdout.splitlines()
        assert [line.split()[:3] for line in human] == [["local", f"{PREFIX}run-gone-abc", "orphaned"],
                                                        ["local", rows[1]["id"], "live"]]  # fmt: skip

    _with_live(tmp_path, check)


@pytest.mark.docker
def test_ls_lists_local_sandboxes_beside_the_containers(tmp_path: Path) -> None:
    _orphan(tmp_path)
    out = _ls(tmp_path, "--json", docker=True)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["run"] for r in rows if r["backend"] == "local"] == ["run-gone"]
    assert all(r["backend"] in ("local", "docker") for r in rows)
