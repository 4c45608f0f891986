"""An online run through the real proxy, embedded engine and trainer: clients with their own keys open sessions
over HTTP, end them, reward them on time, late or never, forget them, hang up mid-stream; the run trains what it
should, counts the rest, and a resumed run takes up the open sessions and the pending rewards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import hrl
from hrl.runners.online import OnlineConfig, OnlineSessions, add_key
from hrl.runners.rundir import RunDir
from hrl.runners.serving.stack import serving
from hrl.train.advantages import lone_advantages
from hrl.train.async_loop import AsyncConfig, train_async
from hrl.train.loop import LoopConfig
from hrl.train.online import ExternalProducer, TaskBaseline
from hrl.train.samples import build_samples
from hrl.train.trainer import TrainerConfig

CONTROL = "control-token-of-the-test-0123456789"
MSG = [{"role": "user", "content": "fix the bug"}]


class Client:
    """A fleet that is not hrl: HTTP and the OpenAI-compatible endpoint, nothing else."""

    def __init__(self, http: aiohttp.ClientSession, url: str, key: str) -> None:
        self.http, self.url, self.auth = http, url, {"Authorization": f"Bearer {key}"}

    async def post(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        async with self.http.post(self.url + path, json=body or {}, headers=self.auth) as r:
            return r.status, await r.json(content_type=None)

    async def get(self, path: str) -> int:
        async with self.http.get(self.url + path, headers=self.auth) as r:
            return r.status

    async def open(self, **body: Any) -> dict[str, Any]:
        status, out = await self.post("/sessions", body)
        assert status == 201, out
        assert out["base_url"] == f"{self.url}/s/{out['token']}/v1"
        return out

    async def chat(self, s: dict[str, Any], messages: list[dict[str, Any]] = MSG, call: str = "") -> str:
        body = {"messages": messages, "max_tokens": 8}
        headers = {"Authorization": f"Bearer hrl-{s['token']}"} | ({"x-hrl-call": call} if call else {})
        async with self.http.post(s["base_url"] + "/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            return str((await r.json())["choices"][0]["message"]["content"])

    async def hang_up(self, s: dict[str, Any]) -> None:
        """A streamed call the client leaves after its first tokens."""
        body = {"messages": MSG, "max_tokens": 400, "ignore_eos": True, "stream": True}
        async with self.http.post(s["base_url"] + "/chat/completions", json=body) as r:
            seen = 0
            async for line in r.content:
                seen += line.startswith(b"data: {")
                if seen >= 3:
                    break  # leaving the block drops the connection mid-stream


def score(trace: dict[str, Any], info: dict[str, Any]) -> tuple[float, dict[str, Any]] | None:
    """online.scorer: grades what the client's info holds an answer for; anything else waits for the client."""
    if "answer" not in info:
        return None
    return float(info["answer"] == "42"), {"graded": "answer"}


def _stack(model: str, run: RunDir, ocfg: OnlineConfig) -> Any:
    def clients(proxy: Any) -> OnlineSessions:
        return OnlineSessions(proxy, ocfg, run.path, max_staleness=1, scorer=score)

    return serving(model, engine_options={"dtype": "float32"}, control_token=CONTROL, clients=clients)


async def _train(model: str, run: RunDir, cfg: LoopConfig, acfg: AsyncConfig, ocfg: OnlineConfig, fleet: Any):
    async with _stack(model, run, ocfg) as stack, aiohttp.ClientSession() as http:
        producer = ExternalProducer(stack.clients, cfg, run)
        trainer = asyncio.create_task(train_async([], cfg, acfg, run, stack.proxy, None, producer=producer))  # type: ignore[arg-type]
        result = await fleet(http, stack)
        return await asyncio.wait_for(trainer, 120), result


def _sessions(run: RunDir) -> dict[str, dict[str, Any]]:
    return {t["session"]: t for t in run.all_traces()}


