"""`--placement ray` on a two-node Ray cluster (simulated on this machine, sharing its Docker): engine replicas as
actors, a node agent and a proxy shard per node, traces written by the driver; the driver's publish fanned out to
every replica; an outsider on the network, with every credential it could have, driving no replica; and chaos — a
replica killed mid-episode, a node agent killed mid-episode — with every started episode ending as exactly one trace,
no container and (see the `ray_cluster` fixture) no Ray process left.

`placement.trainer: ray` on the same cluster (one module, so one cluster start: with `--dist loadfile` a module fixture
is started once per file): the trainer's two gloo ranks are Ray actors on two distinct nodes; a step equals the
single-process step to 1e-6; the checkpoint comes back to the driver through Ray (no folder shared with the ranks) and
`--resume` sends it back; a rank killed mid-run is an error naming its rank and node, not a hang; and `hrl train`
itself trains and publishes with its ranks on two nodes, the replicas serving the published version from checkpoints
shipped to their nodes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from hrl.config import PlacementConfig
from hrl.errors import HrlError, UsageError
from hrl.runners.engines.base import SamplingParams
from hrl.runners.placement import RunConfig
from hrl.runners.placement.ray import _replica_engine_options, ray_placement
from hrl.runners.rollouts.episodes import Episode, run_episodes
from hrl.runners.tasks.task import write_tasks
from hrl.runners.trace import read_traces
from hrl.train.trainer import Trainer, TrainerConfig
from tests.runners.proxy.test_agent_attacks import SCAN
from tests.runners.tasks.test_verifier import mini_task
from tests.train.test_distributed import _batch4, _weights

pytestmark = pytest.mark.timeout(600)

AGENT = """
async def run(task, session):
    client = session.openai()
    reply = await client.chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": task.problem_statement}], max_tokens=16)
    return 1.0 if reply.choices[0].message.content == "Done." else 0.0


def score(task, answer):  # the recipe's verifier: the reward (the agent's own is kept as agent_reward)
    return 1.0 if answer == "Done." else 0.0
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


def test_two_nodes_two_replicas_and_a_publish_fanned_out_from_the_driver(placed, loop, tmp_path):
    # the shards' own poll is far off (`placed`): only the publish barrier can tell them of the new version in time;
    # the verifier scores the agent's last reply
    tasks = [mini_task("local", instance_id=f"t{i}", problem_statement="say done").model_dump() for i in range(4)]
    out = tmp_path / "traces.jsonl"

    async def main() -> tuple[int, list[dict], list[dict], dict[str, Any]]:
        v0 = placed.publisher.control.version  # the placement is shared: other tests may have published before
        first = await run_episodes(placed.rollouts, [Episode(t, 0, 0) for t in tasks], out, 4)
        version = await placed.publisher.publish("unused", "lora")
        report = dict(placed.publisher.last_fanout, version=version)  # no sleep: every shard acknowledged
        second = await run_episodes(placed.rollouts, [Episode(t, 1, 0) for t in tasks], out, 4)
        return v0, first, second, report

    v0, first, second, report = loop.run_until_complete(main())
    written = list(read_traces(out))
    assert len(written) == 8 == len({t["metadata"]["episode"] for t in written})
    assert [t["reward"] for t in written] == [1.0] * 8, [(t["failure_reason"], t["metadata"]) for t in written][:2]
    assert {t["metadata"]["node"] for t in written} == {0, 1}  # both node agents ran episodes
    assert {t["env"]["replica"] for t in written} == {"r0", "r1"}  # sessions spread over both replicas
    assert report == {**report, "step": "publish", "acked": ["r0", "r1"], "failed": {}, "version": v0 + 1}
    assert report["shards"] == {"acked": [0, 1], "failed": {}}
    assert all(t["calls"][0]["versions"] == [[0, v0]] for t in first)
    assert all(t["calls"][0]["versions"] == [[0, v0 + 1]] for t in second)


