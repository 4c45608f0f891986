"""What an untrusted client can do to the proxy: nothing on the control plane without the control token, nothing in
a session it does not hold, and no input makes a 500: each malformed request is a 4xx in its dialect's error shape
naming the problem, recorded in its session's trace. A property-based fuzz over all four dialects keeps it so."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.proxy_helpers import running_proxy
from tests.runners.proxy.dialects.test_dialects import _claude_body, _codex_body, _gemini_body

CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ],
    "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
    "max_tokens": 8,
    "temperature": 0.5,
}  # fmt: skip


def _fresh(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(body))  # a deep copy: mutations must not reach the shared test bodies


ROUTES = {  # a realistic body per dialect (what the CLIs send), small max_tokens
    "chat": ("/v1/chat/completions", lambda: _fresh(CHAT)),
    "responses": ("/v1/responses", lambda: _fresh({**_codex_body(), "stream": False, "max_output_tokens": 8})),
    "anthropic": ("/v1/messages", lambda: _fresh({**_claude_body(), "stream": False, "max_tokens": 8})),
    "gemini": ("/v1beta/models/m:generateContent", lambda: _fresh(_gemini_body())),
}
ERROR_SHAPE = {  # where each dialect's clients look for the message
    "chat": lambda b: b["error"]["message"],
    "responses": lambda b: b["error"]["message"],
    "anthropic": lambda b: b["error"]["message"] if b["type"] == "error" else None,
    "gemini": lambda b: b["error"]["message"],
}


@pytest.fixture(scope="module")
def proxy(tiny_model):
    with running_proxy(tiny_model, open_sessions=False, engine_options={"turns": ["Done."]}) as p:
        yield p


def _session(p, **meta: Any) -> str:
    r = httpx.post(f"{p.url}/sessions", json=meta, headers=p.control)
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


def _end(p, token: str, **body: Any) -> dict[str, Any]:
    return p.end(token, **body)


# ---- control plane -----------------------------------------------------------------------------------------


def test_control_routes_refuse_without_the_control_token(proxy):
    mine = _session(proxy)
    other = _session(proxy, task_id="victim")
    as_agent = {"Authorization": f"Bearer hrl-{mine}"}
    for method, path, body in [
        ("GET", "/sessions", None),
        ("POST", "/sessions", {}),
        ("POST", f"/s/{other}/end", {"reward": 1.0}),
        ("POST", f"/s/{mine}/end", {"reward": 1.0}),
        ("POST", "/publish", {"path": "/tmp", "kind": "lora"}),
        ("POST", "/pause", None),
        ("POST", "/resume", None),
    ]:
        for headers in ({}, as_agent, {"Authorization": "Bearer not-the-token"}):
            r = httpx.request(method, f"{proxy.url}{path}", json=body, headers=headers)
            assert r.status_code in (401, 403), (method, path, headers, r.status_code)
            r = httpx.request(method, f"{proxy.url}/s/{mine}{path}", json=body, headers=headers)
            assert r.status_code in (401, 403, 404), (method, f"/s/{mine}{path}", r.status_code)
    assert {mine, other} <= set(proxy.proxy.sessions)  # nobody ended anything
    trace = _end(proxy, other, reward=0.25)  # the owner's reward (kept aside: the session made no call)
    assert trace["metadata"]["reward_without_calls"] == 0.25 and trace["task_id"] == "victim"


@pytest.mark.parametrize(
    "body",
    [{"reward": "abc"}, {"reward": True}, b'{"reward": NaN}', b'{"reward": Infinity}', {"reward_info": "oops"},
     {"failure_reason": "bogus"}, {"status": "bogus"}, {"metadata": [1]}, {"success": "yes"}, b"not json", b"[1, 2]",
     b"[" * 100_000],
)  # fmt: skip
def test_a_bad_end_is_a_400_and_the_session_stays_open(proxy, body):
    """The control `end` is checked like the client's, before anything is removed: a value the trace cannot hold
    broke `hrl inspect` on the whole file, and a refused one lost the episode's calls."""
    token = _session(proxy)
    assert httpx.post(f"{proxy.url}/s/{token}/v1/chat/completions", json=_fresh(CHAT)).status_code == 200
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        f"{proxy.url}/s/{token}/end", content=raw, headers={**proxy.control, "content-type": "application/json"}
    )
    assert r.status_code == 400, (body, r.status_code, r.text)
    assert token in proxy.proxy.sessions  # nothing removed: a good end still writes the trace with its call
    trace = _end(proxy, token, reward=1.0, failure_reason=None)
    assert trace["reward"] == 1.0 and len(trace["calls"]) == 1


