"""What one client can do to everyone else through the proxy: open sub-agents without end (capped per session,
refused with a 429 in its dialect's shape, counted), name itself an opencode sub-agent (only opencode is taken
for one), and send prompts that take seconds to tokenize (tokenized off the serving loop; one that cannot fit is
refused before any tokenizing, and recorded as why, not as its prompt ids)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from hrl.runners.proxy.proxy import BYTES_PER_TOKEN
from hrl.runners.trace import read_traces
from tests.proxy_helpers import running_proxy

OPENCODE = {"User-Agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14"}
SUBAGENT_SYSTEM = "You are an agent for Claude Code, Anthropic's official CLI for Claude."  # subagents.PROMPT_MARKERS
CONTEXT = 4096  # the scripted engine's window here: the prompt cap is CONTEXT × BYTES_PER_TOKEN = 128 KiB


def _chat(text: str, system: str | None = None) -> dict[str, Any]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return {"model": "m", "max_tokens": 4, "messages": msgs}


def _register(p: Any, **body: Any) -> httpx.Response:
    return httpx.post(f"{p.url}/sessions", json=body, headers=p.control)


# ---- sub-agents ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _tokenizing_a_big_prompt(tiny_model: str) -> Iterator[tuple[Any, str, httpx.Client, Any]]:
    """A proxy, a session and a prompt under the byte cap but over the context window, posted from a thread and
    being tokenized now: (proxy, token, an HTTP client, the request's future)."""
    text = "def f(x):\n    return x + 1  # a line of code\n" * 16_000  # 720 KB: ~0.2 s to tokenize at ~4 MB/s
    opts = {"turns": ["ok"], "max_model_len": 32768}  # its cap, 1 MiB, lets the 720 KB through to the tokenizer
    with running_proxy(tiny_model, open_sessions=False, engine_options=opts) as p:
        token = _register(p).json()["token"]
        with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=120) as http:
            big = pool.submit(http.post, f"{p.url}/s/{token}/v1/chat/completions", json=_chat(text))
            while not p.proxy.tokenizing and not big.done():
                threading.Event().wait(0.001)
            yield p, token, http, big


def test_opencode_subagents_past_the_cap_are_429s_and_counted(tiny_model):
    with running_proxy(tiny_model, open_sessions=False, max_children=2, engine_options={"turns": ["ok"]}) as p:
        token = _register(p).json()["token"]
        url = f"{p.url}/s/{token}/v1/chat/completions"
        status = [httpx.post(url, json=_chat(f"task {i}"), headers={"x-session-id": f"ses_{i}", **OPENCODE})
                  .status_code for i in range(5)]  # fmt: skip
        # ses_0 is the main agent, ses_1 and ses_2 the two sub-agents the cap allows; ses_3, ses_4 refused
        assert status == [200, 200, 200, 429, 429]
        r = httpx.post(url, json=_chat("again"), headers={"x-session-id": "ses_4", **OPENCODE})
        assert r.status_code == 429 and "max_children" in r.json()["error"]["message"]
        # a registered sub-agent (control plane) counts against the same cap
        assert _register(p, parent=token, name="critic", trainable=False).status_code == 429
        assert p.proxy.stats["proxy/children_refused"] == 4
        trace = p.end(token)
    assert [a["name"] for a in trace["agents"]] == ["main", "opencode/task", "opencode/task#2"]
    assert trace["metadata"]["children_refused"] == 4 and trace["metadata"]["rejected_requests"] == 3
    assert [c.get("agent") for c in trace["calls"]] == [None, "opencode/task", "opencode/task#2"]


def test_x_session_id_from_another_client_opens_no_subagent(tiny_model):
    """50 session ids from a client that is not opencode: one agent, no children (it was 50 trainable agents)."""
    with running_proxy(tiny_model, open_sessions=False, engine_options={"turns": ["ok"]}) as p:
        token = _register(p).json()["token"]
        with httpx.Client(base_url=f"{p.url}/s/{token}") as http:
            for i in range(50):
                r = http.post("/v1/chat/completions", json=_chat(f"turn {i}"),
                              headers={"x-session-id": f"ses_{i}", "User-Agent": "python-httpx/0.28"})  # fmt: skip
                assert r.status_code == 200, r.text
        trace = p.end(token)
    assert "agents" not in trace and len(trace["calls"]) == 50 and all("agent" not in c for c in trace["calls"])