def test_online_run(tmp_path: Path, tiny_model: str) -> None:
    run = RunDir(tmp_path / "run")
    key_a, key_b = add_key(run.path / "client_keys.json", "a"), add_key(run.path / "client_keys.json", "b")
    cfg = LoopConfig(iterations=1, group_size=1, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    acfg = AsyncConfig(max_in_flight=1, batch_traces=4, max_staleness=1, max_buffered=8)
    ocfg = OnlineConfig(max_reward_delay_s=1.0, session_timeout_s=1.5, late_reward="drop")
    run.create({"train": cfg.model_dump()})
    tokens: dict[str, str] = {}

    async def fleet(http: aiohttp.ClientSession, stack: Any) -> dict[str, Any]:
        a, b = Client(http, stack.url, key_a), Client(http, stack.url, key_b)
        on_time, late, forgotten, cut = [await a.open(task_id=f"t{i}") for i in range(4)]
        other = await b.open(task_id="t8")
        # a client key reaches its own sessions only, and no control route
        assert await a.get("/sessions") == 403
        for path in ("/publish", "/pause", "/resume"):
            assert (await a.post(path, {"path": "x", "kind": "lora"}))[0] == 403
        assert (await a.post(f"/s/{other['token']}/end", {"reward": 1.0}))[0] == 404
        assert (await a.post(f"/s/{other['token']}/reward", {"reward": 1.0}))[0] == 404
        assert (await a.post(f"/s/{other['token']}/children", {"name": "x", "trainable": True}))[0] == 403
        status, said = await Client(http, stack.url, "hrlc-not-a-key").post("/sessions")
        assert status == 401 and "unknown client key" in str(said) and "control" not in str(said)  # a client's words
        assert not stack.proxy._held  # nothing paused
        for s in (on_time, late, forgotten, other):
            await a.chat(s)
        assert (await a.post("/sessions", {"parent": other["token"], "token": "x" * 20}))[0] == 400  # not ignored
        await a.chat(on_time, [{"role": "user", "content": "a title for this"}], call="side")  # recorded, not trained
        await a.hang_up(cut)
        # on time: ended without a reward, rewarded 0.3 s later
        assert (await a.post(f"/s/{on_time['token']}/end"))[1]["status"] == "waiting for reward"
        assert (await a.post(f"/s/{late['token']}/end"))[1]["status"] == "waiting for reward"
        await asyncio.sleep(0.3)
        said = (await a.post(f"/s/{on_time['token']}/reward", {"reward": 1.0, "info": {"tests": "pass"}}))[1]
        assert said["accepted"] and said["trained"]  # its group (of one) is whole: handed to training now
        assert (await a.post(f"/s/{on_time['token']}/reward", {"reward": 0.0}))[0] == 409  # its reward is in already
        assert (await a.post(f"/s/{cut['token']}/end", {"reward": 0.0}))[1]["status"] == "final"
        async with hrl.session({"task_id": "t5"}, url=stack.url, key=key_a) as s:  # the Python wrapper
            await s.openai().chat.completions.create(model=s.model, messages=MSG, max_tokens=4)
            s.reward(None, {"answer": "42"})  # no reward: the scorer's
        assert s.result["status"] == "final"
        tokens["scored"] = s.token
        await asyncio.sleep(2.5)  # past the delay of `late`, past the timeout of `forgotten`
        status, out = await a.post(f"/s/{late['token']}/reward", {"reward": 1.0})
        assert status == 200 and out == {"trace_id": out["trace_id"], "trained": False, "late": True}
        assert (await a.post(f"/s/{forgotten['token']}/end", {"reward": 1.0}))[0] == 410  # reaped
        assert (await b.post(f"/s/{other['token']}/end", {"reward": 0.5}))[0] == 410  # reaped too
        fresh = await b.open(task_id="t9", metadata={"pr": 7})
        await b.chat(fresh)
        assert (await b.post(f"/s/{fresh['token']}/end", {"reward": 0.5}))[0] == 200
        tokens.update(on_time=on_time["token"], late=late["token"], forgotten=forgotten["token"],
                      cut=cut["token"], other=fresh["token"])  # fmt: skip
        return {}

    history, _ = asyncio.run(_train(tiny_model, run, cfg, acfg, ocfg, fleet))
    (m,) = history
    assert m["online/delayed_rewards"] == 1 and m["online/late_rewards"] == 1
    assert m["online/expired"] == 1 and m["online/reaped"] == 2
    assert m["train/trained_traces"] == 4 and m["online/trained_on_time"] == 4 and m["online/scored"] == 1
    traces = _sessions(run)
    assert set(traces) == {tokens[k] for k in ("on_time", "cut", "other", "scored")}  # not the late, nor the reaped
    assert traces[tokens["scored"]]["reward"] == 1.0
    assert traces[tokens["scored"]]["reward_info"] == {"answer": "42", "graded": "answer", "scorer": True}
    assert traces[tokens["on_time"]]["reward"] == 1.0
    assert traces[tokens["on_time"]]["reward_info"] == {"tests": "pass"}
    main, side = traces[tokens["on_time"]]["calls"]
    assert "agent" not in main and side["agent"] == "side" and side["trainable"] is False
    assert [len(s.input_ids) for s in build_samples(traces[tokens["on_time"]])] == [  # the side call is no sample
        len(main["prompt_ids"]) + len(main["response_ids"])
    ]
    assert traces[tokens["other"]]["metadata"]["pr"] == 7
    assert traces[tokens["other"]]["metadata"]["online"]["client"] == "b"
    assert [c["finish_reason"] for c in traces[tokens["cut"]]["calls"]] == ["abort"]  # the hang-up: an aborted call
    reaped = [json.loads(line) for line in (run.path / "online" / "reaped.jsonl").read_text().splitlines()]
    assert tokens["forgotten"] in [t["session"] for t in reaped]


def test_resume_keeps_open_sessions_and_pending_rewards(tmp_path: Path, tiny_model: str) -> None:
    """A stop saves the open sessions; the resumed run serves them under the same tokens with their calls, and takes
    the rewards of traces that ended before the stop. A reward for a trace grown staler than async.max_staleness is
    late: with `late_reward: off_policy` it is trained anyway (the staleness filter would have dropped it), counted."""
    run = RunDir(tmp_path / "run")
    key = add_key(run.path / "client_keys.json", "a")
    trainer = TrainerConfig(model=tiny_model, lr=1e-2)
    acfg = AsyncConfig(max_in_flight=1, batch_traces=2, max_staleness=1, max_buffered=8)
    ocfg = OnlineConfig(max_reward_delay_s=300, late_reward="off_policy")
    run.create({})
    saved: dict[str, dict[str, Any]] = {}

    async def before(http: aiohttp.ClientSession, stack: Any) -> None:
        a = Client(http, stack.url, key)
        opened = [await a.open(task_id=f"t{i}") for i in range(5)]
        saved["open"], saved["pending"], saved["old"] = opened[:3]
        for s in opened:
            s["reply"] = await a.chat(s)
        assert (await a.post(f"/s/{saved['pending']['token']}/end"))[1]["status"] == "waiting for reward"
        for s, r in zip(opened[3:], (1.0, 0.0), strict=True):  # a lone trace's baseline is the batch's: two of them
            assert (await a.post(f"/s/{s['token']}/end", {"reward": r}))[1]["status"] == "final"

    history, _ = asyncio.run(_train(tiny_model, run, LoopConfig(iterations=1, group_size=1, trainer=trainer),
                                    acfg, ocfg, before))  # fmt: skip
    assert [m["version"] for m in history] == [1]

    async def after(http: aiohttp.ClientSession, stack: Any) -> None:
        a = Client(http, stack.url, key)
        here = {k: {**s, "base_url": f"{stack.url}/s/{s['token']}/v1"} for k, s in saved.items()}
        reply = {"role": "assistant", "content": saved["open"]["reply"]}  # the same token goes on, its call kept
        await a.chat(here["open"], [*MSG, reply, {"role": "user", "content": "go on"}])
        assert (await a.post(f"/s/{saved['open']['token']}/end", {"reward": 0.0}))[0] == 200
        assert (await a.post(f"/s/{saved['pending']['token']}/reward", {"reward": 1.0}))[1]["trained"]
        # step 1 trained and published: `old` (sampled by v0) is now stale
        while stack.proxy.engine.version < 2:  # noqa: ASYNC110 (the engine has no event for a publish)
            await asyncio.sleep(0.1)
        assert (await a.post(f"/s/{saved['old']['token']}/end"))[0] == 200
        status, out = await a.post(f"/s/{saved['old']['token']}/reward", {"reward": 1.0})
        assert status == 200 and out["late"] and out["trained"]
        fresh = await a.open(task_id="t9")
        await a.chat(fresh)
        assert (await a.post(f"/s/{fresh['token']}/end", {"reward": 0.0}))[0] == 200

    cfg = LoopConfig(iterations=3, group_size=1, trainer=trainer)
    history, _ = asyncio.run(_train(tiny_model, run, cfg, acfg, ocfg, after))
    assert [m["step"] for m in history] == [1, 2]
    assert history[0]["online/trained_on_time"] == 2 and history[0]["async/dropped_stale"] == 0
    assert history[1]["online/trained_off_policy"] == 1 and history[1]["online/late_rewards"] == 1
    assert history[1]["async/dropped_stale"] == 0 and history[1]["train/trained_traces"] == 2
    traces = _sessions(run)
    opened = traces[saved["open"]["token"]]
    assert len(opened["calls"]) == 2 and opened["calls"][1]["parent"] == opened["calls"][0]["call_id"]
    assert {v for c in opened["calls"] for _, v in c["versions"]} == {0, 1}  # before the stop, and after
    assert traces[saved["pending"]["token"]]["reward"] == 1.0
    assert traces[saved["old"]["token"]]["metadata"]["online"]["off_policy"] is True


def test_lone_traces_take_the_batch_or_their_tasks_baseline() -> None:
    """Hand-computed: a group of two gets GRPO within itself; lone traces take their task's running mean once it was
    seen `min_seen` times in earlier steps, else the lone traces' batch baseline (r − mean) / std."""
    running = TaskBaseline(min_seen=2)
    running.observe([{"task_id": "x", "reward": 1.0}, {"task_id": "x", "reward": 0.0}])  # mean 0.5, seen twice
    running.observe([{"task_id": "y", "reward": 1.0}])  # seen once: no baseline of its own yet
    traces = [{"trace_id": "g1", "task_id": "y"}, {"trace_id": "g2", "task_id": "y"},
              {"trace_id": "x1", "task_id": "x"}, {"trace_id": "y1", "task_id": "y"}, {"trace_id": "z1"}]  # fmt: skip
    rewards = {"g1": 1.0, "g2": 0.0, "x1": 1.0, "y1": 1.0, "z1": 0.0}
    groups = {"g1": "G", "g2": "G", "x1": "x1", "y1": "y1", "z1": "z1"}
    baselines = running.of(traces)
    assert baselines == {"x1": 0.5}
    adv, metrics = lone_advantages(rewards, groups, "grpo", baselines)
    assert adv["g1"] == pytest.approx(1.0, abs=1e-5) and adv["g2"] == pytest.approx(-1.0, abs=1e-5)
    assert adv["x1"] == 0.5  # r − its task's mean
    # y1 and z1 by the lone traces' batch baseline: rewards 1, 1, 0 (x1, y1, z1), mean 2/3, std √2/3
    assert adv["y1"] == pytest.approx((1 - 2 / 3) / (2**0.5 / 3), abs=1e-5)
    assert adv["z1"] == pytest.approx((0 - 2 / 3) / (2**0.5 / 3), abs=1e-5)
    assert metrics["adv/lone_traces"] == 3 and metrics["adv/task_baselined"] == 1 and metrics["adv/groups"] == 4
