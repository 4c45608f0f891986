"""Several engine replicas behind one proxy: HRW placement, children with their parent, admission by pressure,
failover of a dead replica's generations, and the control-plane fan-out (acks, retries, fencing)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections import Counter

import httpx
import pytest

from hrl.runners.engines.base import SamplingParams
from hrl.runners.engines.remote import serve_engine
from hrl.runners.engines.replicas import hrw_rank, parse_vllm_metrics
from hrl.runners.engines.scripted import ScriptedEngine, ScriptedEngineConfig
from tests.proxy_helpers import running_proxy

ANSWER = "one two three four five six seven eight nine ten eleven twelve"


def _replicas(n: int, **opts) -> dict:
    return {"replicas": [{"engine": "scripted", "options": {"turns": [ANSWER], **opts}} for _ in range(n)]}


def _chat(url: str, token: str, text: str = "hi", stream: bool = False) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": text}], "stream": stream}
    return httpx.post(f"{url}/s/{token}/v1/chat/completions", json=body, timeout=60)


def test_hrw_moves_about_one_nth_of_the_keys_and_only_to_the_new_replica():
    keys = [f"session-{i}" for i in range(3000)]
    before = {k: hrw_rank(k, ["r0", "r1", "r2"])[0] for k in keys}
    after = {k: hrw_rank(k, ["r0", "r1", "r2", "r3"])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "r3" for k in moved)  # nothing reshuffles between the old replicas
    assert 0.2 < len(moved) / len(keys) < 0.3  # about 1/4 (blake2b: deterministic; and ±6σ of a binomial over 3000)
    assert set(Counter(before.values())) == {"r0", "r1", "r2"}
    assert min(Counter(before.values()).values()) > 850  # balanced (1000 ± 26 each: 850 is -5.8σ)
    assert hrw_rank("x", ["r1", "r0"]) == hrw_rank("x", ["r0", "r1"])  # the order given does not matter


def test_vllm_metrics_are_read_in_old_and_new_spellings():
    text = """# HELP vllm:kv_cache_usage_perc KV-cache usage.
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.1
"""
    m = parse_vllm_metrics(text)
    assert m == {"kv_cache_usage": 0.42, "waiting": 3.0, "running": 5.0, "prefix_queries": 1000.0,
                 "prefix_hits": 600.0}  # fmt: skip


def test_sessions_stick_to_their_hrw_replica_and_children_follow_the_parent(tiny_model):
    opts = {**_replicas(2), "policy": "hrw"}
    with running_proxy(tiny_model, engine="replicas", engine_options=opts) as p:
        replicas = p.proxy.engine
        tokens = [f"sess-{i}" for i in range(8)]
        for t in tokens:
            for turn in range(2):
                assert _chat(p.url, t, f"turn {turn}").status_code == 200
        child = httpx.post(f"{p.url}/sessions", json={"parent": "sess-0", "name": "critic"}, headers=p.control)
        assert child.status_code == 201
        assert _chat(p.url, child.json()["token"], "review").status_code == 200
        traces = {t: p.end(t) for t in tokens}
    for t, trace in traces.items():
        owner = hrw_rank(t, ["r0", "r1"])[0]
        assert trace["env"]["replica"] == owner
        assert {c["replica"] for c in trace["calls"]} == {owner}
        assert "replica_switches" not in trace
    assert len(traces["sess-0"]["calls"]) == 3  # the child's call joined its root's trace, on the same replica
    assert {tr["env"]["replica"] for tr in traces.values()} == {"r0", "r1"}
    assert sum(r["served"] for r in replicas.describe()) == 17


def test_over_budget_requests_wait_in_the_proxy_never_a_429(tiny_model):
    opts = _replicas(1, decode_tps=100)  # 12 words ≈ 25 tokens ≈ 0.25 s each
    with running_proxy(tiny_model, engine="replicas", engine_options={**opts, "max_inflight": 1}) as p:

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"messages": [{"role": "user", "content": "go"}]}
                rs = await asyncio.gather(*(c.post(f"{p.url}/s/b{i}/v1/chat/completions", json=body) for i in range(4)))
                return [r.status_code for r in rs]

        codes = asyncio.run(burst())
        stats = p.call(lambda: (p.proxy.engine.waits, p.proxy.engine.describe()[0]["inflight"]))
    assert codes == [200] * 4
    assert stats == (3, 0)  # three waited for the one slot; all released


def test_a_dead_replica_s_generation_continues_on_the_next_one(tiny_model):
    """Replica r? dies mid-stream: the agent gets one whole answer, the trace records the switch."""
    opts = {**_replicas(2, decode_tps=40), "policy": "hrw"}
    with running_proxy(tiny_model, engine="replicas", engine_options=opts) as p:
        owner = hrw_rank("victim", ["r0", "r1"])[0]
        other = "r1" if owner == "r0" else "r0"
        text, killed = [], None
        body = {"messages": [{"role": "user", "content": "go"}], "stream": True}
        with httpx.stream("POST", f"{p.url}/s/victim/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    text.append(line)
                    if len(text) == 3 and killed is None:
                        killed = p.call_async(p.proxy.engine.replicas[owner].engine.close)
        killed.result(10)
        trace = p.end("victim")
        after = _chat(p.url, "victim-2")  # new sessions skip the dead replica, whatever their HRW owner
        state = p.call(p.proxy.engine.describe)
    import json

    content = "".join(json.loads(c[6:])["choices"][0]["delta"].get("content") or "" for c in text)
    assert content == ANSWER
    assert trace["failure_reason"] is None or trace["failure_reason"] == "no_llm_calls"
    (switch,) = trace["replica_switches"]
    assert (switch["from"], switch["to"]) == (owner, other)
    assert switch["after_tokens"] > 0
    assert trace["env"]["replica"] == other
    assert trace["calls"][0]["finish_reason"] == "stop"
    assert after.status_code == 200
    assert {s["name"]: s["healthy"] for s in state} == {owner: False, other: True}


TOKEN = secrets.token_urlsafe(32)  # the engine server's bearer token


@contextlib.contextmanager
def _engine_server(model: str, port: int = 0):
    """A scripted engine behind `engine_app` on its own loop thread; yields (url, stop)."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    engine = ScriptedEngine(ScriptedEngineConfig(model=model, turns=[ANSWER]))
    runner, url = asyncio.run_coroutine_threadsafe(serve_engine(engine, token=TOKEN, port=port), loop).result(60)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)

    try:
        yield url, stop, engine
    finally:
        with contextlib.suppress(Exception):
            stop()
        loop.call_soon_threadsafe(loop.stop)


