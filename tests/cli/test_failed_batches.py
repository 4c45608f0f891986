"""An agent that ends before its first model call failed in the harness, not in the policy: its episode is
`no_llm_calls` with no reward, never trained on, and a run whose batch holds only such episodes stops with a
non-zero exit naming the cause (the agent's last words), where it used to exit 0 with traces that held no call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.runners.trace import INFRA_FAILURES, read_traces

CRASHING = """
import sys

async def run(task, session):
    print("agent: cannot import the tool registry (boom-4711)", file=sys.stderr)
    raise RuntimeError("tool registry missing: boom-4711")
"""


def _hrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hrl.cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_COLOR": "1"}, cwd=cwd)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_whose_every_episode_crashed_before_its_first_call_exits_non_zero(tiny_model, tmp_path, mode):
    (tmp_path / "crashing.py").write_text(CRASHING)
    args = ["train", "--recipe", "langgraph-react", "--agent", f"{tmp_path / 'crashing.py'}:run", "--model", tiny_model,
            "--iterations", "2", "--run-dir", "run", "-c", "train.tasks_per_iteration=1", "-c", "train.group_size=2"]  # fmt: skip
    args += ["--async", "-c", "async.max_in_flight=2", "-c", "async.batch_traces=2"] if mode == "async" else []
    out = _hrl(*args, cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    error = out.stderr[out.stderr.index("Error: ") :]
    assert "all 2 episodes of the batch failed before the policy could be trained (no_llm_calls 2)" in error, error
    assert "agent_crash" in error and "boom-4711" in error  # the cause, in the agent's own words
    traces = [t for f in sorted((tmp_path / "run" / "traces").glob("iter-*.jsonl")) for t in read_traces(f)]
    traces = [t for t in traces if t["failure_reason"] != "cancelled"]
    assert traces and all(t["failure_reason"] == "no_llm_calls" and t["reward"] is None for t in traces)
    assert all(t["metadata"]["agent_failure"] == "agent_crash" for t in traces)
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not [
        m for m in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "step" in m
    ]  # no step was taken on nothing


def test_a_rollout_of_such_episodes_exits_3_naming_the_cause(tiny_model, tmp_path):
    (tmp_path / "crashing.py").write_text(CRASHING)
    out = _hrl("rollout", "--recipe", "langgraph-react", "--agent", f"{tmp_path / 'crashing.py'}:run", "--model",
               tiny_model, "--limit", "2", "--out", "t.jsonl", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert "2 of 2 episodes failed in the infrastructure (no_llm_calls 2)" in out.stderr
    assert "boom-4711" in out.stderr
    assert "no_llm_calls" in INFRA_FAILURES
