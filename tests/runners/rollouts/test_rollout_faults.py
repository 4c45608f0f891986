"""More rollout faults, end to end like tests/runners/rollouts/test_rollout.py (real codex CLI in docker, real proxy,
scripted engine, real verifier): the agent exiting non-zero on its own, the engine restarted under a running episode,
and Ctrl-C of `hrl rollout` itself. Each must end every started episode as exactly one trace and leave no container behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest

from hrl.runners.rollouts.episodes import Episode, run_episodes
from hrl.runners.rollouts.rollout import AgentRollouts, RolloutConfig
from hrl.runners.serving.stack import Stack, serving
from hrl.runners.tasks.task import write_tasks
from hrl.runners.trace import read_traces
from tests.runners.rollouts.test_rollout import FIX, _left, _rollout
from tests.runners.tasks.test_verifier import mini_task

pytestmark = [pytest.mark.docker, pytest.mark.agents, pytest.mark.timeout(300)]

SLOW = ["word " * 200]  # a model turn that takes ~20 s at 0.1 s per token


def test_agent_exiting_non_zero_on_its_own_is_agent_exit(tiny_model, tmp_path, swe_image):
    """The proxy refuses codex's first request (its body is over max_body_bytes) before any engine call; codex
    gives up on the HTTP error and exits 1 by itself. Neither a timeout, a kill nor an engine fault explains
    that episode: it must say agent_exit, with the CLI's own exit code and why in its output tail. It never reached
    the model, so the episode is the harness's failure (no_llm_calls, never trained on) with agent_exit kept."""
    out = tmp_path / "traces.jsonl"
    (trace,) = asyncio.run(
        _rollout(tiny_model, [mini_task("docker")], out, FIX, proxy_options={"max_body_bytes": 4096})
    )
    meta = trace["metadata"]
    print(f"\nagent exit: {trace['failure_reason']}, exit code {meta['agent_exit_code']}, reward {trace['reward']}")
    assert [t["trace_id"] for t in read_traces(out)] == [trace["trace_id"]]
    assert trace["failure_reason"] == "no_llm_calls" and trace["status"] == "failed"
    assert meta["agent_failure"] == "agent_exit" and meta["agent_exit_code"] == 1, meta
    assert "413" in meta["agent_stdout_tail"], meta
    assert trace["calls"] == [] and trace["reward"] is None
    assert meta["reward_without_calls"] == 0.0  # graded all the same: the bug is still there


def test_a_task_text_that_looks_like_an_option_reaches_the_agent_as_its_prompt(tiny_model, tmp_path, swe_image):
    """A problem statement is data: one starting with `--` (or naming a subcommand) must not be parsed as a codex
    option, which made the CLI exit 2 with a usage error before it asked the model anything."""
    task = mini_task("docker", problem_statement="--fix: add() subtracts")
    (trace,) = asyncio.run(_rollout(tiny_model, [task], tmp_path / "traces.jsonl", FIX))
    assert trace["failure_reason"] is None and trace["reward"] == 1.0, trace["metadata"]["agent_stderr_tail"]
    assert len(trace["calls"]) == 2


def _generating(stack: Stack) -> bool:
    """A model turn is streaming to an agent right now (its first tokens sent, the rest still to come)."""
    return any(call.record.response_ids for call in stack.proxy.in_flight())