def test_publish_fans_out_acks_retries_and_fences_a_replica_that_fails(tiny_model):
    with _engine_server(tiny_model) as (url, stop, remote_engine):
        opts = {"replicas": [{"name": "local", "engine": "scripted", "options": {"turns": [ANSWER]}},
                             {"name": "remote", "engine": "remote", "options": {"url": url, "token": TOKEN}}],
                "publish_retries": 1, "poll_s": 0.2}  # fmt: skip
        with running_proxy(tiny_model, engine="replicas", engine_options=opts) as p:
            rs = p.proxy.engine
            assert p.call_async(p.proxy.publish, "unused", "lora").result(30) == 1
            assert rs.last_fanout["acked"] == ["local", "remote"]
            assert remote_engine.version == 1
            stop()  # the remote replica goes away
            assert p.call_async(p.proxy.publish, "unused", "lora").result(30) == 2
            report = dict(rs.last_fanout)
            fenced = p.call(rs.describe)
            # every new session now lands on the replica that holds version 2, whatever its HRW owner
            traces = [(_chat(p.url, f"f{i}").status_code, p.end(f"f{i}")) for i in range(6)]
    assert report["acked"] == ["local"]
    assert "remote" in report["failed"]
    assert {s["name"]: s["fenced"] for s in fenced} == {"local": False, "remote": True}
    for code, trace in traces:
        assert code == 200
        assert trace["env"]["replica"] == "local"
        assert trace["calls"][0]["versions"] == [[0, 2]]


