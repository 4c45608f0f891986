"""`hrl tasks validate` is quiet by default: the verdicts on stdout and nothing else; `--verbose` brings back each
grading event on stderr. Graded for real, in local sandboxes, on the first demo task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.docker
def test_validate_a_harbor_dataset(tmp_path: Path):
    """A folder of Harbor tasks: solve.sh scores 1 and the untouched environment 0, for a reward.txt, a reward.json,
    a failing `set -e` test.sh and a test.sh past its timeout; a task whose gold fails is reported, exit 1."""
    import json

    from tests.harbor_tasks import write_dataset

    data = write_dataset(tmp_path / "harbor")
    cmd = [sys.executable, "-m", "hrl.cli", "tasks", "validate", str(data), "--concurrency", "4", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["instance_id"]: r for r in json.loads(run.stdout)}
    assert all(r["ok"] and r["gold"]["reward"] == 1.0 and r["empty"]["reward"] == 0.0 for r in rows.values()), rows
    assert rows["reward-json"]["gold"]["reward_file"] == "reward.json"
    assert rows["slow-test"]["empty"]["timeout"] == "tests/test.sh ran past 3 s"
    assert rows["failing-test"]["empty"]["failed"] == "tests/test.sh exited 1 and wrote no reward"
    (data / "reward-file" / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    bad = subprocess.run([*cmd[:-1], "--json"], capture_output=True, text=True, timeout=300)
    checks = {r["instance_id"]: r for r in json.loads(bad.stdout)}
    assert bad.returncode == 1 and not checks["reward-file"]["ok"]
    [problem] = checks["reward-file"]["problems"]
    assert problem.startswith("solution/solve.sh: reward 0, expected 1 (") and "AssertionError" in problem