SUBAGENT_BODIES = {  # a Claude Code sub-agent's system prompt in each dialect: each is a new sub-agent
    "chat": ("/v1/chat/completions", lambda i: _chat(f"task {i}", SUBAGENT_SYSTEM),
             lambda b: b["error"]["type"] == "rate_limit_exceeded" and b["error"]["message"]),
    "responses": ("/v1/responses", lambda i: {"instructions": SUBAGENT_SYSTEM, "input": f"task {i}",
                  "max_output_tokens": 4}, lambda b: b["error"]["code"] == "rate_limit_exceeded" and b["error"]["message"]),
    "anthropic": ("/v1/messages", lambda i: {"system": SUBAGENT_SYSTEM, "max_tokens": 4,
                  "messages": [{"role": "user", "content": f"task {i}"}]},
                  lambda b: b["error"]["type"] == "rate_limit_error" and b["error"]["message"]),
    "gemini": ("/v1beta/models/m:generateContent", lambda i: {"systemInstruction": {"parts": [{"text": SUBAGENT_SYSTEM}]},
               "contents": [{"role": "user", "parts": [{"text": f"task {i}"}]}]},
               lambda b: b["error"]["status"] == "RESOURCE_EXHAUSTED" and b["error"]["message"]),
}  # fmt: skip


def test_the_429_comes_in_each_dialects_error_shape(tiny_model):
    with running_proxy(tiny_model, open_sessions=False, max_children=1, engine_options={"turns": ["ok"]}) as p:
        for name, (route, body, message) in SUBAGENT_BODIES.items():
            token = _register(p).json()["token"]
            assert httpx.post(f"{p.url}/s/{token}{route}", json=body(0)).status_code == 200, name
            r = httpx.post(f"{p.url}/s/{token}{route}", json=body(1))
            assert r.status_code == 429, (name, r.text)
            assert "max_children" in message(r.json()), (name, r.text)
            trace = p.end(token)
            assert trace["metadata"]["children_refused"] == 1 and len(trace["agents"]) == 2, name


# ---- prompts too large to fit, and tokenizing off the loop ---------------------------------------------------------


def _line_bytes(path: Path, token: str) -> int:
    """The size of a session's trace line in the file, as written."""
    for line in path.read_bytes().splitlines():
        if json.loads(line)["session"] == token:
            return len(line) + 1
    raise AssertionError(f"no trace for {token}")


def test_a_prompt_over_the_byte_cap_is_refused_untokenized_in_under_1kb_of_trace(tiny_model, tmp_path):
    out = tmp_path / "t.jsonl"
    big = "x" * (5 << 20)  # 5 MiB: 40 × the cap
    opts = {"turns": ["ok"], "max_model_len": CONTEXT}
    with running_proxy(tiny_model, traces=str(out), open_sessions=False, engine_options=opts) as p:
        assert p.proxy.max_prompt_bytes == CONTEXT * BYTES_PER_TOKEN
        one, many = _register(p).json()["token"], _register(p).json()["token"]
        for token, n in ((one, 1), (many, 6)):
            for i in range(n):  # distinct bodies: an identical one would be taken for a retry, recorded once
                r = httpx.post(f"{p.url}/s/{token}/v1/chat/completions", json=_chat(f"{i}{big}"), timeout=60)
                assert r.status_code == 400, r.text
                assert "proxy.max_prompt_bytes" in r.json()["error"]["message"]
        trace = p.end(many)
        p.end(one)
    assert trace["failure_reason"] == "context_overflow"
    assert all(c["prompt_ids"] == [] and "max_prompt_bytes" in c["error"] for c in trace["calls"])
    # each refused request adds one failed call and one `rejected` entry, both of bounded size: the line of the
    # session refused 6 times outgrows the one refused once by under 1 KiB per refusal (it held 5 MiB of ids)
    growth = (_line_bytes(out, many) - _line_bytes(out, one)) / 5
    assert 0 < growth < 1024, growth


