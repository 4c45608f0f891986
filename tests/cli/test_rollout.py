"""`hrl rollout`'s closing lines say why: the mean over rewarded episodes (and how many had no reward), the failures
by reason, and for exit 3 which infrastructure failures pushed the run over `max_error_rate`, with a hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from hrl.cli.rollout import _summary


def _t(reward, reason=None):
    return {"reward": reward, "failure_reason": reason}


def test_summary_skips_missing_rewards_and_names_failures(capsys):
    traces = [_t(1.0), _t(0.0, "agent_timeout"), _t(None, "sandbox_error"), _t(0.5)]
    assert _summary(traces, Path("out.jsonl"), max_error_rate=0.5) == 0
    line = capsys.readouterr().err
    assert "mean reward 0.500 over 3 (1 without a reward)" in line
    assert "failures: agent_timeout 1, sandbox_error 1" in line


def test_too_many_infrastructure_failures_exit_3_saying_which(capsys):
    traces = [_t(None, "sandbox_error"), _t(None, "engine_error"), _t(None, "sandbox_error"), _t(0.0)]
    assert _summary(traces, Path("out.jsonl"), max_error_rate=0.25) == 3
    err = capsys.readouterr().err.splitlines()
    assert "no rewarded" not in err[0] and "mean reward 0.000 over 1 (3 without a reward)" in err[0]
    assert err[1].startswith("Error: 3 of 4 episodes failed in the infrastructure (engine_error 1, sandbox_error 2)")
    assert err[2].startswith("Hint: ") and "hrl inspect out.jsonl" in err[2]


def test_no_rewarded_episode_says_so(capsys):
    assert _summary([_t(None, "cancelled")], Path("o.jsonl"), max_error_rate=0.25) == 0
    assert "no rewarded episode (1 without a reward)" in capsys.readouterr().err


@pytest.mark.agents
@pytest.mark.timeout(300)
def test_a_local_rollout_trace_carries_the_environment_version(tmp_path: Path, tiny_model: str):
    """`hrl rollout --sandbox local`: the trace's env.version is the content hash of the task's repository snapshot
    (a local sandbox runs from no image), whatever the image field names."""
    import json
    import os
    import subprocess
    import sys

    from hrl.runners.tasks.task import snapshot_version
    from tests.runners.tasks.test_verifier import mini_task

    task = mini_task("local")
    (tmp_path / "tasks.jsonl").write_text(task.model_dump_json() + "\n")
    cmd = [sys.executable, "-m", "hrl.cli", "rollout", "--agent", "codex", "--tasks", str(tmp_path / "tasks.jsonl"),
           "--sandbox", "local", "--model", tiny_model, "--engine", "scripted", "-c", 'engine_options.turns=["Done."]',
           "--out", str(tmp_path / "t.jsonl")]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env={**os.environ, "NO_COLOR": "1"})
    assert run.returncode == 0, run.stderr
    [trace] = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert trace["failure_reason"] is None and trace["calls"], trace["metadata"]
    assert trace["env"]["sandbox"] == "local"
    assert trace["env"]["version"] == snapshot_version(task), trace["env"]


@pytest.mark.agents
@pytest.mark.docker
def test_a_real_agent_on_a_harbor_task(tmp_path: Path):
    """mini-swe-agent in the container built from environment/, instruction.md as its prompt, [agent] timeout_sec
    as its limit, then tests/test.sh in a fresh container of its committed state: a reward from reward.txt."""
    import json
    import os
    import subprocess
    import sys

    from hrl.runners.trace import INFRA_FAILURES
    from tests.harbor_tasks import write_task

    folder = write_task(tmp_path / "harbor", "reward-file")
    (folder / "task.toml").write_text("[agent]\ntimeout_sec = 45.0\n\n[verifier]\ntimeout_sec = 60.0\n")
    cmd = [sys.executable, "-m", "hrl.cli", "rollout", "--agent", "mini-swe-agent", "--tasks", str(tmp_path / "harbor"),
           "--model", "hrl:tiny-agent", "--sandbox", "docker", "--out", str(tmp_path / "t.jsonl"),
           "-c", "rollout.agent_options.step_limit=3", "-c", "proxy.default_max_tokens=64"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"})
    assert run.returncode == 0, run.stderr
    [trace] = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert trace["env"]["image"].startswith("hrl/harbor-reward-file:") and trace["calls"]
    from hrl.runners.tasks.harbor import load_harbor_tasks, task_version

    assert trace["env"]["version"] == task_version(load_harbor_tasks(folder)[0])  # the task folder's hash
    assert trace["failure_reason"] not in INFRA_FAILURES, trace["metadata"]
    assert trace["reward"] in (0.0, 1.0) and trace["reward_info"]["reward_file"] == "reward.txt"
    # task.toml's limit, not the rollout's 600 s: 45 s, then the docker kill grace (10 s) at most, and 5 s to spare
    assert trace["metadata"]["agent_s"] < 45 + 15