def test_deep_bodies_and_a_missing_publish_path_are_400s(proxy):
    deep = b'{"a": ' * 100_000 + b"1" + b"}" * 100_000
    for path in ("/sessions", f"/s/{_session(proxy)}/end"):
        r = httpx.post(
            f"{proxy.url}{path}", content=deep, headers={**proxy.control, "content-type": "application/json"}
        )
        assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"], (path, r.status_code)
    r = httpx.post(f"{proxy.url}/publish", json={"path": "/nonexistent/adapter", "kind": "lora"}, headers=proxy.control)
    assert r.status_code == 400 and "no weights folder at /nonexistent/adapter" in r.text
    assert proxy.proxy.engine.version == 0 and proxy.proxy._open.is_set()  # nothing published, nothing paused


def test_a_forged_or_unknown_token_opens_nothing(proxy):
    before = set(proxy.proxy.sessions)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    for url, headers in [
        (f"{proxy.url}/s/forged-token-0000000000/v1/chat/completions", {}),
        (f"{proxy.url}/v1/chat/completions", {"Authorization": "Bearer hrl-forged"}),
        (f"{proxy.url}/v1/chat/completions", {"x-session-id": "forged"}),
        (f"{proxy.url}/v1/chat/completions", {}),
    ]:
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 401, r.text
        assert "unknown session" in r.json()["error"]["message"]
    assert set(proxy.proxy.sessions) == before


def test_tokens_carry_128_random_bits(proxy):
    tokens = [_session(proxy) for _ in range(20)]
    assert len(set(tokens)) == 20
    assert all(len(t) >= 22 for t in tokens)  # 16 bytes, url-safe base64
    for t in tokens:
        _end(proxy, t)


# ---- malformed requests: 4xx, in the dialect's shape, naming the field, recorded -----------------------------

BAD_CHAT = [
    ({"max_tokens": "abc"}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 10**30}, "max_tokens"),
    ({"max_tokens": None, "temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"seed": 1.5}, "seed"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": ["x"]}]}, "tool_calls[0]"),
    ({"messages": [{"role": "user", "content": {"a": 1}}]}, "content"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"tools": [{"type": "function", "function": {"name": 7}}]}, "tools[0]"),
    ({"tools": "bash"}, "tools"),
    ({"stream_options": "yes"}, "stream_options"),
]


@pytest.mark.parametrize(("patch", "field"), BAD_CHAT, ids=[f for _, f in BAD_CHAT])
def test_malformed_chat_fields_are_400s_that_name_the_field(proxy, patch, field):
    token = _session(proxy)
    r = httpx.post(f"{proxy.url}/s/{token}/v1/chat/completions", json={**CHAT, **patch})
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]
    trace = _end(proxy, token)
    assert trace["metadata"]["rejected_requests"] == 1
    assert trace["rejected"][0]["status"] == 400 and field in trace["rejected"][0]["error"]


@pytest.mark.parametrize(
    ("raw", "headers"),
    [
        (b'{"messages": [{"role": "user", "content": "h\xff\xfe"}]}', {"Content-Type": "application/json"}),
        (b'{"messages": [{"role": "user", "cont', {"Content-Type": "application/json"}),
        (b"messages=hi", {"Content-Type": "application/x-www-form-urlencoded"}),
        (b"", {}),
        (b"[1, 2]", {}),
        (b'"just a string"', {}),
        (b"null", {}),
        (b'{"messages": [' * 5000 + b"]" * 5000 + b"}", {}),
    ],
    ids=["invalid-utf8", "truncated", "form", "empty", "array", "string", "null", "deep"],
)
@pytest.mark.parametrize("dialect", list(ROUTES))
def test_broken_bodies_are_400s_in_every_dialect(proxy, dialect, raw, headers):
    token = _session(proxy)
    r = httpx.post(f"{proxy.url}/s/{token}{ROUTES[dialect][0]}", content=raw, headers=headers)
    assert r.status_code == 400, r.text
    assert ERROR_SHAPE[dialect](r.json())
    assert _end(proxy, token)["metadata"]["rejected_requests"] == 1


