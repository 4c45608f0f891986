"""SSE coalescing under a bounded delay: fewer events and writes, the same text, the same recorded tokens; and the
proxy's CPU per streamed token."""

from __future__ import annotations

import itertools
import json
import time

import httpx

from tests.proxy_helpers import running_proxy

TURN = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu " * 3


def _stream(url: str, token: str) -> tuple[list[tuple[float, str]], str]:
    """Chat stream; returns (arrival time, text) per content event and the finish reason."""
    body = {"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 60}
    events, finish, t0 = [], "", time.monotonic()
    with httpx.stream("POST", f"{url}/s/{token}/v1/chat/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = (json.loads(line[6:])["choices"] or [{}])[0]
            if choice.get("delta", {}).get("content"):
                events.append((time.monotonic() - t0, choice["delta"]["content"]))
            finish = choice.get("finish_reason") or finish
    return events, finish


def _run(model: str, coalesce_ms: float) -> tuple[list[tuple[float, str]], str, list[int], float | None]:
    opts = {"turns": [TURN], "decode_tps": 200}  # 60 tokens in 0.3 s, one per 5 ms
    with running_proxy(model, engine_options=opts, stream_coalesce_ms=coalesce_ms, stream_coalesce_tokens=0) as p:
        p.call(p.proxy.take_cpu_per_token)
        events, finish = _stream(p.url, "coalesce-session")
        cpu = p.call(p.proxy.take_cpu_per_token)
        trace = p.end("coalesce-session")
    return events, finish, trace["calls"][0]["response_ids"], cpu


def test_coalescing_sends_fewer_events_within_the_bound_and_records_the_same_tokens(tiny_model: str) -> None:
    plain, finish0, ids0, cpu = _run(tiny_model, 0)
    merged, finish1, ids1, _ = _run(tiny_model, 50)
    assert ids1 == ids0 and len(ids0) == 60 and finish0 == finish1 == "length"  # the recording is token-exact
    assert "".join(t for _, t in merged) == "".join(t for _, t in plain)  # the agent reads the same text
    assert len(plain) >= 30  # one event per engine delta
    assert 3 <= len(merged) <= 14  # ~0.3 s of text in 50 ms windows (plus the first and the last event)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(merged)]
    assert max(gaps) < 0.2  # held text went out on the timer, not only at the end
    assert cpu is not None and cpu > 0  # proxy/cpu_us_per_token of the window


def test_cpu_per_token_needs_streamed_tokens(tiny_model: str) -> None:
    with running_proxy(tiny_model) as p:
        assert p.call(p.proxy.take_cpu_per_token) is None  # the first call sets the mark
        assert p.call(p.proxy.take_cpu_per_token) is None  # nothing streamed since
