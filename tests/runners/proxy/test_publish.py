"""Weight updates under running agents: invisible to them, per-token versions (`mixed`) or pinned traces (`pin`)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.proxy_helpers import running_proxy

LONG = {
    "ignore_eos": True,
    "messages": [{"role": "user", "content": "write a long answer"}],
    "max_tokens": 120,
    "temperature": 1.0,
    "seed": 3,
    "stream": True,
}


def _stream_with_publish(p, token: str, path: str, kind: str, after: int = 5) -> tuple[int, str, list[str]]:
    """Stream a response; after `after` content chunks, publish new weights through the proxy."""
    chunks, published = [], None
    with httpx.stream("POST", f"{p.url}/s/{token}/v1/chat/completions", json=LONG, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(line)
            if len(chunks) == after and published is None:
                published = p.call_async(p.proxy.publish, path, kind)
    assert published is not None, f"the stream ended after {len(chunks)} chunks, before the publish"
    published.result(60)  # the publish itself succeeded
    text = "".join((json.loads(c[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or "" for c in chunks)
    return r.status_code, text, chunks


@pytest.mark.parametrize("policy", ["mixed", "pin"])
def test_publish_during_a_long_stream(tiny_model, tiny_lora, policy):
    with running_proxy(tiny_model, engine="embedded", engine_options={"dtype": "float32"}, version_policy=policy) as p:
        status, _text, chunks = _stream_with_publish(p, "long", tiny_lora, "lora")
        trace = p.end("long")
        after = httpx.post(f"{p.url}/s/next/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 4})
        next_trace = p.end("next")
    assert status == 200
    assert after.status_code == 200
    assert "error" not in chunks[-1]
    (call,) = trace["calls"]
    if policy == "mixed":
        assert len(call["versions"]) == 2
        assert call["versions"][0] == [0, 0]
        assert call["versions"][1][1] == 1
        assert 4 <= call["versions"][1][0] < len(call["response_ids"])
    else:
        assert call["versions"] == [[0, 0]]
    assert next_trace["calls"][0]["versions"] == [[0, 1]]


def test_mixed_resumes_preempted_generations_from_the_sampled_tokens(tiny_model):
    """An engine that cannot swap weights under a running request (like vLLM with LoRA): the proxy aborts,
    publishes, and continues from the tokens already sampled — the agent gets one whole answer."""
    answer = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    opts = {"turns": [answer], "token_delay_s": 0.02, "continues_in_place": False, "publish_delay_s": 0.3}
    with running_proxy(tiny_model, engine_options=opts) as p:
        status, text, _ = _stream_with_publish(p, "s", "unused", "lora", after=4)
        trace = p.end("s")
    assert status == 200
    assert text == answer
    (call,) = trace["calls"]
    assert [v[1] for v in call["versions"]] == [0, 1]
    assert call["finish_reason"] == "stop"
    assert call["response_ids"][-1] != call["response_ids"][-2]  # no token repeated at the seam


def test_requests_wait_through_a_publish_without_errors(tiny_model):
    opts = {"turns": ["ok"], "publish_delay_s": 1.0}
    with running_proxy(tiny_model, engine_options=opts) as p:
        fut = p.call_async(p.proxy.publish, "unused", "lora")

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"messages": [{"role": "user", "content": "hi"}]}
                rs = await asyncio.gather(*[c.post(f"{p.url}/s/w{i}/v1/chat/completions", json=body) for i in range(8)])
                return [r.status_code for r in rs]

        codes = asyncio.run(burst())
        fut.result(30)
        traces = [p.end(f"w{i}") for i in range(8)]
    assert codes == [200] * 8
    assert all(t["calls"][0]["versions"] == [[0, 1]] for t in traces)
    assert p.proxy.stats["proxy/pause_s"] >= 1.0
    assert p.proxy.stats["proxy/queue_depth"] >= 1  # requests were counted while they waited
