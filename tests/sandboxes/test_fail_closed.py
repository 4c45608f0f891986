"""Isolation fails closed: where bubblewrap is installed but cannot set up a namespace, a local sandbox is refused
(exit 4, saying what to do), never run unisolated; where it is absent the documented warning path stays, and
$HRL_LOCAL_ISOLATION=0 opts out explicitly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.sandboxes import SandboxUnavailableError, local
from hrl.sandboxes.local import ISOLATION_VAR, LocalBackend, isolation

BROKEN_BWRAP = "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"


def _path_with(tmp_path: Path, bwrap: str | None) -> str:
    """A PATH whose `bwrap` is the given script (None: no bwrap at all), with python and the usual tools."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if bwrap is not None:
        (bin_dir / "bwrap").write_text(bwrap)
        (bin_dir / "bwrap").chmod(0o755)
    for tool in ("sh", "bash", "env", "true"):
        for d in ("/usr/bin", "/bin"):
            if Path(d, tool).exists():
                (bin_dir / tool).symlink_to(Path(d, tool))
                break
    return f"{bin_dir}:{Path(sys.executable).parent}"


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "_bwrap_ok", False)
    monkeypatch.delenv(ISOLATION_VAR, raising=False)


@pytest.mark.usefixtures("fresh_probe")
def test_a_bubblewrap_that_cannot_set_up_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, BROKEN_BWRAP))
    with pytest.raises(SandboxUnavailableError, match=r"cannot set up a sandbox here .*No permissions") as e:
        LocalBackend()
    assert ISOLATION_VAR in (e.value.hint or "")
    assert not local.bwrap_works()  # a failure is not kept: the next probe runs again


@pytest.mark.usefixtures("fresh_probe")
def test_no_bubblewrap_or_an_explicit_opt_out_runs_unisolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, None))
    assert isolation() is False and LocalBackend().isolate is False
    (tmp_path / "broken").mkdir()
    monkeypatch.setenv("PATH", _path_with(tmp_path / "broken", BROKEN_BWRAP))
    monkeypatch.setenv(ISOLATION_VAR, "0")
    assert isolation() is False


def test_hrl_rollout_refuses_a_broken_bubblewrap_before_anything_starts(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_with(tmp_path, BROKEN_BWRAP), "NO_COLOR": "1"}
    env.pop(ISOLATION_VAR, None)
    out = subprocess.run(
        [sys.executable, "-m", "hrl.cli", "rollout", "--agent", "mini-swe-agent", "--recipe", "demo", "--sandbox",
         "local", "--limit", "1", "--out", str(tmp_path / "t.jsonl")],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 4, out.stderr
    assert "Error: bubblewrap is installed but cannot set up a sandbox here" in out.stderr, out.stderr
    assert f"{ISOLATION_VAR}=0" in out.stderr
    assert not (tmp_path / "t.jsonl").exists()
