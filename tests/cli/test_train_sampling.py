"""`hrl train`, sync and async, through the real CLI: whatever sampling knobs the agent sends, every call reaches the
engine with the no-op values and records both; a one-call agentic trace is flagged and counted per step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hrl.runners.engines.base import NO_OP_SAMPLING
from hrl.runners.trace import read_traces

AGENT = """
from openai import AsyncOpenAI

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}]


async def run(task, session):
    client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    await client.chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": task.problem_statement}], tools=TOOLS,
        max_tokens=8, temperature=0.1, top_p=0.2, extra_body={"top_k": 1, "min_p": 0.5, "presence_penalty": 1.0},
    )
    return 0.0
"""
ASKED = {"temperature": 0.1, "top_p": 0.2, "top_k": 1, "min_p": 0.5, "presence_penalty": 1.0}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_train_samples_honestly_whatever_the_agent_asks(tiny_model, tmp_path, mode):
    (tmp_path / "asking_agent.py").write_text(AGENT)
    agent = f"{tmp_path / 'asking_agent.py'}:run"  # not the recipe's agent.py
    args = [
        "train",
        "--recipe",
        "langgraph-react",
        "--agent",
        agent,
        "--model",
        tiny_model,
        "--iterations",
        "1",
        "--run-dir",
        "run",
        "-c",
        "train.tasks_per_iteration=1",
        "-c",
        "train.group_size=2",
    ]
    args += ["--async", "-c", "async.max_in_flight=2", "-c", "async.batch_traces=2"] if mode == "async" else []
    out = subprocess.run([sys.executable, "-m", "hrl.cli", *args], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "NO_COLOR": "1"}, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["proxy"]["sampling"] == "honest"
    traces = [t for f in sorted((run / "traces").glob("iter-*.jsonl")) for t in read_traces(f)]
    traces = [t for t in traces if t["failure_reason"] != "cancelled"]  # async: episodes still running at the end
    assert len(traces) >= 2 and all(t["calls"] for t in traces)
    for t in traces:
        assert [c["sampling"] for c in t["calls"]] == [{"asked": ASKED, "used": NO_OP_SAMPLING}]
        assert t["degenerate"] is True
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["trace/degenerate"] == metrics[0]["trace/count"] >= 2


def test_a_config_that_asks_for_the_agents_sampling_is_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hrl.cli", "train", "--recipe", "demo", "-c", "proxy.sampling=agent"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("Error: proxy.sampling=agent cannot be trained on")
    assert lines[1].startswith("Hint: ") and not (tmp_path / "runs").exists()