async def _restart_mid_episode(tiny_model: str, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    task = mini_task("docker").model_dump()
    cfg = RolloutConfig(agent="codex", sandbox="docker", run_id=run_id, time_budget_s=120)
    opts = {"turns": FIX, "token_delay_s": 0.1}  # the tool-call turn streams for ~4 s
    async with serving(tiny_model, "scripted", engine_options=opts) as stack:
        rollouts = AgentRollouts(stack, cfg, verifier={"image": "hrl/swe-py:bookworm", "run_id": run_id})
        await asyncio.to_thread(rollouts.prepare)
        first = asyncio.create_task(run_episodes(rollouts, [Episode(task, 0, 0)], out, 1))
        for _ in range(1200):
            if _generating(stack) or first.done():
                break
            await asyncio.sleep(0.05)
        assert _generating(stack), "the first episode never reached a model turn"
        await stack.engine.close()  # the engine goes away under the streaming turn and comes back
        await stack.engine.start()
        rest = asyncio.create_task(run_episodes(rollouts, [Episode(task, k, 0) for k in (1, 2)], out, 2))
        ((hit,), after) = await asyncio.gather(first, rest)
    assert not _left(run_id), "containers left behind"
    return hit, after


def test_engine_restart_mid_episode_fails_that_episode_alone(tiny_model, tmp_path, swe_image):
    """An engine restart while an agent waits on a model turn: the cut-short turn must reach neither the agent nor
    the trace as a finished response (else the agent acts on half an answer and the trace trains on it). That
    episode ends as one engine_error trace; episodes started after the restart, while it winds down, fix the bug."""
    out = tmp_path / "traces.jsonl"
    hit, after = asyncio.run(_restart_mid_episode(tiny_model, out))
    written = list(read_traces(out))
    print(f"\nrestarted under: {hit['failure_reason']}; after: {[(t['failure_reason'], t['reward']) for t in after]}")
    assert len(written) == 3 == len({t["metadata"]["episode"] for t in written})
    assert hit["failure_reason"] == "engine_error", hit["metadata"]["agent_stdout_tail"]
    assert "aborted" in hit["calls"][-1]["error"] and hit["calls"][-1]["finish_reason"] == "error"
    assert [(t["failure_reason"], t["reward"]) for t in after] == [(None, 1.0)] * 2
    assert min(t["started_at"] for t in after) < hit["ended_at"]  # they ran while the hit episode wound down


def _agents_running(run_id: str) -> int:
    """How many of the run's sandboxes have the codex CLI running in them."""
    n = 0
    for c in _left(run_id):
        if c.status != "running" or "grade" in c.labels.get("hrl.episode", ""):
            continue
        try:
            code, _ = c.exec_run(["pgrep", "-f", "codex exec"])
        except docker.errors.APIError:  # the container went away meanwhile
            continue
        n += code == 0
    return n


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_of_hrl_rollout_ends_each_started_episode_as_one_cancelled_trace(tiny_model, tmp_path, swe_image, how):
    """Ctrl-C (SIGINT to the process group) or `kill PID` (SIGTERM to hrl alone) while two agents wait on a slow model
    turn (a third episode still queued): `hrl rollout` exits 130, the trace file is valid JSONL with exactly one
    `cancelled` trace per started episode and none for the queued one, and no container of the run survives."""
    task = mini_task("docker")
    tasks, out, turns = tmp_path / "tasks.jsonl", tmp_path / "traces.jsonl", tmp_path / "turns.json"
    write_tasks([task], tasks)
    turns.write_text(json.dumps(SLOW))
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable, "-m", "hrl.cli", "rollout", "--agent", "codex", "--tasks", str(tasks), "--model", tiny_model,
        "--engine", "scripted", "--sandbox", "docker", "--out", str(out), "-n", "3", "--concurrency", "2",
        "--run-id", run_id, "-c", f"engine_options.script_file={turns}", "-c", "engine_options.token_delay_s=0.1",
    ]  # fmt: skip
    # its own process group, so the SIGINT goes to all of it, as a terminal's Ctrl-C does; for `kill PID`, started
    # the way a shell's `hrl ... &` starts it: with SIGINT ignored
    ignore = None if how == "ctrl-c" else (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=ignore
    )
    try:
        deadline = time.monotonic() + 120
        while _agents_running(run_id) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        assert proc.poll() is None, f"hrl rollout ended early: {proc.communicate()[1][-3000:]}"
        assert _agents_running(run_id) == 2, "the agents never started"
        t0 = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.terminate()
        _, stderr = proc.communicate(timeout=90)
        stop_s = time.monotonic() - t0
        assert proc.returncode == 130 and out.is_file(), stderr[-3000:]
        lines = out.read_text().splitlines()
        traces = list(read_traces(out))
        print(f"\n{how}: exit {proc.returncode} after {stop_s:.1f}s; {[t['failure_reason'] for t in traces]}")
        assert len(lines) == len(traces) == 2 and all(json.loads(line) for line in lines)
        keys = sorted(t["metadata"]["episode"] for t in traces)
        assert keys == [f"it0:{task.instance_id}#{k}" for k in (0, 1)]  # #2 never started
        assert [t["failure_reason"] for t in traces] == ["cancelled"] * 2
        assert all(t["metadata"]["run"] == run_id for t in traces)
        assert not _left(run_id), "containers left behind"
        assert f"run {run_id}" in stderr and "interrupted" in stderr
    finally:  # whatever failed above, leave neither the process nor its containers behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for c in _left(run_id):
            c.remove(force=True)
