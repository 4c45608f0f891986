"""Rollouts end to end: a real agent CLI (codex, the quickest to start) in docker sandboxes against the scripted
engine through the real proxy, graded by the real verifier — 16 at once, and every fault ending as one trace."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest

from hrl.runners.rollouts.episodes import Episode, run_episodes
from hrl.runners.rollouts.rollout import AgentRollouts, RolloutConfig
from hrl.runners.serving.stack import serving
from hrl.runners.trace import read_traces
from tests.runners.tasks.test_verifier import mini_task

pytestmark = [pytest.mark.docker, pytest.mark.agents, pytest.mark.timeout(900)]

FIX = [
    {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": "sed -i 's/a - b/a + b/' mini/__init__.py"}}]},
    "Fixed: add() subtracted.",
]


def _left(run_id: str) -> list[Any]:
    # ignore_removed: a container listed a moment before it is removed (a grading one, say) is simply not left
    return docker.from_env().containers.list(all=True, filters={"label": f"hrl.run={run_id}"}, ignore_removed=True)


async def _rollout(
    tiny_model: str,
    tasks: list[Any],
    out: Path,
    turns: list[Any],
    *,
    n: int = 1,
    engine_options: dict[str, Any] | None = None,
    proxy_options: dict[str, Any] | None = None,
    killer: bool = False,
    **roll: Any,
) -> list[dict]:
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    cfg = RolloutConfig(agent="codex", sandbox="docker", run_id=run_id, **{"time_budget_s": 120, **roll})
    async with serving(
        tiny_model, "scripted", engine_options={"turns": turns, **(engine_options or {})}, proxy_options=proxy_options
    ) as stack:
        rollouts = AgentRollouts(stack, cfg, verifier={"image": "hrl/swe-py:bookworm", "run_id": run_id})
        await asyncio.to_thread(rollouts.prepare)
        episodes = [Episode(t.model_dump(), k, 0) for t in tasks for k in range(n)]
        job = asyncio.create_task(run_episodes(rollouts, episodes, out, concurrency=16))
        if killer:  # kill the agent CLI inside its sandbox while it waits for a slow model turn
            await _kill_agent_when_running(run_id, stack.proxy)
        traces = await job
    assert not _left(run_id), "containers left behind"
    return traces


async def _kill_agent_when_running(run_id: str, proxy: Any) -> None:
    """Once its first call generates (a crash before it would be no policy's: no_llm_calls)."""
    for _ in range(600):
        await asyncio.sleep(0.2)
        if not proxy.in_flight():
            continue
        for c in _left(run_id):
            if c.status != "running" or "grade" in c.labels.get("hrl.episode", ""):
                continue
            try:
                # `[c]odex` matches the CLI but not this shell's own command line, which pkill would kill too
                code, _ = await asyncio.to_thread(
                    c.exec_run, ["sh", "-c", "pgrep -f '[c]odex exec' >/dev/null && pkill -9 -f '[c]odex exec'"]
                )
            except docker.errors.APIError:  # the container went away meanwhile
                continue
            if code == 0:
                return


def test_sixteen_concurrent_episodes_fix_the_bug_and_lose_no_trace(tiny_model, tmp_path, swe_image):
    out = tmp_path / "traces.jsonl"
    traces = asyncio.run(_rollout(tiny_model, [mini_task("docker")], out, FIX, n=16))
    written = list(read_traces(out))
    assert len(traces) == len(written) == 16 == len({t["metadata"]["episode"] for t in written})
    assert [t["reward"] for t in written] == [1.0] * 16, [t["reward_info"] for t in written]
    assert all(t["failure_reason"] is None and len(t["calls"]) == 2 for t in written)
    assert all(t["tools"] and t["tools"][0]["name"] == "exec_command" for t in written)
    overhead = sorted(t["metadata"]["episode_s"] - t["metadata"]["agent_s"] for t in written)
    start = sorted(t["metadata"]["harness_start_s"] for t in written)  # launch to first call, inside agent_s
    assert all(0 < t["metadata"]["harness_start_s"] < t["metadata"]["agent_s"] for t in written)
    print(f"\n16 concurrent docker episodes: median sandbox+grading overhead {overhead[8]:.1f}s, "
          f"harness start-up p50 {start[8]:.1f}s")  # fmt: skip


def test_faults_each_end_as_one_trace_with_the_right_reason(tiny_model, tmp_path, swe_image):
    task = mini_task("docker")
    slow = ["word " * 200]  # a model turn that takes ~20 s at 0.1 s per token
    cases = {
        "agent_timeout": {"turns": slow, "engine_options": {"token_delay_s": 0.1}, "time_budget_s": 4},
        "agent_crash": {"turns": slow, "engine_options": {"token_delay_s": 0.1}, "killer": True},
        "engine_error": {"turns": [{"text": "I will crash now, sorry about that.", "fail_after": 3}]},
        "sandbox_error": {"turns": FIX, "verify": True},
    }
    results = {}
    for reason, kw in cases.items():
        out = tmp_path / f"{reason}.jsonl"
        tasks = [task.model_copy(update={"image": "hrl/does-not-exist:1"})] if reason == "sandbox_error" else [task]
        turns = kw.pop("turns")
        (trace,) = asyncio.run(_rollout(tiny_model, tasks, out, turns, **kw))
        assert [t["trace_id"] for t in read_traces(out)] == [trace["trace_id"]]
        results[reason] = trace["failure_reason"]
    print("\n" + json.dumps(results))
    assert results == {r: r for r in cases}


def test_a_dataset_image_that_cannot_be_had_is_a_sandbox_error_naming_it(tiny_model, tmp_path, swe_image):
    """A SWE-bench task's per-instance image, neither here nor pullable (no network): the episode is one
    sandbox_error trace (an infrastructure failure, never trained on) whose error names the image."""
    from hrl.runners.trace import INFRA_FAILURES

    image = "swebench/sweb.eval.x86_64.nobody_1776_nothing-1:latest"
    task = mini_task("docker").model_copy(update={"image": image, "grader": "swebench"})
    (trace,) = asyncio.run(_rollout(tiny_model, [task], tmp_path / "t.jsonl", FIX))
    assert trace["failure_reason"] == "sandbox_error" in INFRA_FAILURES and trace["reward"] is None
    assert image in trace["metadata"]["error"] and "cannot be pulled" in trace["metadata"]["error"]


def test_an_agent_fixes_a_swebench_instance_in_its_own_image(tiny_model, tmp_path, swe_image):
    """The agent works in the instance's image (base state = the image's own, a fresh one-commit history), its diff
    is graded by the official eval script and the repository's log parser."""
    from hrl.runners.tasks import load_tasks
    from tests.runners.tasks.swebench_images import FLASK, ensure_images

    (row,) = ensure_images(tmp_path, (FLASK,))
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    (task,) = load_tasks(tmp_path / "t.jsonl")
    fix = "sed -i 's/text.split()/text.lower().split()/' slugkit/__init__.py"
    turns = [{"tool_calls": [{"name": "exec_command", "arguments": {"cmd": fix}}]}, "Fixed: slugify lowercases."]
    (trace,) = asyncio.run(_rollout(tiny_model, [task], tmp_path / "out.jsonl", turns))
    assert trace["failure_reason"] is None and trace["reward"] == 1.0, trace["reward_info"]
    assert trace["reward_info"]["fail_to_pass"] == {"passed": 1, "total": 1}
    assert trace["env"]["image"] == "swebench/sweb.eval.x86_64.pallets_1776_flask-90001:latest"
    assert trace["env"]["version"] == docker.from_env().images.get(trace["env"]["image"]).id  # what :latest was
