"""`hrl rollout --recipe langgraph-react` and `hrl train --recipe agents-sdk` end to end on the CPU: the real CLI in a
subprocess, the embedded engine with the tiny model, real LangGraph and Agents SDK code, the real trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.runners.rundir import RunDir
from hrl.runners.trace import read_traces


def hrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "hrl.cli", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)  # fmt: skip


def test_rollout_of_the_langgraph_recipe(tiny_model, tmp_path):
    # 2 tasks × 2 episodes: several groups of several episodes (each episode a worker that imports LangGraph)
    out = hrl("rollout", "--recipe", "langgraph-react", "--model", tiny_model, "--limit", "2", "-n", "2", "--json",
              "--out", "t.jsonl", "-c", "proxy.default_max_tokens=16", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "sandbox none (agent in a subprocess: closed in its own namespace" in out.stderr, out.stderr
    assert "Warning" not in out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    traces = list(read_traces(tmp_path / "t.jsonl"))
    assert len(lines) == len(traces) == 4
    assert all(t["failure_reason"] is None and t["reward"] in (0.0, 0.1, 1.0) and t["calls"] for t in traces)
    assert {(t["agent"]["name"], t["agent"]["version"]) for t in traces} == {("python:agent.py:run", "subprocess")}
    assert all("got" in t["reward_info"] for t in traces)  # scored by the recipe's verifier, hrl.recipes.arithmetic


@pytest.mark.slow
def test_train_two_iterations_of_the_agents_sdk_recipe(tiny_model, tmp_path):
    # one group of 2 a step: two steps are what is checked (each episode a worker that imports the Agents SDK)
    out = hrl("train", "--recipe", "agents-sdk", "--model", tiny_model, "--iterations", "2", "--run-dir", "run",
              "-c", "train.tasks_per_iteration=1", "-c", "proxy.default_max_tokens=16", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    run = RunDir(tmp_path / "run")
    assert run.state()["iteration"] == 2
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # each step that trained publishes one version; one whose groups' rewards all agree (the tiny model's replies
    # decide them) trains on nothing and publishes nothing
    trained = sum(not m["train/empty"] for m in metrics)
    assert [m["step"] for m in metrics] == [0, 1] and metrics[-1]["version"] == trained
    traces = [t for f in sorted((tmp_path / "run" / "traces").glob("iter-*.jsonl")) for t in read_traces(f)]
    assert len(traces) == 2 * 1 * 2 and all(t["calls"] and t["failure_reason"] is None for t in traces)


def test_training_across_two_harnesses_splits_groups_and_metrics_per_harness(tiny_model, tmp_path):
    """`--agent A,B` (rollout.agents): each GRPO group is one task under one harness, the harnesses take the groups
    in turn, every step logs harness/<name>/reward, and the report draws a curve per harness."""
    sdk = "../agents-sdk/agent.py:run"
    out = hrl("train", "--recipe", "langgraph-react", "--model", tiny_model, "--agent", f"agent.py:run,{sdk}",
              "--iterations", "2", "--run-dir", "run", "-c", "proxy.default_max_tokens=16", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "per harness" in out.stderr
    run = RunDir(tmp_path / "run")
    assert run.config()["rollout"]["agents"] == ["agent.py:run", sdk]
    names = {"python:agent.py:run", f"python:{sdk}"}
    for it in range(2):
        traces = run.iteration_traces(it)
        by_group: dict[str, set[str]] = {}
        for t in traces:
            by_group.setdefault(t["group_id"], set()).add(t["agent"]["name"])
        assert len(by_group) == 2 and all(len(v) == 1 for v in by_group.values())
        assert set().union(*by_group.values()) == names  # 2 groups a step, one per harness
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all(f"harness/{n}/reward" in m and m[f"harness/{n}/count"] == 2 for m in steps
                                   for n in names)  # fmt: skip
    report = hrl("report", "run", "--out", "r.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert 'id="plot-reward-harness"' in (tmp_path / "r.html").read_text()
