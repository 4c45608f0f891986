"""`hrl tasks validate` is quiet by default: the verdicts on stdout and nothing else; `--verbose` brings back each
grading event on stderr. Graded for real, in local sandboxes, on the first demo task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hrl.recipes

DEMO_TASKS = Path(hrl.recipes.__path__[0]) / "demo" / "tasks.jsonl"


def _validate(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    one = tmp_path / "one.jsonl"
    one.write_text(DEMO_TASKS.read_text().splitlines()[0] + "\n")
    cmd = [sys.executable, "-m", "hrl.cli", "tasks", "validate", str(one), "--sandbox", "local", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"})


def test_validate_prints_verdicts_only_unless_verbose(tmp_path: Path):
    quiet = _validate(tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.splitlines()[-1] == "1/1 tasks valid" and "✓ demo-tasks-0000" in quiet.stdout
    assert quiet.stderr == ""  # no raw `task_checked …` line
    loud = _validate(tmp_path, "--verbose")
    assert loud.returncode == 0 and "task_checked instance_id=demo-tasks-0000" in loud.stderr, loud.stderr