def test_health_answers_while_a_large_prompt_is_tokenized(tiny_model, tmp_path):
    """A prompt under the byte cap but over the context window is rendered and tokenized (in a worker thread),
    then refused with its token count and recorded without its ids. While it is tokenized, the proxy answers:
    `tokenizing` is counted on the loop around the worker's run, so a /health answered while the big request is
    still open and `tokenizing` is 1 was served during the tokenizing (tokenized on the loop, /health would wait
    behind it: the request would be answered first)."""
    with _tokenizing_a_big_prompt(tiny_model) as (p, token, http, big):
        health = http.get(f"{p.url}/health")
        during = p.proxy.tokenizing == 1 and not big.done()
        r = big.result()
        trace = p.end(token)
    assert health.status_code == 200 and during
    assert r.status_code == 400 and "exceeds the context window" in r.json()["error"]["message"]
    (call,) = trace["calls"]
    assert call["prompt_ids"] == [] and "tokens exceeds the context window" in call["error"]


def test_5mb_prompts_beside_64_streaming_sessions(tiny_model, tmp_path):
    """The soak in small (bench/proxy_soak.py --big-prompts runs it for minutes and times it): one client sends
    5 MiB prompts while 64 sessions stream. Every stream finishes, every big prompt is refused before any
    tokenizing, /health keeps answering, and the big prompts add under 1 KiB of trace each."""
    out = tmp_path / "t.jsonl"
    opts = {"turns": ["Looking at it now; the fix is small."], "token_delay_s": 0.002, "max_model_len": CONTEXT}
    head, tail = json.dumps(_chat("\0")).encode().split(b"\\u0000")
    big = b"y" * (5 << 20)  # each request: `<n>yyy…` (distinct bodies: an identical one is taken for a retry)
    with running_proxy(tiny_model, traces=str(out), open_sessions=False, engine_options=opts) as p:
        tokens = [p.call(lambda: p.proxy.open_session().token) for _ in range(65)]

        async def stream(http: httpx.AsyncClient, token: str) -> int:
            msgs = [{"role": "user", "content": f"fix bug {token[:6]}"}]
            for _ in range(2):
                body = {"messages": msgs, "stream": True, "max_tokens": 8}
                async with http.stream("POST", f"/s/{token}/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
                assert lines[-1] == "data: [DONE]" and not any('"error"' in x for x in lines)
                msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
            return 2

        async def flood(http: httpx.AsyncClient, token: str, done: asyncio.Event) -> tuple[int, int]:
            refused = health = 0
            while not done.is_set() or refused < 3:
                body = head + str(refused).encode() + big + tail
                r = await http.post(f"/s/{token}/v1/chat/completions", content=body)
                assert r.status_code == 400 and "max_prompt_bytes" in r.json()["error"]["message"]
                refused += 1
                health += (await http.get("/health")).status_code == 200
            return refused, health

        async def main() -> tuple[list[int], tuple[int, int]]:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
            async with httpx.AsyncClient(base_url=p.url, timeout=120, limits=limits) as http:
                done = asyncio.Event()
                bad = asyncio.ensure_future(flood(http, tokens[64], done))
                ok = await asyncio.gather(*(stream(http, t) for t in tokens[:64]))
                done.set()
                return ok, await bad

        ok, (refused, health) = asyncio.run(main())
        assert p.proxy.tokenizing == 0
        for t in tokens:
            p.end(t)
    assert sum(ok) == 128 and health == refused >= 3
    traces = {t["session"]: t for t in read_traces(out)}
    bad = traces[tokens[64]]
    assert len(bad["calls"]) == refused and all(c["prompt_ids"] == [] for c in bad["calls"])
    # the whole line, fixed fields included, is under 1 KiB per refused prompt (each sent 5 MiB)
    assert _line_bytes(out, tokens[64]) < 1024 * refused
    assert all(traces[t]["status"] == "ok" and len(traces[t]["calls"]) == 2 for t in tokens[:64])


def test_a_session_ended_while_its_prompt_is_tokenized_gets_a_409(tiny_model):
    """The loop serves the control plane while a prompt is tokenized: a session ended meanwhile (its owner, the
    idle reaper) records nothing more, and the request is told so."""
    with _tokenizing_a_big_prompt(tiny_model) as (p, token, _, big):
        trace = p.end(token)
        r = big.result()
        assert token not in p.proxy.sessions and p.proxy.tokenizing == 0
    assert r.status_code == 409 and "ended" in r.json()["error"]["message"]
    assert trace["calls"] == [] and trace["failure_reason"] == "no_llm_calls"
