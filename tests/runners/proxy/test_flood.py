"""What one session's flood of big prompts can take from the others: every route that tokenizes (the generation
routes and Anthropic's count_tokens) reads and tokenizes one prompt of a session's tree at a time, so the flood
holds one tokenizer thread, never all of them; and the byte cap is absolute as well as the context window's, so
a 5 MB prompt is refused untokenized whatever the window, leaving a record of bounded size."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from hrl.runners.proxy.proxy import BYTES_PER_TOKEN, Proxy, ProxyConfig
from tests.proxy_helpers import running_proxy

LONG_CONTEXT = 256 * 1024  # a long-context model's window: its context cap alone is 8 MiB, over a 5 MB prompt
HOLD = "HOLD-THIS-PROMPT"  # a prompt holding this text is held inside the tokenizer until the test lets it go


def _chat(text: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}


class _HeldTokenizer:
    """The proxy's real tokenizer, with a prompt holding `HOLD` kept inside it until `release` is set: how many
    such prompts are being tokenized at once (now, and at most) says how many threads one session holds."""

    def __init__(self, template: Any) -> None:
        self.encode, self.release, self.lock = template.encode, threading.Event(), threading.Lock()
        self.now = self.most = self.calls = 0
        template.encode = self

    def __call__(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        with self.lock:
            self.calls += 1
        if HOLD not in text:
            return self.encode(text, *args, **kwargs)  # type: ignore[no-any-return]
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            assert self.release.wait(60), "the test never let the held prompt go"
            return self.encode(text, *args, **kwargs)  # type: ignore[no-any-return]
        finally:
            with self.lock:
                self.now -= 1


def _wait_for(condition: Any, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


@pytest.fixture
def flooded(tiny_model: str) -> Iterator[tuple[Any, _HeldTokenizer, httpx.Client]]:
    """A proxy with 4 tokenizer threads and its tokenizer wrapped in a `_HeldTokenizer`, and an HTTP client."""
    with running_proxy(tiny_model, tokenizer_threads=4, engine_options={"turns": ["ok"]}) as p:
        held = _HeldTokenizer(p.proxy.template)
        with httpx.Client(base_url=p.url, timeout=60) as http:
            try:
                yield p, held, http
            finally:
                held.release.set()


def test_one_session_counts_tokens_one_prompt_at_a_time(flooded):
    """Six parallel count_tokens from one session, one of them through a registered sub-agent's token (its root's
    lock): one is tokenized while the others wait, so another session's count and chat still find a thread (the
    six had taken all four: another session's chats waited 24 s at the median beside 200 of them)."""
    p, held, http = flooded
    assert http.post("/s/flood/v1/messages/count_tokens", json=_chat("open the session")).status_code == 200
    child = http.post("/sessions", json={"parent": "flood", "name": "critic"}, headers=p.control).json()["token"]
    routes = [f"/s/{t}/v1/messages/count_tokens" for t in ["flood"] * 5 + [child]]
    with ThreadPoolExecutor(len(routes)) as pool:
        flood = [pool.submit(http.post, r, json=_chat(f"{HOLD} {i}")) for i, r in enumerate(routes)]
        _wait_for(lambda: held.now >= 1)
        time.sleep(0.3)  # time for the other five to reach a tokenizer thread, were they let through
        assert held.now == 1 and p.proxy.tokenizing == 1
        counted = http.post("/s/other/v1/messages/count_tokens", json=_chat("a short question"))
        chat = http.post("/s/other/v1/chat/completions", json=_chat("a short question"))
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0, counted.text
        assert chat.status_code == 200 and not any(f.done() for f in flood), chat.text
        held.release.set()
        answers = [f.result() for f in flood]
    assert [r.status_code for r in answers] == [200] * 6
    assert held.most == 1 and p.proxy.tokenizing == 0


def test_a_generation_waits_for_its_sessions_count(flooded):
    """count_tokens and the generation routes share the session's lock: a chat of the session waits for its count,
    a chat of another session does not."""
    _, held, http = flooded
    with ThreadPoolExecutor(2) as pool:
        count = pool.submit(http.post, "/s/flood/v1/messages/count_tokens", json=_chat(HOLD))
        _wait_for(lambda: held.now >= 1)
        mine = pool.submit(http.post, "/s/flood/v1/chat/completions", json=_chat("and now?"))
        assert http.post("/s/other/v1/chat/completions", json=_chat("and now?")).status_code == 200
        time.sleep(0.3)  # time for the session's chat to be tokenized and answered, were it let through
        assert not mine.done() and not count.done()
        held.release.set()
        assert count.result().status_code == 200 and mine.result().status_code == 200