def test_a_publish_that_every_replica_refuses_is_an_error(tiny_model):
    with _engine_server(tiny_model) as (url, stop, _):
        opts = {"replicas": [{"engine": "remote", "options": {"url": url, "token": TOKEN}}], "publish_retries": 0}
        with running_proxy(tiny_model, engine="replicas", engine_options=opts) as p:
            stop()
            with pytest.raises(Exception, match="publish failed on every engine replica"):
                p.call_async(p.proxy.publish, "unused", "lora").result(30)


def test_round_robin_spreads_one_session_over_the_replicas(tiny_model):
    """The comparison policy of bench/replicas.py: calls alternate, so a session's prefix is on both replicas."""
    with running_proxy(tiny_model, engine="replicas", engine_options={**_replicas(2), "policy": "round_robin"}) as p:
        for turn in range(4):
            assert _chat(p.url, "rr", f"turn {turn}").status_code == 200
        trace = p.end("rr")
    assert [c["replica"] for c in trace["calls"]] == ["r0", "r1", "r0", "r1"]


def test_bounded_loads_send_a_hot_owner_s_overflow_to_the_next_replica(tiny_model):
    """load_factor 1: with one generation in flight on a session's owner, a second concurrent one goes to the next
    replica in HRW order; alone, each session is served by its owner."""
    opts = {**_replicas(2, decode_tps=60), "policy": "hrw", "load_factor": 1.0}
    same = [t for t in (f"s{i}" for i in range(50)) if hrw_rank(t, ["r0", "r1"])[0] == "r0"][:2]
    with running_proxy(tiny_model, engine="replicas", engine_options=opts) as p:

        async def both() -> None:
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"messages": [{"role": "user", "content": "go"}]}
                await asyncio.gather(*(c.post(f"{p.url}/s/{t}/v1/chat/completions", json=body) for t in same))

        asyncio.run(both())
        together = [p.end(t)["env"]["replica"] for t in same]
        alone = [(_chat(p.url, f"{t}-b").status_code, p.end(f"{t}-b")["env"]["replica"]) for t in same]
    assert sorted(together) == ["r0", "r1"]
    assert [r for _, r in alone] == [hrw_rank(f"{t}-b", ["r0", "r1"])[0] for t in same]


def test_cache_aware_moves_a_session_off_an_overloaded_replica_and_the_trace_records_it(tiny_model):
    """Another shard's 3 generations held open on the session's replica (threshold 2): its next call moves, once."""
    opts = {**_replicas(2), "move_threshold": 2, "poll_s": 3600}  # the default policy; refreshed by hand only
    with running_proxy(tiny_model, engine="replicas", engine_options=opts) as p:
        rs = p.proxy.engine
        assert _chat(p.url, "mover", "turn 0").status_code == 200
        home = hrw_rank("mover", ["r0", "r1"])[0]  # both idle at its placement: the HRW tie-break
        other = "r1" if home == "r0" else "r0"

        async def hold(i: int):
            gen = rs.replicas[home].engine.generate(f"foreign-{i}", [7, 8, 9], SamplingParams(max_tokens=64))
            await gen.__anext__()
            return gen

        held = [p.call_async(hold, i).result(30) for i in range(3)]
        p.call_async(rs.refresh).result(30)
        assert _chat(p.url, "mover", "turn 1").status_code == 200
        for gen in held:
            p.call_async(gen.aclose).result(30)
        trace = p.end("mover")
        stats = p.call(rs.take_stats)
    assert [c["replica"] for c in trace["calls"]] == [home, other]
    (move,) = trace["replica_moves"]
    assert (move["from"], move["to"], move["loads"]) == (home, other, {home: 3, other: 0})
    assert move["call_id"] == trace["calls"][1]["call_id"]
    assert stats["routing/moves"] == 1.0