IMAGE_AGENT = """
import base64


async def run(task, session):
    client = session.openai()
    png = base64.b64decode(task.problem_statement)  # each task's own image
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
    reply = await client.chat.completions.create(model=session.model, max_tokens=4, messages=[
        {"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}])
    return 1.0


def score(task, answer):
    return 1.0
"""


def test_images_of_episodes_on_other_nodes_are_kept_beside_the_drivers_traces(ray_cluster, tmp_path):
    """A vision model behind two replicas: the images each node's proxy shard took are fetched by the driver into
    media/ beside the traces (`keep_media`, as `hrl rollout` and `hrl train` ask), checked by sha256, so training can
    use them; without keep_media nothing is fetched."""
    import base64
    import hashlib
    import io

    from PIL import Image

    from hrl.train.media import unusable_images
    from hrl.train.tiny import build_tiny_vision_model

    model = str(build_tiny_vision_model(tmp_path / "vl", seed=0))
    (tmp_path / "agent.py").write_text(IMAGE_AGENT)
    cfg = _cfg(tmp_path, f"{tmp_path}/agent.py:run", "local")
    cfg["verifier"] = {"name": "python", "function": f"{tmp_path}/agent.py:score"}
    pngs = []
    for i in range(5):
        out = io.BytesIO()
        Image.new("RGB", (20 + 8 * i, 30), (40 * i, 90, 200)).save(out, "PNG")
        pngs.append(out.getvalue())
    tasks = [mini_task("local", instance_id=f"t{i}", problem_statement=base64.b64encode(b).decode()).model_dump()
             for i, b in enumerate(pngs)]  # fmt: skip
    out, media = tmp_path / "traces.jsonl", tmp_path / "media"

    async def main() -> None:
        async with ray_placement(RunConfig.model_validate(cfg), model, "scripted", 4) as placed:
            await run_episodes(placed.rollouts, [Episode(tasks[4], 0, 0)], tmp_path / "before.jsonl", 1)
            placed.publisher.keep_media(media)
            await run_episodes(placed.rollouts, [Episode(t, 0, 0) for t in tasks[:4]], out, 4)

    asyncio.run(main())
    written = list(read_traces(out))
    assert len(written) == 4, [t["failure_reason"] for t in written]
    assert {t["metadata"]["node"] for t in written} == {0, 1}
    assert sorted(p.name for p in media.iterdir()) == sorted(
        hashlib.sha256(b).hexdigest() for b in pngs[:4]
    )  # not the 5th
    for t in written:
        (m,) = t["calls"][0]["media"]
        assert (media / m["sha256"]).read_bytes() in pngs
        assert unusable_images(t, True, media) is None  # what the step checks before training on it


# The outsider: a plain Python process (no hrl, none of the run's secrets: its environment is PATH alone) that
# tries every route of every replica's engine_app with no credential, a guessed token and an agent's session key.
ATTACKER = r"""
import json, secrets, sys, urllib.error, urllib.request
job = json.load(sys.stdin)
routes = [("POST", "/generate", {"request_id": "outsider", "prompt_ids": [1, 2, 3], "params": {"max_tokens": 8}}),
          ("POST", "/pause", {}), ("POST", "/resume", {}),
          ("POST", "/publish", {"path": "/tmp/not-a-checkpoint", "kind": "full", "version": 99}),
          ("GET", "/health", None), ("GET", "/metrics", None)]
routes += [("POST", "/abort", {"request_id": rid}) for rid in job["held"]]
creds = {"none": {}, "guessed": {"Authorization": "Bearer " + secrets.token_urlsafe(32)},
         "agent key": {"Authorization": "Bearer " + job["agent_key"]}, "agent api key": {"X-Api-Key": job["agent_key"]}}
codes = {}
for url in job["urls"]:
    for name, headers in creds.items():
        for method, path, body in routes:
            data = None if body is None else json.dumps(body).encode()
            req = urllib.request.Request(url + path, data=data, method=method,
                                         headers={**headers, "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code
            codes[f"{url} {method} {path} {json.dumps(body)} ({name})"] = code
print(json.dumps(codes))
"""