def test_requests_past_the_sessions_queue_are_refused_at_once(tiny_model):
    """With proxy.max_queued_prompts 3, ten parallel counts from one session: three hold or wait for its lock, the
    other seven are a 429 at once (before the held one is let go), counted; another session is served meanwhile."""
    with running_proxy(tiny_model, tokenizer_threads=4, max_queued_prompts=3) as p:
        held = _HeldTokenizer(p.proxy.template)
        with httpx.Client(base_url=p.url, timeout=60) as http, ThreadPoolExecutor(10) as pool:
            try:
                assert http.post("/s/flood/v1/messages/count_tokens", json=_chat("open")).status_code == 200
                flood = [pool.submit(http.post, "/s/flood/v1/messages/count_tokens", json=_chat(f"{HOLD} {i}"))
                         for i in range(10)]  # fmt: skip
                _wait_for(lambda: sum(f.done() for f in flood) >= 7)
                refused = [f.result() for f in flood if f.done()]
                assert [r.status_code for r in refused] == [429] * 7, [r.text for r in refused]
                assert "proxy.max_queued_prompts" in refused[0].text and held.now == 1
                assert p.proxy.stats["proxy/queued_refused"] == 7
                assert http.post("/s/other/v1/messages/count_tokens", json=_chat("hi")).status_code == 200
            finally:
                held.release.set()
            assert sorted(f.result().status_code for f in flood) == [200] * 3 + [429] * 7
        assert p.proxy.sessions["flood"].queued == 0


@pytest.mark.parametrize("route", ["/v1/messages/count_tokens", "/v1/chat/completions"])
def test_a_5mb_prompt_on_a_256k_context_is_refused_untokenized(tiny_model, route):
    """The context window alone (256k tokens × 32 bytes: 8 MiB) let a 5 MB prompt through to seconds of
    tokenizing; the absolute cap (4 MiB) refuses it before any, in its dialect's shape. The refused call keeps no
    ids and no message keys."""
    text = "def f(x):\n    return x + 1  # a line of code\n" * (5_000_000 // 45)
    with running_proxy(tiny_model, engine_options={"turns": ["ok"], "max_model_len": LONG_CONTEXT}) as p:
        held = _HeldTokenizer(p.proxy.template)
        t0 = time.monotonic()
        r = httpx.post(f"{p.url}/s/big{route}", json=_chat(text), timeout=60)
        took = time.monotonic() - t0
        session = p.proxy.sessions["big"]
    assert r.status_code == 400 and "proxy.max_prompt_bytes" in r.text, r.text
    assert held.calls == 0 and took < 5  # ~0.1 s to read the body: no tokenizing (seconds for 5 MB)
    assert p.proxy.max_prompt_bytes == 4 << 20 < LONG_CONTEXT * BYTES_PER_TOKEN
    if route.endswith("completions"):
        (call,) = session.calls
        assert call.prompt_ids == [] and call.message_keys == [] and "max_prompt_bytes" in (call.error or "")


def test_a_prompt_over_the_window_leaves_no_keys_behind(tiny_model):
    """A prompt under the byte cap but over the window is tokenized, then refused: its record keeps why, not its
    ids nor one key per message (a refused call is never a later call's parent)."""
    msgs = [{"role": "user" if i % 2 else "assistant", "content": f"line {i} of a long log"} for i in range(1, 2000)]
    with running_proxy(tiny_model, engine_options={"turns": ["ok"], "max_model_len": 4096}) as p:
        r = httpx.post(f"{p.url}/s/s/v1/chat/completions", json={"messages": msgs, "max_tokens": 4}, timeout=60)
        (call,) = p.proxy.sessions["s"].calls
    assert r.status_code == 400 and "exceeds the context window" in r.text, r.text
    assert call.prompt_ids == [] and call.message_keys == [] and "context window" in (call.error or "")


def _cap(context: int, **config: Any) -> int:
    """The prompt cap of a proxy whose engine has this window (nothing else of the proxy is read)."""
    return Proxy(SimpleNamespace(max_model_len=context), SimpleNamespace(), ProxyConfig(**config)).max_prompt_bytes  # type: ignore[arg-type]


def test_the_cap_is_the_lower_of_the_setting_and_the_window():
    assert ProxyConfig().max_prompt_bytes == 4 << 20
    assert _cap(4096) == 4096 * BYTES_PER_TOKEN  # a short window: its own cap is lower
    assert _cap(LONG_CONTEXT) == 4 << 20  # a long one: the absolute cap
    assert _cap(LONG_CONTEXT, max_prompt_bytes=1000) == 1000
    assert _cap(LONG_CONTEXT, max_prompt_bytes=0) == LONG_CONTEXT * BYTES_PER_TOKEN  # 0: the window's only
    assert _cap(4096, max_prompt_bytes=64 << 20) == 4096 * BYTES_PER_TOKEN  # the setting never raises it


def test_the_absolute_cap_setting_is_honoured(tiny_model):
    """proxy.max_prompt_bytes below the window's cap: a prompt over it is refused untokenized, one under served."""
    with running_proxy(tiny_model, max_prompt_bytes=2000, engine_options={"turns": ["ok"]}) as p:
        held = _HeldTokenizer(p.proxy.template)
        over = httpx.post(f"{p.url}/s/s/v1/chat/completions", json=_chat("x" * 2500))
        counted = httpx.post(f"{p.url}/s/s/v1/messages/count_tokens", json=_chat("x" * 2500))
        assert held.calls == 0
        under = httpx.post(f"{p.url}/s/s/v1/chat/completions", json=_chat("x" * 1500))
    assert over.status_code == counted.status_code == 400
    assert "over the limit of 2000 (proxy.max_prompt_bytes" in over.text and "2000" in counted.text
    assert under.status_code == 200, under.text
