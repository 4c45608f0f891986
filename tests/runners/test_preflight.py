"""Paths checked before any work (`runners/preflight.py`): a folder this user cannot write is a usage error naming it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TRACE = {
    "schema": "hrl.trace/1", "trace_id": "a1b2c3d4", "session": "s", "task_id": "t1", "status": "ok",
    "failure_reason": None, "reward": 1.0, "calls": [], "started_at": 0.0, "ended_at": 1.0,
}  # fmt: skip


def _as_a_user() -> list[str]:
    """The prefix under which a folder's mode bits hold: none for a user; for root, setpriv taking away the
    capabilities that let root write anywhere."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "root writes through a folder's mode bits: this test drops that with setpriv (util-linux)"
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]


def test_a_folder_this_user_cannot_write_is_a_usage_error_naming_it(tmp_path: Path):
    """--out of rollout, report and tasks synth and train's --run-dir are checked before the work; report's default
    output fails as it is made, with the path named. Each is exit 2; before, each was exit 1, "a bug in hrl" (and
    tasks synth said so only after the synthesis)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "traces.jsonl").write_text(json.dumps(TRACE) + "\n")
    ro.chmod(0o555)
    cases = [
        (["rollout", "-a", "codex", "--recipe", "demo", "--sandbox", "local", "--out", f"{ro}/t.jsonl"],
         f"Error: --out {ro}/t.jsonl: {ro} is not writable"),
        (["report", f"{ro}/traces.jsonl", "--out", f"{ro}/r.html"], f"Error: --out {ro}/r.html: {ro} is not writable"),
        (["tasks", "synth", "--package", "x", "--sandbox", "local", "--out", f"{ro}/o.jsonl"],
         f"Error: --out {ro}/o.jsonl: {ro} is not writable"),
        (["report", f"{ro}/traces.jsonl"], f"Permission denied: '{ro}/"),
        (["train", "--recipe", "demo", "--sandbox", "local", "--run-dir", f"{ro}/run"],
         f"Error: --run-dir {ro}/run: {ro} is not writable"),  # before the model is built
    ]  # fmt: skip
    try:
        for argv, needle in cases:
            out = subprocess.run([*_as_a_user(), sys.executable, "-m", "hrl.cli", *argv], capture_output=True,
                                 text=True, timeout=300, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
            assert out.returncode == 2 and needle in out.stderr, (argv, out.stderr)
            assert "bug in hrl" not in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert sorted(p.name for p in ro.iterdir()) == ["traces.jsonl"]
    finally:
        ro.chmod(0o755)