LONG = " ".join(["word"] * 40)  # the held generations' turn: 40 tokens, 0.05 s apart once resumed


def test_an_outsider_cannot_drive_any_replica(placed, loop, tiny_model, tmp_path):
    """Replicas listen on the node address, so anyone on the cluster network reaches them: with no credential, a
    guessed token or an agent's session key, every route of every replica is a 401; no version, pause or abort
    changes (a generation each replica holds, paused, plays out whole); the run goes on with the run's secret."""
    from transformers import AutoTokenizer

    # the agent hands its session key out beside its own reward (`tell_key`); the engine's second turn is LONG
    tasks = [mini_task("local", instance_id=f"t{i}", problem_statement="say done").model_dump() | {"tell_key": True}
             for i in range(2)]  # fmt: skip
    out = tmp_path / "traces.jsonl"
    marker = AutoTokenizer.from_pretrained(tiny_model).encode("<|im_start|>assistant", add_special_tokens=False)
    second_turn = marker * 2  # one completed assistant turn: the engine plays its second, LONG
    env = {"PATH": os.environ["PATH"]}

    def attack(urls: list[str], held: list[str], agent_key: str) -> dict[str, int]:
        job = json.dumps({"urls": urls, "held": held, "agent_key": agent_key})
        r = subprocess.run([sys.executable, "-I", "-c", ATTACKER], input=job, env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    async def main() -> dict[str, Any]:
        control = placed.publisher.control  # the driver's own clients: they hold the run's secret
        v0 = control.version  # the placement is shared: other tests may have published before
        first = await run_episodes(placed.rollouts, [Episode(t, 0, 0) for t in tasks], out, 2)
        agent_key = next(t["metadata"]["agent_reward_info"]["session_key"] for t in first)
        engines = {n: r.engine for n, r in control.replicas.items()}

        async def hold(name: str) -> list[Any]:
            params = SamplingParams(max_tokens=len(LONG))
            return [d async for d in engines[name].generate(f"held-{name}", second_turn, params)]

        await placed.publisher.pause()  # with the secret: a generation sent now waits in its engine, held
        try:
            held = {n: asyncio.create_task(hold(n)) for n in engines}
            codes = await asyncio.to_thread(attack, list(placed.urls.values()), [f"held-{n}" for n in engines],
                                            agent_key)  # fmt: skip
            versions = {n: (await e._state())["version"] for n, e in engines.items()}
            pending = [n for n, t in held.items() if t.done()]
        finally:
            await placed.publisher.resume()  # whatever failed: the tests after find the placement serving
        played = {n: await t for n, t in held.items()}
        second = await run_episodes(placed.rollouts, [Episode(t, 1, 0) for t in tasks], out, 2)
        version = await placed.publisher.publish("unused", "lora")
        fanout = dict(placed.publisher.last_fanout)
        return {"codes": codes, "versions": versions, "pending": pending, "played": played, "first": first,
                "second": second, "version": version, "fanout": fanout, "agent_key": agent_key, "v0": v0}  # fmt: skip

    got = loop.run_until_complete(main())
    codes = got["codes"]
    print(f"\nattack: {len(codes)} requests, statuses {sorted(set(codes.values()))}")
    assert got["agent_key"].startswith("hrl-")
    assert len(codes) == 2 * 4 * (6 + 2)  # replicas × credentials × (routes + an abort per held generation)
    assert set(codes.values()) == {401}, {k: v for k, v in codes.items() if v != 401}
    assert got["versions"] == {"r0": got["v0"], "r1": got["v0"]}  # no publish
    assert got["pending"] == []  # no abort ended a held generation, no resume released it
    for name, deltas in got["played"].items():  # played out whole after the secret's resume: never aborted
        assert deltas[-1].finish_reason == "stop", (name, deltas[-1])
        assert sum(len(d.token_ids) for d in deltas) >= 40
    run = got["first"] + got["second"]
    assert [t["reward"] for t in run] == [1.0] * 4, [(t["failure_reason"], t["metadata"].get("error")) for t in run]
    assert got["version"] == got["v0"] + 1 and got["fanout"]["acked"] == ["r0", "r1"]


def test_a_replicas_vllm_server_stays_on_loopback():
    """Under Ray only the replica's authenticated server crosses nodes; the vLLM server it drives listens on its
    node's loopback, and a recipe that asks for another address is refused."""
    assert _replica_engine_options("vllm", {})["host"] == "127.0.0.1"
    assert _replica_engine_options("vllm", {"host": "::1"})["host"] == "::1"
    for host in ("0.0.0.0", "10.0.0.5", "::", "gpu-node-3"):
        with pytest.raises(UsageError, match="loopback"):
            _replica_engine_options("vllm", {"host": host})
    assert _replica_engine_options("vllm", {"url": "http://10.0.0.5:8000"}) == {"url": "http://10.0.0.5:8000"}
    assert _replica_engine_options("scripted", {"turns": ["Done."]}) == {"turns": ["Done."]}


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.agents
def test_chaos_a_replica_and_a_node_agent_killed_mid_episode(ray_cluster, tiny_model, tmp_path, swe_image):
    """Codex in docker on both nodes; mid-episode one replica is killed (the shards fail over) and then node 1's
    agent (its episodes end as internal_error; its containers are removed on its node)."""
    import docker
    import ray

    from tests.runners.rollouts.test_rollout import FIX

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
           "--out", str(out), "--placement", "ray", "-c", "placement.engine_replicas=2",
           "-c", "placement.episodes_per_node=1"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    written = list(read_traces(out))
    assert len(written) == 4
    assert [t["reward"] for t in written] == [1.0] * 4
    assert {t["env"]["replica"] for t in written} <= {"r0", "r1"}
    assert "starting 2 scripted engine replica(s) on Ray" in r.stderr
    assert "episodes at once: 2 (2 node(s) × 1 = 2 slots, the run's concurrency 4;" in r.stderr  # said, not silent
    assert "done: 4 traces" in r.stderr


@pytest.mark.slow
def test_hrl_train_placement_ray_publishes_each_step_to_every_replica(ray_cluster, tiny_model, tmp_path):
    """The trainer in the driver, rollouts on the node agents: step 1's tokens come from the version step 0 published."""
    # a step whose groups all score alike trains on nothing and publishes nothing: the samples of a task take turns
    # (a counter file per task on this host, shared by both simulated nodes) answering whole or cut short; in process,
    # since a closed agent cannot write to this host
    (tmp_path / "agent.py").write_text(
        AGENT.replace("max_tokens=16)", "max_tokens=16 if _turn(task) % 2 else 1)")
        + f"\n\ndef _turn(task):\n    import itertools, os\n    for n in itertools.count():\n        try:\n"
        f"            os.close(os.open({str(tmp_path)!r} + f'/turn-{{task.instance_id}}-{{n}}', os.O_CREAT | os.O_EXCL))\n"
        "            return n\n        except FileExistsError:\n            pass\n"
    )  # fmt: skip
    write_tasks([mini_task("local", instance_id=f"t{i}", problem_statement="say done") for i in range(2)],
                tmp_path / "tasks.jsonl")  # fmt: skip
    recipe = {"model": tiny_model, "engine": "scripted", "engine_options": {"turns": ["Done."]}, "tasks": "tasks.jsonl",
              "rollout": {"agent": "agent.py:run", "mode": "inprocess"}, "verifier": {"name": "python", "function": "agent.py:score"},
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


# What an agent placed by Ray runs in its sandbox (a white-box agent in subprocess mode: as a local sandbox's
# command, in its own namespaces): every port the host listens on (the replicas' engine_app on the node address,
# Ray's own ports), every unix socket, the control-token file, the environment, and the control routes through its
# relay. It reports through what it says with its own reward (kept aside in the trace, never trained on).
SCAN_AGENT = (
    SCAN
    + r"""
import json, os, urllib.request, urllib.error


def _call(url, method, path, headers):
    req = urllib.request.Request(url + path, data=b"{}" if method == "POST" else None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return repr(e)


def run(task, session):
    answered, token_file = scan_everything(json.loads(task.scan))
    url, mine = os.environ["HRL_URL"], {"Authorization": "Bearer " + session.api_key}
    routes = {f"{m} {p}/{who}": _call(url, m, p, h) for m, p in (("GET", "/sessions"), ("POST", "/sessions"),
              ("POST", "/publish"), ("POST", "/pause"), ("POST", f"/s/{session.token}/end"))
              for who, h in (("anon", {}), ("as_agent", mine))}
    from openai import OpenAI  # OPENAI_BASE_URL and OPENAI_API_KEY point at the session, through the relay

    OpenAI().chat.completions.create(model=session.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    report = {"answered": answered, "token_file": token_file, "routes": routes, "env": sorted(os.environ)}
    session.reward(1.0, {"report": json.dumps(report)})


def score(task, answer):
    return 0.5
"""
)

# The agent of the tests that share one placement (`placed`), doing what each task asks by its fields: the sandbox
# scan above (`scan`), else a reply, scored by the verifier on it (`tell_key`: the session key handed out beside the
# agent's own reward, for the outsider). A sync `run`: the scan blocks, as SCAN_AGENT's; a reply is awaited.
PLACED_AGENT = (
    SCAN_AGENT.replace("def run(task, session):", "def _scan(task, session):").replace(
        "def score(task, answer):\n    return 0.5\n", ""
    )
    + r"""
async def _reply(task, session):
    client = session.openai()
    reply = await client.chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": task.problem_statement}], max_tokens=16)
    got = 1.0 if reply.choices[0].message.content == "Done." else 0.0
    if not getattr(task, "tell_key", False):
        return got
    session.reward(got, {"session_key": session.api_key})


def run(task, session):
    return _scan(task, session) if getattr(task, "scan", None) else _reply(task, session)


def score(task, answer):  # the recipe's verifier: the reward (the agent's own is kept as agent_reward)
    if getattr(task, "scan", None):
        return 0.5  # told apart from the agent's own 1.0
    return 1.0 if answer == "Done." else 0.0
"""
)


@pytest.fixture(scope="module")
def placed(ray_cluster: Any, tiny_model: str, loop: asyncio.AbstractEventLoop, tmp_path_factory: Any) -> Any:
    """One placement for the tests that need the same one (two replicas of the tiny model's scripted engine, "Done."
    then LONG, 0.05 s a token; PLACED_AGENT in subprocess mode on both node agents; the shards' own poll far off, so
    only a publish's barrier tells them of a new version), on the module's event loop: a placement is four actors,
    each importing torch, transformers and hrl (~6 CPU-seconds apiece, ~30 s on 2 loaded cores). Each test runs its
    own episodes and reads versions relative to where it found them."""
    folder = tmp_path_factory.mktemp("placed")
    (folder / "agent.py").write_text(PLACED_AGENT)
    cfg = _cfg(folder, f"{folder}/agent.py:run", "local", routing={"poll_s": 60})
    cfg["rollout"]["mode"] = "subprocess"
    cfg["verifier"] = {"name": "python", "function": f"{folder}/agent.py:score"}
    cfg["engine_options"] = {"turns": ["Done.", LONG], "token_delay_s": 0.05}
    started = ray_placement(RunConfig.model_validate(cfg), tiny_model, "scripted", 4)
    placement = loop.run_until_complete(started.__aenter__())
    try:
        yield placement
    finally:
        loop.run_until_complete(started.__aexit__(None, None, None))


def test_an_agent_placed_by_ray_reaches_only_its_proxy(placed, loop, tmp_path):
    """The sandbox attack under `--placement ray` on the two-node cluster: the agents, on both node agents, reach
    their shard's proxy data plane through the relay and nothing else: not the replicas' engine_app ports on the
    node address, not Ray's ports, not another socket, not a control route; the state folder is empty to them."""
    from tests.runners.proxy.test_agent_attacks import _host_addresses, _listening_ports, _unix_sockets

    state = Path.home() / ".local" / "state" / "hrl"  # the node agents' own: their environment is Ray's
    planted = not (state / "control-token").exists()
    if planted:
        state.mkdir(parents=True, exist_ok=True)
        (state / "control-token").write_text("a-control-token-no-agent-may-read")
    out = tmp_path / "traces.jsonl"

    async def main() -> tuple[list[int], list[dict]]:
        ports = sorted({*_listening_ports(), 8000})  # the replicas' engine_app and Ray's ports among them
        scan = json.dumps({"hosts": _host_addresses(), "ports": ports, "unix": _unix_sockets(),
                           "token_file": str(state / "control-token")})  # fmt: skip
        tasks = [mini_task("local", instance_id=f"t{i}", problem_statement="hi").model_dump() | {"scan": scan}
                 for i in range(4)]  # fmt: skip
        await run_episodes(placed.rollouts, [Episode(t, 0, 0) for t in tasks], out, 4)
        return ports, list(read_traces(out))

    try:
        ports, written = loop.run_until_complete(main())
    finally:
        if planted:
            (state / "control-token").unlink(missing_ok=True)
    assert len(written) == 4 and {t["metadata"]["node"] for t in written} == {0, 1}, [
        (t["failure_reason"], t["metadata"].get("error")) for t in written
    ]
    for t in written:
        report = json.loads(t["metadata"]["agent_reward_info"]["report"])
        tcp = [a for a in report["answered"] if not a.startswith("/") and not a.startswith("@")]
        unix = [a for a in report["answered"] if a.startswith(("/", "@"))]
        assert tcp == ["127.0.0.1:8000"], report["answered"]  # the relay, inside its own namespace
        assert all(Path(u).name == "proxy.sock" and Path(u).parent.name.startswith("hrl-proxy-") for u in unix), unix
        assert report["token_file"] in ("FileNotFoundError", "PermissionError"), report["token_file"]
        assert all(code in (401, 403, 404) for code in report["routes"].values()), report["routes"]
        assert t["reward"] == 0.5 and len(t["calls"]) == 1  # the verifier's reward; its own call went through
    print(f"\nray: {len(ports)} ports tried from {len(written)} agents on both nodes; each reached only its relay")


# ---- `placement.trainer: ray`: the trainer's ranks as Ray actors, on the cluster above ----------------------------


@pytest.mark.slow
def test_two_ranks_on_two_nodes_take_the_single_process_step_and_a_rank_that_dies_is_named(
    ray_cluster, tiny_model, tmp_path
):
    """A step of two gloo ranks on two nodes equals the single-process step; the checkpoint comes back through Ray and
    `--resume` sends it to a fresh group, whose next step matches too. Then a rank of that group is killed: the next
    step is an error naming the rank and its node, not a hang, and the group's placement group is freed (one group
    less to start than a test of its own: each rank imports torch and builds the model)."""
    import ray

    from hrl.train.ray_group import RayTrainerGroup

    cfg = TrainerConfig(model=tiny_model, mode="lora", lr=3e-5, micro_batch=1, device="cpu", nproc=2)
    one = Trainer(cfg.model_copy(update={"nproc": 1}))
    single = one.step(_batch4())
    one.save(tmp_path / "single")

    group = RayTrainerGroup(cfg, PlacementConfig(kind="ray", trainer="ray"))
    try:
        assert len({r["node_id"] for r in group.ranks}) == 2, group.ranks  # one rank per node
        assert [r["rank"] for r in group.ranks] == [0, 1]
        assert all(r["devices"] == ["cpu"] for r in group.ranks)
        sharded = group.step(_batch4())
        torch.testing.assert_close(torch.tensor(sharded["train/loss"]), torch.tensor(single["train/loss"]),
                                   rtol=0, atol=1e-6)  # fmt: skip
        ckpt = group.save(tmp_path / "ckpt")
        names = sorted(p.name for p in ckpt.iterdir())
        assert {"adapter_config.json", "adapter_model.safetensors", "optimizer-rank0-of-2.pt",
                "optimizer-rank1-of-2.pt"} <= set(names), names  # fmt: skip
        a, b = _weights(tmp_path / "single"), _weights(ckpt)
        assert a.keys() == b.keys() and a
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)
        with pytest.raises(UsageError, match="ipc"):
            group.named_weights()
        assert group.lr_info()["train/lr"] == pytest.approx(3e-5)
    finally:
        group.close()

    resumed = RayTrainerGroup(cfg, PlacementConfig(kind="ray", trainer="ray"))  # --resume: from the driver's files
    try:
        resumed.load(tmp_path / "ckpt")
        again, ref = resumed.step(_batch4()), one.step(_batch4())
        torch.testing.assert_close(torch.tensor(again["train/loss"]), torch.tensor(ref["train/loss"]),
                                   rtol=0, atol=1e-6)  # fmt: skip
        resumed.save(tmp_path / "ckpt2")
        one.save(tmp_path / "single2")
        a, b = _weights(tmp_path / "single2"), _weights(tmp_path / "ckpt2")
        for k in a:  # the optimizer's moments came back too: the second step matches as well
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)

        # a rank that dies: the step is an error naming it and its node, with the way on (--resume)
        node = resumed.ranks[1]["node_id"][:12]
        ray.kill(resumed.actors[1])
        with pytest.raises(HrlError, match=rf"trainer rank 1 on node {node}.* died during step") as e:
            resumed.step(_batch4())
        assert "--resume" in (e.value.hint or "")
    finally:
        resumed.close()
    assert not ray.util.placement_group_table(resumed.group) or (
        ray.util.placement_group_table(resumed.group)["state"] == "REMOVED"
    )


