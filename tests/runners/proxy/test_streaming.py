"""SSE coalescing under a bounded delay: fewer events and writes, the same text, the same recorded tokens; and the
proxy's CPU per streamed token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import types

import httpx

from hrl.runners.proxy.streaming import CoalescingWriter
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
    opts = {"turns": [TURN], "token_delay_s": 0.005}  # 60 tokens, one per delta, 5 ms apart: at least 0.3 s
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
    assert len(plain) == 60  # one event per engine delta, one token each
    # The first text goes out at once; every later write but the last waits 50 ms after the one before it, and
    # those writes lie between the request (t = 0) and the arrival of the last event: n <= 2 + span / 50 ms, however
    # slow the machine (an idle one: 8; one write per token would be 60). And 3 or more: the tokens after the first
    # keep coming for 0.295 s, so the 50 ms window runs out before the end.
    assert 3 <= len(merged) <= 2 + merged[-1][0] / 0.05 + 1e-6, [round(t, 3) for t, _ in merged]
    assert cpu is not None and cpu > 0  # proxy/cpu_us_per_token of the window


def test_cpu_per_token_needs_streamed_tokens(tiny_model: str) -> None:
    with running_proxy(tiny_model) as p:
        assert p.call(p.proxy.take_cpu_per_token) is None  # the first call sets the mark
        assert p.call(p.proxy.take_cpu_per_token) is None  # nothing streamed since


class _Response:
    def __init__(self) -> None:
        self.writes: list[tuple[float, bytes]] = []  # (loop time, bytes)
        self.second = asyncio.Event()

    async def write(self, data: bytes) -> None:
        self.writes.append((asyncio.get_running_loop().time(), data))
        if len(self.writes) == 2:
            self.second.set()


class _Encoder:
    def text(self, text: str) -> list[bytes]:
        return [text.encode()]

    def reasoning(self, text: str) -> list[bytes]:
        return [b"r:" + text.encode()]


def test_held_text_goes_out_on_the_timer_with_no_further_input() -> None:
    """The bound on how long text is held: with nothing more arriving, only the timer can write the held text."""
    delay = 0.5

    async def main() -> tuple[list[bytes], list[tuple[float, bytes]]]:
        resp = _Response()
        call = types.SimpleNamespace(record=types.SimpleNamespace(response_ids=[]))
        out = CoalescingWriter(resp, _Encoder(), call, delay, 0)  # type: ignore[arg-type]
        await out.add([("text", "a")])  # the first text: at once
        await out.add([("text", "b")])  # within the window: held
        held = [data for _, data in resp.writes]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(resp.second.wait(), 20 * delay)
        await out.close()
        return held, resp.writes

    held, writes = asyncio.run(main())
    assert held == [b"a"]
    assert [data for _, data in writes] == [b"a", b"b"]  # the timer fired
    assert writes[1][0] - writes[0][0] >= delay - 1e-6  # not before the window ran out
