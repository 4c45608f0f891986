"""`hrl tasks check` through the CLI on the five tasks of tests/runners/tasks/test_task_checks.py (graded for real in
local sandboxes; the flaky one flaky by construction, as that module says), then `hrl train` on the same file: the
tasks the check found not ok are left out, listed at the start, and counted in the run's task_checks.json; and
`hrl rollout` on it leaves them out too, unless --include-unchecked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hrl.runners.trace import read_traces
from tests.runners.tasks.test_task_checks import EXPECTED, counter, write_check_file

__all__ = ["counter"]  # the fixture, shared with the runner's test

AGENT = """
async def run(task, session):
    await session.openai().chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": task.problem_statement}], max_tokens=4
    )
    return 0.0
"""


def _hrl(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hrl.cli", *args], capture_output=True, text=True, timeout=280,
                          env=env, cwd=cwd)  # fmt: skip


def test_check_classes_each_task_and_train_leaves_out_the_bad_ones(tmp_path: Path, tiny_model: str, counter: str):
    write_check_file(tmp_path / "tasks.jsonl", counter)
    env = {**os.environ, "NO_COLOR": "1", "HRL_CACHE": str(tmp_path / "cache")}
    check = ["tasks", "check", "tasks.jsonl", "--sandbox", "local", "--runs", "2", "--concurrency", "4"]
    graded = _hrl(*check, "--json", env=env, cwd=tmp_path)
    assert graded.returncode == 1, graded.stderr  # some task is not ok
    rows = [json.loads(line) for line in graded.stdout.splitlines()]  # JSONL: one object per task
    assert {r["instance_id"]: r["status"] for r in rows} == EXPECTED, graded.stdout
    assert all(r["runs"] == 2 and not r["cached"] for r in rows)
    assert "[5/5] " in graded.stderr  # progress, on stderr
    assert len(list((tmp_path / "cache" / "task-checks").glob("*.json"))) == 5

    again = _hrl(*check, env=env, cwd=tmp_path)  # the same check again: every task from the cache
    lines = again.stdout.splitlines()
    assert again.returncode == 1 and len(lines) == 6 and all("(cached)" in line for line in lines[:5]), again.stdout
    assert lines[0] == "ok           sound  (cached)"
    assert lines[3].startswith("flaky        flaky  (cached)  gold: tests/test_m.py::test_counter was ")

    (tmp_path / "agent.py").write_text(AGENT)
    recipe = {
        "name": "checked", "model": tiny_model, "engine": "scripted", "engine_options": {"turns": ["Done."]},
        "tasks": "tasks.jsonl", "rollout": {"agent": "agent.py:run", "mode": "inprocess", "sandbox": "local"},
        "train": {"iterations": 1, "tasks_per_iteration": 5, "group_size": 2, "concurrency": 4},
        "trainer": {"mode": "lora", "lora_rank": 4, "lora_alpha": 8, "micro_batch": 4}, "verifier": {"name": "python"},
    }  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML
    trained = _hrl("train", "--recipe", "recipe.yaml", "--run-dir", "run", env=env, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    ok = [i for i, s in EXPECTED.items() if s == "ok"]
    left = {i: s for i, s in EXPECTED.items() if s != "ok"}
    assert f"tasks: {len(ok)} of 5 used; {len(left)} left out by `hrl tasks check` (" in trained.stderr
    traces = [t for f in sorted((tmp_path / "run" / "traces").glob("iter-*.jsonl")) for t in read_traces(f)]
    assert sorted({t["task_id"] for t in traces}) == sorted(ok) and len(traces) == 2 * len(ok)
    saved = json.loads((tmp_path / "run" / "task_checks.json").read_text())["tasks"]
    assert saved["kept"] == ok and saved["left_out"] == left and saved["unchecked"] == []

    said = {"": f"tasks: {len(ok)} of 5 used; {len(left)} left out by `hrl tasks check` (",
            "--include-unchecked": f"tasks: all 5 used (--include-unchecked); {len(left)} not ok, used anyway ("}  # fmt: skip
    for flag, used in (("", ok), ("--include-unchecked", list(EXPECTED))):
        out = tmp_path / f"rollout{flag}.jsonl"
        rolled = _hrl("rollout", "--recipe", "recipe.yaml", "--out", str(out), *([flag] if flag else []), env=env,
                      cwd=tmp_path)  # fmt: skip
        assert rolled.returncode == 0 and said[flag] in rolled.stderr, rolled.stderr
        assert sorted(t["task_id"] for t in read_traces(out)) == sorted(used)