def test_unknown_fields_are_ignored_and_an_oversized_body_is_413(proxy):
    token = _session(proxy)
    r = httpx.post(f"{proxy.url}/s/{token}/v1/chat/completions", json={**CHAT, "vendor_extension": {"x": [1]}})
    assert r.status_code == 200, r.text  # real CLIs send vendor fields: ignored, not refused
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (proxy.proxy.config.max_body_bytes + 10)}]}
    r = httpx.post(f"{proxy.url}/s/{token}/v1/chat/completions", json=big)
    assert r.status_code == 413
    trace = _end(proxy, token)
    assert len(trace["calls"]) == 1 and trace["rejected"][0]["status"] == 413


# ---- property-based fuzz over the four dialects ------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
EXAMPLES = int(os.environ.get("HRL_FUZZ_EXAMPLES", "60"))  # per dialect; bench/proxy_fuzz.py runs more
STATS: dict[str, dict[str, int]] = {}


def _paths(obj: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*at, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*at, i))
    return out


def mutate(body: Any, data: st.DataObject) -> Any:
    """Replace, delete or add at a few random places of a valid body, at any depth."""
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(body)
        path = data.draw(st.sampled_from(paths[1:] or paths))
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        how = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if how == "replace" or not isinstance(parent, dict | list):
            parent[path[-1]] = data.draw(JSON)
        elif how == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(JSON)
        else:
            parent.append(data.draw(JSON))
    return body


def fuzz_once(p, dialect: str, data: st.DataObject) -> int:
    path, make = ROUTES[dialect]
    body = mutate(make(), data)
    stream = data.draw(st.booleans())
    if isinstance(body, dict) and stream:
        body["stream"] = True
    if dialect == "gemini" and stream:
        path = path.replace(":generateContent", ":streamGenerateContent") + "?alt=sse"
    token = p.call(lambda: p.proxy.open_session().token)
    r = httpx.post(f"{p.url}/s/{token}{path}", content=json.dumps(body, allow_nan=True), timeout=60)
    stats = STATS.setdefault(dialect, {"cases": 0, "2xx": 0, "4xx": 0, "5xx": 0})
    stats["cases"] += 1
    for key in (f"{r.status_code // 100}xx", str(r.status_code)):
        stats[key] = stats.get(key, 0) + 1
    assert r.status_code < 500, (dialect, r.status_code, r.text[:300], json.dumps(body)[:500])
    if r.status_code >= 400:
        assert ERROR_SHAPE[dialect](r.json())
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        assert r.text.rstrip().endswith(("[DONE]", "}")), r.text[-300:]  # a whole stream, never cut off
        assert '"error":{' not in r.text and "event: error" not in r.text, r.text[-300:]
    trace = p.end(token)
    assert len(trace["calls"]) + trace["metadata"].get("rejected_requests", 0) >= 1  # the request is recorded
    return r.status_code


@pytest.mark.parametrize("dialect", list(ROUTES))
def test_fuzzed_requests_never_get_a_5xx(proxy, dialect):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def run(data):
        fuzz_once(proxy, dialect, data)

    run()
    stats = STATS[dialect]
    print(f"fuzz {dialect}: {stats}")
    assert stats["5xx"] == 0 and stats["cases"] >= EXAMPLES


# ---- secrets in what the agent sends never reach a prompt id ---------------------------------------------------


def test_a_key_in_tool_output_is_redacted_before_tokenization(proxy):
    from hrl.runners.trace import all_prompt_ids

    key = "sk-proj-" + "Zq7" * 12
    token = _session(proxy)
    body = _fresh(CHAT)
    body["messages"][3]["content"] = f"cat .env\nOPENAI_API_KEY={key}\n"
    assert httpx.post(f"{proxy.url}/s/{token}/v1/chat/completions", json=body).status_code == 200
    trace = _end(proxy, token)
    text = proxy.proxy.template.tokenizer.decode(all_prompt_ids(trace)[0])
    assert key not in text and "REDACTED" in text
    assert key not in json.dumps(trace)


# ---- content parts: a text part without a string text is a 400 naming it, in every dialect ------------------------