@pytest.mark.slow
def test_hrl_train_with_its_ranks_on_two_nodes_trains_and_publishes(ray_cluster, tmp_path):
    """The CLI, joined to the two-node cluster: one iteration, the two ranks on distinct nodes (placement.json), the
    checkpoint shipped to each replica's node and served there at the new version."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hrl.cli", "train", "--recipe", "demo", "--iterations", "1", "--placement", "ray",
           "--run-dir", str(run), "-c", f"placement.address={ray_cluster.address}", "-c", "placement.trainer=ray",
           "-c", "trainer.nproc=2", "-c", "placement.engine_replicas=2", "-c", "placement.weights=ship",
           "-c", "train.tasks_per_iteration=1", "-c", "train.group_size=2", "-c", "eval_tasks=",
           # a step that always trains, whatever the two episodes score: the dense signal of a teacher (the model
           # itself: near zero, never all zero), so the step, its checkpoint and the publish always happen
           "-c", "train.advantage=distill", "-c", "distill.teacher=hrl:tiny-agent"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    placed = json.loads((run / "placement.json").read_text())
    assert placed["trainer"] == "ray" and placed["weights"] == "ship"
    assert len({r["node_id"] for r in placed["trainer_ranks"]}) == 2, placed
    assert len(placed["replicas"]) == 2 and all(r["url"] for r in placed["replicas"])
    state = json.loads((run / "state.json").read_text())
    assert state["version"] == 1 and Path(state["checkpoint"]).is_dir()
    assert (Path(state["checkpoint"]) / "optimizer-rank1-of-2.pt").is_file()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1]["version"] == 1 and not steps[-1].get("train/empty"), steps[-1]
    assert steps[-1]["distill/tokens"] > 0
    # the checkpoint reached both replicas' nodes through Ray and both serve version 1
    assert steps[-1]["publish/replicas_acked"] == 2 and steps[-1]["publish/replicas_fenced"] == 0
    assert steps[-1]["publish/shipped_bytes"] > 0 and steps[-1]["publish/ship_failed"] == 0
