"""Control-token files and run directories stay out of every local sandbox's sight wherever they lie: hrl records
each one it writes (`hrl.sandboxes.hidden`), and each command a local sandbox runs under bubblewrap finds them
emptied, another run's as well as its own."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hrl.config import RunConfig
from hrl.runners.recipe_config import hide_from_sandboxes
from hrl.runners.serving.standalone import write_control_token
from hrl.sandboxes import SandboxError, SandboxSpec
from hrl.sandboxes.hidden import PRUNE_AFTER_S, REGISTRY, hidden_paths, hide
from hrl.sandboxes.local import LocalBackend


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of the test's own (the registry lives there)."""
    folder = tmp_path / "state"
    monkeypatch.setenv("HRL_STATE_DIR", str(folder))
    return folder


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside the host's temp folders: a local sandbox sees its own temp folder in their place, so a file
    under /tmp would be out of sight whether hrl hid it or not."""
    folder = Path.home() / ".cache" / f"hrl-test-hidden-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    temps = {Path(d).resolve() for d in ("/tmp", tempfile.gettempdir())}
    assert not any(folder.resolve().is_relative_to(t) for t in temps)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read_from_a_sandbox(root: Path, *paths: Path) -> str:
    """What a command in a fresh local sandbox (bubblewrap, no hidden_paths of its own) prints for `cat`/`ls`."""
    assert shutil.which("bwrap"), "bubblewrap is needed (.ci/setup.sh installs it)"

    async def main() -> str:
        backend = LocalBackend(root=str(root), isolate=True)
        async with await backend.create(SandboxSpec(network="none"), "another-run", "ep") as sandbox:
            probe = "; ".join(f"ls -A {p}; cat {p}" for p in paths)
            result = await sandbox.exec(probe, timeout_s=60)
            return result.stdout + result.stderr

    return asyncio.run(main())


def test_a_control_token_file_anywhere_is_hidden_from_local_sandboxes(
    tmp_path: Path, state: Path, outside: Path
) -> None:
    """`hrl serve --control-token-file F` with F in a folder of the user's (not the state folder): no command of a
    local sandbox reads it; a file beside it that hrl did not write stays readable (the folder itself is not hidden)."""
    token, decoy = "ctl-" + uuid.uuid4().hex, "decoy-" + uuid.uuid4().hex
    write_control_token(outside / "control", token)
    (outside / "notes.txt").write_text(decoy)
    seen = _read_from_a_sandbox(tmp_path / "sandboxes", outside / "control", outside / "notes.txt")
    assert token not in seen, seen
    assert decoy in seen, seen  # the control: the same command reads what hrl did not record
    assert (outside / "control").read_text().strip() == token  # the host's file is untouched


def test_another_runs_directory_and_control_token_are_hidden_from_local_sandboxes(
    tmp_path: Path, state: Path, outside: Path
) -> None:
    """An online run (`hrl train --serve`) keeps its control token in its run directory; a local sandbox of another
    run (which names none of the first run's paths in its spec) reads neither the token nor the run's traces."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("{}\n")
    run = outside / "runs" / "online-1"
    (run / "traces").mkdir(parents=True)
    (run / "traces" / "iter-0000.jsonl").write_text("MARKER-trace\n")
    token = "ctl-" + uuid.uuid4().hex
    hide_from_sandboxes(RunConfig(), str(tasks), run)  # what `hrl train` does for its run directory
    write_control_token(run / "control-token", token)  # what `hrl train --serve` does
    seen = _read_from_a_sandbox(tmp_path / "sandboxes", run / "control-token", run / "traces")
    assert token not in seen and "MARKER" not in seen and "iter-0000" not in seen, seen
    assert hidden_paths() == sorted([str(run.resolve()), str((run / "control-token").resolve())])


def test_the_registry_drops_paths_long_gone_and_keeps_what_a_sandbox_needs(tmp_path: Path, state: Path) -> None:
    gone, young, kept = tmp_path / "gone", tmp_path / "not-yet-written.jsonl", tmp_path / "run"
    gone.mkdir()
    kept.mkdir()
    for path in (gone, young, kept):
        hide(path)
    gone.rmdir()
    entries = sorted((state / REGISTRY).iterdir())
    assert len(entries) == 3
    old = time.time() - PRUNE_AFTER_S - 60
    for entry in entries:
        if entry.read_text() == str(gone):
            os.utime(entry, (old, old))
    assert hidden_paths() == [str(kept)]
    assert sorted(e.read_text() for e in (state / REGISTRY).iterdir()) == sorted([str(young), str(kept)])
    # a folder holding the sandbox itself is not hidden (the sandbox could not run); one in a folder the sandbox
    # replaces with its own (its temp folder) is already out of sight, unless bound back into it (a mount's source)
    assert hidden_paths(needed=[kept / "sandbox"]) == []
    assert hidden_paths(replaced=[tmp_path.parent]) == []
    assert hidden_paths(needed=[tmp_path], replaced=[tmp_path.parent]) == [str(kept)]


def test_a_path_that_cannot_be_recorded_is_an_error_and_no_token_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("HRL_STATE_DIR", str(blocked))
    with pytest.raises(SandboxError, match="cannot record") as refused:
        hide(tmp_path / "control")
    assert str(blocked) in str(refused.value) and "HRL_STATE_DIR" in (refused.value.hint or "")
    with pytest.raises(SandboxError, match="cannot record"):
        write_control_token(tmp_path / "control", "ctl-never-written")
    assert not (tmp_path / "control").exists()  # a token no sandbox would hide is not written at all