_GEMINI_STREAM = "/v1beta/models/m:streamGenerateContent?alt=sse"
_USER_CALL = {"role": "user", "content": "fix it"}
BAD_PARTS = [  # (dialect, route, body, the field the 400 names)
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text"),
    ("chat", "/v1/chat/completions", {"messages": [_USER_CALL, {"role": "tool", "tool_call_id": "c",
     "content": [{"type": "text", "text": 5}]}]}, "messages[1].content[0].text"),
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": ["hi", 7]}]},
     "messages[0].content[1]"),
    ("responses", "/v1/responses", {"input": [{"type": "message", "role": "user",
     "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
    ("responses", "/v1/responses", {"input": [{"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": ["hi"]}]}]}, "input[0].content[0].text"),
    ("responses", "/v1/responses", {"input": [
        {"type": "function_call", "call_id": "c", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": None}]}]},
     "input[1].output[0].text"),
    ("anthropic", "/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text"),
    ("anthropic", "/v1/messages", {"max_tokens": 8, "system": [{"type": "text", "text": 3}],
     "messages": [_USER_CALL]}, "system[0].text"),
    ("anthropic", "/v1/messages", {"max_tokens": 8, "messages": [
        _USER_CALL, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "sh", "input": "ls"}]}]},
     "messages[1].content[0].input"),
    ("anthropic", "/v1/messages", {"max_tokens": 8, "messages": [
        _USER_CALL, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "sh", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text"}]}]}]},
     "messages[2].content[0].content[0].text"),
    ("gemini", _GEMINI_STREAM, {"contents": [{"role": "user", "parts": [{"text": 5}]}]}, "contents[0].parts[0].text"),
    ("gemini", "/v1beta/models/m:generateContent", {"systemInstruction": {"parts": [{"text": 1.5}]},
     "contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, "systemInstruction.parts[0].text"),
    ("gemini", _GEMINI_STREAM, {"contents": [{"role": "user", "parts": [{"text": "hi"}]},
     {"role": "model", "parts": [{"functionCall": {"name": "sh", "args": "ls"}}]}]},
     "contents[1].parts[0].functionCall.args"),
    ("gemini", _GEMINI_STREAM, {"contents": [{"role": "user", "parts": [{"text": "hi", "thought": "yes"}]}]},
     "contents[0].parts[0].thought"),
]  # fmt: skip


@pytest.mark.parametrize(("dialect", "route", "body", "field"), BAD_PARTS, ids=[f"{d}:{f}" for d, _, _, f in BAD_PARTS])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_text_parts_of_the_wrong_type_are_400s_naming_the_field(proxy, dialect, route, body, field, stream):
    token = _session(proxy)
    r = httpx.post(f"{proxy.url}/s/{token}{route}", json={**_fresh(body), "stream": stream})
    assert r.status_code == 400, r.text
    assert field in ERROR_SHAPE[dialect](r.json()), r.text
    trace = _end(proxy, token)
    assert trace["calls"] == [] and field in trace["rejected"][0]["error"]


GOOD_PARTS = [  # unknown extra fields stay accepted, part types hrl does not know are left out (media: test_media.py)
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"x": 1}}, {"type": "vendor_note", "note": "u"}]}]}),
    ("responses", "/v1/responses", {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "hi", "annotations": []}, {"type": "vendor_note", "note": "u"}]}]}),
    ("anthropic", "/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
        {"type": "search_result", "source": "u", "title": "t", "content": [{"type": "text", "text": "x"}]}]}]}),
    ("gemini", _GEMINI_STREAM, {"contents": [{"role": "user", "parts": [
        {"text": "hi", "thoughtSignature": "c2ln"}, {"executableCode": {"language": "PYTHON", "code": "1"}}]}]}),
]  # fmt: skip


@pytest.mark.parametrize(("dialect", "route", "body"), GOOD_PARTS, ids=[d for d, _, _ in GOOD_PARTS])
def test_extra_fields_and_unknown_parts_are_still_served(proxy, dialect, route, body):
    token = _session(proxy)
    r = httpx.post(f"{proxy.url}/s/{token}{route}", json=_fresh(body))
    assert r.status_code == 200, r.text
    trace = _end(proxy, token)
    assert len(trace["calls"]) == 1 and "dropped_media" not in trace
