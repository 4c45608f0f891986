"""A harness started ahead in a warm sandbox (runners/agents/warm.py): the real mini-swe-agent, its litellm imported
before the episode, sends the same requests as a cold start, is graded the same, says so in its trace, and leaves
nothing running when its time budget ends it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.agents.mini_swe_agent import SUBMIT_COMMAND
from hrl.runners.agents.warm import CLIENT
from hrl.runners.rollouts.episodes import Episode, run_episodes
from hrl.runners.rollouts.rollout import AgentRollouts, RolloutConfig
from hrl.runners.serving.stack import serving
from hrl.runners.trace import all_prompt_ids, read_traces
from tests.runners.tasks.test_verifier import mini_task

FIX = [
    {"tool_calls": [{"name": "bash", "arguments": {"command": "sed -i 's/a - b/a + b/' mini/__init__.py"}}]},
    {"tool_calls": [{"name": "bash", "arguments": {"command": SUBMIT_COMMAND}}]},
]
STUCK = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 97; echo done"}}]}]


async def _episodes(
    tiny_model: str, out: Path, turns: list[Any], warm: int, n: int, sandbox: str = "local", **cfg: Any
) -> list[dict]:
    run_id = f"test-warm-{uuid.uuid4().hex[:8]}"
    config = RolloutConfig(agent="mini-swe-agent", sandbox=sandbox, run_id=run_id, warm_sandboxes=warm,
                           agent_options={"step_limit": 4}, **{"time_budget_s": 120, **cfg})  # fmt: skip
    async with serving(tiny_model, "scripted", engine_options={"turns": turns}) as stack:
        image = {"image": "hrl/swe-py:bookworm"} if sandbox == "docker" else {}
        rollouts = AgentRollouts(stack, config, verifier={"run_id": run_id, **image})
        await asyncio.to_thread(rollouts.prepare)
        task = mini_task(sandbox).model_dump()
        if warm:  # the pool learns the spec from a first episode, then makes sandboxes ahead for the next ones
            await run_episodes(rollouts, [Episode(task, 0, -1)], out.with_suffix(".first.jsonl"), 1)
            await rollouts.pool.settle()
        traces = await run_episodes(rollouts, [Episode(task, k, 0) for k in range(n)], out, 1)
        await rollouts.close()
    return traces


@pytest.mark.agents
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sandbox", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_warm_harness_sends_what_a_cold_one_sends_and_says_it_was_warm(tiny_model, tmp_path, sandbox, request):
    if sandbox == "docker":
        request.getfixturevalue("swe_image")  # the grading image, built once
    cold = asyncio.run(_episodes(tiny_model, tmp_path / "cold.jsonl", FIX, warm=0, n=1, sandbox=sandbox))
    warm = asyncio.run(_episodes(tiny_model, tmp_path / "warm.jsonl", FIX, warm=1, n=2, sandbox=sandbox))
    assert [t["reward"] for t in cold + warm] == [1.0] * 3, [t.get("reward_info") for t in cold + warm]
    assert "harness_warm" not in cold[0]["metadata"]
    assert [t["metadata"].get("harness_warm") for t in warm] == [True, True]
    assert all(all_prompt_ids(t) == all_prompt_ids(cold[0]) and len(t["calls"]) == 2 for t in warm)  # token for token
    written = list(read_traces(tmp_path / "warm.jsonl"))
    assert all(0 < t["metadata"]["harness_start_s"] < t["metadata"]["agent_s"] for t in written)


@pytest.mark.agents
@pytest.mark.timeout(600)
def test_a_warm_harness_ended_by_its_time_budget_leaves_nothing_running(tiny_model, tmp_path):
    traces = asyncio.run(_episodes(tiny_model, tmp_path / "t.jsonl", STUCK, warm=1, n=1, time_budget_s=8))
    assert traces[0]["metadata"].get("harness_warm") is True
    assert traces[0]["failure_reason"] == "agent_timeout"
    left = subprocess.run(["pgrep", "-f", "sleep 9[7]"], capture_output=True, text=True)
    assert left.stdout == "", "the agent's command outlived its episode"


def test_a_client_whose_launcher_never_comes_starts_the_cli_cold(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    argv = [sys.executable, str(script), str(tmp_path / "no.sock"), "0.2", "sh", "-c", "echo cold run; exit 3"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (3, "cold run\n")
    assert "not ready in 0.2 s" in proc.stderr
