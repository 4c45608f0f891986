"""`--placement ray` on a two-node Ray cluster (simulated on this machine, sharing its Docker): engine replicas as
actors, a node agent and a proxy shard per node, traces written by the driver; the driver's publish fanned out to
every replica; and chaos — a replica killed mid-episode, a node agent killed mid-episode — with every started
episode ending as exactly one trace, no container and (see the `ray_cluster` fixture) no Ray process left."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.episodes import Episode, run_episodes
from hrl.runners.placement import RunConfig
from hrl.runners.placement.ray import ray_placement
from hrl.runners.tasks.task import write_tasks
from hrl.runners.trace import read_traces
from tests.runners.tasks.test_verifier import mini_task

pytestmark = pytest.mark.timeout(600)

AGENT = """
async def run(task, session):
    client = session.openai()
    reply = await client.chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": task.problem_statement}], max_tokens=16)
    return 1.0 if reply.choices[0].message.content == "Done." else 0.0


def score(task, answer):
    return 0.0
"""


def _cfg(tmp_path: Path, agent: str, sandbox: str, **placement: Any) -> dict[str, Any]:
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    return {
        "rollout": {"agent": agent, "sandbox": sandbox, "run_id": run_id, "time_budget_s": 120},
        "verifier": {"image": "hrl/swe-py:bookworm"},
        "engine_options": {"turns": ["Done."]},
        "placement": {"kind": "ray", "engine_replicas": 2, "episodes_per_node": 2, "routing": {"poll_s": 0.2},
                      **placement},
    }  # fmt: skip


def test_two_nodes_two_replicas_and_a_publish_fanned_out_from_the_driver(ray_cluster, tiny_model, tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    # the shards' own poll is far off: only the publish barrier can tell them of version 1 in time
    cfg = _cfg(tmp_path, f"{tmp_path}/agent.py:run", "local", routing={"poll_s": 60})
    cfg["verifier"] = {"name": "python", "function": f"{tmp_path}/agent.py:score"}  # the agent's return is the reward
    tasks = [mini_task("local", instance_id=f"t{i}", problem_statement="say done").model_dump() for i in range(4)]
    out = tmp_path / "traces.jsonl"

    async def main() -> tuple[list[dict], list[dict], dict[str, Any]]:
        async with ray_placement(RunConfig.model_validate(cfg), tiny_model, "scripted", 4) as placed:
            first = await run_episodes(placed.rollouts, [Episode(t, 0, 0) for t in tasks], out, 4)
            version = await placed.publisher.publish("unused", "lora")
            report = dict(placed.publisher.last_fanout, version=version)  # no sleep: every shard acknowledged
            second = await run_episodes(placed.rollouts, [Episode(t, 1, 0) for t in tasks], out, 4)
        return first, second, report

    first, second, report = asyncio.run(main())
    written = list(read_traces(out))
    assert len(written) == 8 == len({t["metadata"]["episode"] for t in written})
    assert [t["reward"] for t in written] == [1.0] * 8, [(t["failure_reason"], t["metadata"]) for t in written][:2]
    assert {t["metadata"]["node"] for t in written} == {0, 1}  # both node agents ran episodes
    assert {t["env"]["replica"] for t in written} == {"r0", "r1"}  # sessions spread over both replicas
    assert report == {**report, "step": "publish", "acked": ["r0", "r1"], "failed": {}, "version": 1}
    assert report["shards"] == {"acked": [0, 1], "failed": {}}
    assert all(t["calls"][0]["versions"] == [[0, 0]] for t in first)
    assert all(t["calls"][0]["versions"] == [[0, 1]] for t in second)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.agents
def test_chaos_a_replica_and_a_node_agent_killed_mid_episode(ray_cluster, tiny_model, tmp_path, swe_image):
    """Codex in docker on both nodes; mid-episode one replica is killed (the shards fail over) and then node 1's
    agent (its episodes end as internal_error; its containers are removed on its node)."""
    import docker
    import ray

    from tests.runners.test_rollout import FIX

    cfg = _cfg(tmp_path, "codex", "docker")
    cfg["engine_options"] = {"turns": FIX, "token_delay_s": 0.1}  # the tool-call turn streams for ~4 s
    run_id = cfg["rollout"]["run_id"]
    out = tmp_path / "traces.jsonl"
    task = mini_task("docker").model_dump()
    episodes = [Episode(task, k, 0) for k in range(4)]
    api = docker.from_env()

    def running(node: int) -> int:
        label = f"hrl.run={run_id}.n{node}"
        return len(api.containers.list(filters={"label": label, "status": "running"}, ignore_removed=True))

    async def main() -> dict[str, Any]:
        async with ray_placement(RunConfig.model_validate(cfg), tiny_model, "scripted", 4) as placed:
            job = asyncio.create_task(run_episodes(placed.rollouts, episodes, out, 4))
            for _ in range(1200):  # both nodes have episodes in their sandboxes
                if (running(0) and running(1)) or job.done():
                    break
                await asyncio.sleep(0.1)
            victim = None
            for _ in range(600):  # a generation streaming on node 0's shard: kill the replica serving it
                state = await placed.rollouts.nodes[0].actor.describe.remote()
                victim = next((r["name"] for r in state if r["inflight"]), None)
                if victim or job.done():
                    break
                await asyncio.sleep(0.1)
            assert victim is not None, "no generation reached a replica"
            ray.kill(placed.replicas[victim])
            await asyncio.sleep(1)
            ray.kill(placed.rollouts.nodes[1].actor)
            traces = await job
            return {"traces": traces, "lost": dict(placed.rollouts.lost_nodes), "victim": victim}

    t0 = time.monotonic()
    got = asyncio.run(main())
    written = list(read_traces(out))
    left = api.containers.list(all=True, filters={"label": "hrl=1"}, ignore_removed=True)
    left = [c for c in left if c.labels.get("hrl.run", "").startswith(run_id)]
    by_node: dict[int, list[str | None]] = {0: [], 1: []}
    for t in written:
        by_node[t["metadata"]["node"]].append(t["failure_reason"])
    switches = sum(len(t.get("replica_switches", [])) for t in written)
    figures = {"started": len(episodes), "traces": len(written), "containers_left": len(left), "switches": switches,
               "killed_replica": got["victim"],
               "by_node": by_node, "seconds": round(time.monotonic() - t0)}  # fmt: skip
    print("\nchaos: " + json.dumps(figures))
    assert len(written) == len(got["traces"]) == 4 == len({t["metadata"]["episode"] for t in written})
    assert not left, "containers left behind"
    assert list(got["lost"]) == [1]
    assert by_node[1] and all(r == "internal_error" for r in by_node[1])
    assert all("node agent on node 1" in t["metadata"]["error"] for t in written if t["metadata"]["node"] == 1)
    survivors = [t for t in written if t["metadata"]["node"] == 0]
    assert survivors
    assert all(t["failure_reason"] is None and t["reward"] == 1.0 for t in survivors), [
        (t["failure_reason"], t["metadata"].get("error")) for t in survivors
    ]
    live = "r1" if got["victim"] == "r0" else "r0"
    assert all(t["calls"][-1]["replica"] == live for t in survivors)  # after the kill, only the other one serves
    moved = [s for t in survivors for s in t.get("replica_switches", [])]
    assert moved, "the generation on the killed replica was not continued on the other"
    assert all((s["from"], s["to"]) == (got["victim"], live) for s in moved)


@pytest.mark.slow
def test_hrl_rollout_placement_ray_on_an_existing_cluster(ray_cluster, tiny_model, tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    write_tasks([mini_task("local", instance_id=f"t{i}", problem_statement="say done") for i in range(2)],
                tmp_path / "tasks.jsonl")  # fmt: skip
    recipe = {"model": tiny_model, "engine": "scripted", "engine_options": {"turns": ["Done."]}, "tasks": "tasks.jsonl",
              "rollout": {"agent": "agent.py:run"}, "verifier": {"name": "python", "function": "agent.py:score"},
              "placement": {"address": ray_cluster.address}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(json.dumps(recipe))
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "hrl.cli", "rollout", "--recipe", str(tmp_path / "recipe.yaml"), "-n", "2",
           "--out", str(out), "--placement", "ray", "-c", "placement.engine_replicas=2"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    written = list(read_traces(out))
    assert len(written) == 4
    assert [t["reward"] for t in written] == [1.0] * 4
    assert {t["env"]["replica"] for t in written} <= {"r0", "r1"}
    assert "starting 2 scripted engine replica(s) on Ray" in r.stderr
    assert "done: 4 traces" in r.stderr


@pytest.mark.slow
def test_hrl_train_placement_ray_publishes_each_step_to_every_replica(ray_cluster, tiny_model, tmp_path):
    """The trainer in the driver, rollouts on the node agents: step 1's tokens come from the version step 0 published."""
    (tmp_path / "agent.py").write_text(AGENT)
    write_tasks([mini_task("local", instance_id=f"t{i}", problem_statement="say done") for i in range(2)],
                tmp_path / "tasks.jsonl")  # fmt: skip
    recipe = {"model": tiny_model, "engine": "scripted", "engine_options": {"turns": ["Done."]}, "tasks": "tasks.jsonl",
              "rollout": {"agent": "agent.py:run"}, "verifier": {"name": "python", "function": "agent.py:score"},
              "train": {"iterations": 2, "tasks_per_iteration": 2, "group_size": 2, "concurrency": 4},
              "trainer": {"mode": "lora", "lora_rank": 4, "lora_alpha": 8},
              "placement": {"address": ray_cluster.address, "engine_replicas": 2}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(json.dumps(recipe))
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hrl.cli", "train", "--recipe", str(tmp_path / "recipe.yaml"), "--run-dir", str(run),
           "--placement", "ray"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in steps] == [1, 2]
    second = list(read_traces(run / "traces" / "iter-0001.jsonl"))
    assert len(second) == 4
    assert all(t["calls"][0]["versions"] == [[0, 1]] for t in second)
