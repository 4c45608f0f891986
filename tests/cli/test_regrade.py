"""`hrl regrade`: a real rollout (a white-box agent that runs the model's shell command in its local sandbox, the
scripted engine replying with one task's fix, the tests verifier grading) regraded from its archive agrees 1.00;
a copy laid out as a run directory, with some recorded rewards altered on purpose, lists exactly those episodes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.recipes.loader import load_recipe
from hrl.runners.tasks.load import load_tasks

TASKS = load_tasks(load_recipe("demo")["tasks"])[:2]  # two one-bug repositories with hidden tests
AGENT = """async def run(task, session):
    out = await session.openai().chat.completions.create(model=session.model,
        messages=[{'role': 'user', 'content': task.problem_statement}])
    await session.sandbox.exec(out.choices[0].message.content, timeout_s=30)
"""


def hrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "hrl.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Path:
    """`hrl rollout` of 2 tasks x 2 episodes: the scripted reply fixes the first task only (1, 1, 0, 0)."""
    where = tmp_path_factory.mktemp("rollout")
    (where / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in TASKS))
    (where / "agent.py").write_text(AGENT)
    fix = json.dumps([TASKS[0].demo["fix"]])  # type: ignore[attr-defined]
    run = hrl("rollout", "--agent", "agent.py:run", "--tasks", "tasks.jsonl", "-n", "2", "--sandbox", "local",
              "--model", tiny_model, "--engine", "scripted", "-c", f"engine_options.turns={fix}",
              "--out", "traces.jsonl", cwd=where)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return where / "traces.jsonl"


def rewards(path: Path) -> dict[str, float | None]:
    return {t["trace_id"]: t["reward"] for t in map(json.loads, path.read_text().splitlines())}


def test_a_rollout_regrades_at_full_agreement(rollout: Path):
    recorded = rewards(rollout)
    assert sorted(recorded.values()) == [0.0, 0.0, 1.0, 1.0]  # both outcomes, so agreement is no accident
    run = hrl("regrade", str(rollout), cwd=rollout.parent)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "agreement 1.00 (4/4)"
    assert "[4/4]" in run.stderr  # progress on stderr, results alone on stdout


def test_altered_rewards_are_listed_exactly(rollout: Path, tmp_path: Path):
    """A run directory whose traces say 0 where the tests gave 1 and 0.5 where they gave 0, and one episode whose
    grading failed: the two altered episodes are the disagreements, the failed one is counted apart."""
    traces = [json.loads(line) for line in rollout.read_text().splitlines()]
    ones = [t for t in traces if t["reward"] == 1.0]
    zeros = [t for t in traces if t["reward"] == 0.0]
    ones[0]["reward"], zeros[0]["reward"] = 0.0, 0.5
    zeros[1].update(reward=None, failure_reason="verifier_error")
    run_dir = tmp_path / "run"
    (run_dir / "traces").mkdir(parents=True)
    (run_dir / "traces/iter-0000.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces))
    shutil.copytree(rollout.with_name("traces.archive"), run_dir / "traces/traces.archive")  # as the refs name it

    run = hrl("regrade", str(run_dir), "--json", cwd=tmp_path)
    assert run.returncode == 1, run.stderr  # a disagreement: a script can tell
    report = json.loads(run.stdout)
    listed = {d["trace_id"]: (d["recorded"], d["regraded"]) for d in report["disagreements"]}
    assert listed == {ones[0]["trace_id"]: (0.0, 1.0), zeros[0]["trace_id"]: (0.5, 0.0)}
    assert [d["trace_id"] for d in report["grading_failed"]] == [zeros[1]["trace_id"]]
    assert (report["regraded"], report["agreed"], report["regrade_errors"]) == (3, 1, [])
    assert all(d["why"] for d in report["disagreements"])

    human = hrl("regrade", str(run_dir), cwd=tmp_path)
    assert human.returncode == 1
    assert human.stdout.splitlines()[0] == "agreement 0.33 (1/3)"
    assert "counted apart: 1 grading failed when recorded (verifier_error)" in human.stdout
    assert all(t["metadata"]["episode"] in human.stdout for t in (ones[0], zeros[0]))
