"""The recording proxy over real HTTP with the official OpenAI SDK: token reuse, branches, traces, bad input."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI

from hrl.runners.trace import call_prompt_ids, read_traces
from tests.proxy_helpers import TOOLS as BOTH_TOOLS
from tests.proxy_helpers import running_proxy

TOOLS = BOTH_TOOLS[:1]  # the shell alone
SCRIPT = [
    {"text": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
    {"tool_calls": [{"name": "bash", "arguments": {"command": "sed -i s/-/+/ m.py"}}]},
    "Fixed: the sign in m.py was wrong.",
]


def _conversation(client: OpenAI, stream: bool, turns: int = 3) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "fix m.py"}]
    for _ in range(turns):
        if stream:
            chunks = list(client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True))
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            msg: dict = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.function.name, "arguments": tc.function.arguments},
                    }
                    for tc in calls
                ]
        else:
            msg = (
                client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
                .choices[0]
                .message.model_dump(exclude_none=True)
            )
        msgs.append(msg)
        for tc in msg.get("tool_calls") or []:
            msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": "m.py\ntests/"})
        if not msg.get("tool_calls"):
            msgs.append({"role": "user", "content": "thanks"})
    return msgs


def _assert_append_only(trace: dict) -> None:
    calls = trace["calls"]
    for k in range(1, len(calls)):
        prev = call_prompt_ids(trace, k - 1) + calls[k - 1]["response_ids"]
        assert call_prompt_ids(trace, k)[: len(prev)] == prev, f"call {k} drifted"
        assert calls[k]["prompt_ref"] == {"call_id": calls[k - 1]["call_id"], "length": len(prev)}


@pytest.mark.parametrize("stream", [False, True])
def test_multi_turn_tool_calls_reuse_sampled_ids_exactly(tiny_model, tmp_path, stream):
    out = tmp_path / "traces.jsonl"
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": SCRIPT}) as p:
        client = OpenAI(base_url=f"{p.url}/s/ep1/v1", api_key="unused")
        msgs = _conversation(client, stream)
        assert msgs[-2]["content"].startswith("Fixed")
        assert httpx.post(f"{p.url}/s/ep1/end", json={"reward": 1.0}, headers=p.control).json()["calls"] == 3
    (trace,) = list(read_traces(out))
    _assert_append_only(trace)
    assert [c["finish_reason"] for c in trace["calls"]] == ["tool_calls", "tool_calls", "stop"]
    assert all(c["stream"] is stream and c["dialect"] == "chat" and not c["side"] for c in trace["calls"])
    assert [t["name"] for t in trace["tools"]] == ["bash", "bash"]
    assert all(t["ended_at"] >= t["started_at"] for t in trace["tools"])
    assert trace["reward"] == 1.0
    assert trace["status"] == "ok"
    assert all(c["versions"] == [[0, 0]] for c in trace["calls"])


def test_rewritten_history_starts_a_new_branch(tiny_model, tmp_path):
    out = tmp_path / "traces.jsonl"
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": SCRIPT}) as p:
        client = OpenAI(base_url=f"{p.url}/s/ep2/v1", api_key="unused")
        msgs = _conversation(client, stream=False, turns=2)
        compacted = [{"role": "system", "content": "Summary so far: listed files."}, msgs[-1]]
        compacted[-1] = {"role": "user", "content": "continue"}
        client.chat.completions.create(model="m", messages=compacted, tools=TOOLS)
        p.end("ep2")
    (trace,) = list(read_traces(out))
    calls = trace["calls"]
    assert calls[1]["parent"] == calls[0]["call_id"]
    assert "parent" not in calls[2]  # a new root: its history was re-tokenized, nothing of it is trusted


def test_identical_retry_is_recorded_once(tiny_model):
    with running_proxy(tiny_model, engine_options={"turns": SCRIPT}) as p:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
        for _ in range(2):
            assert httpx.post(f"{p.url}/s/r/v1/chat/completions", json=body).status_code == 200
        trace = p.end("r")
    assert len(trace["calls"]) == 1


def test_bad_input_gets_dialect_errors_and_proxy_keeps_serving(tiny_model, tmp_path):
    out = tmp_path / "t.jsonl"
    with running_proxy(
        tiny_model, traces=str(out), engine_options={"turns": SCRIPT, "max_model_len": 400}, max_body_bytes=50_000
    ) as p:
        url = f"{p.url}/s/bad/v1/chat/completions"
        r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert "malformed" in r.json()["error"]["message"]
        r = httpx.post(url, json={"messages": "nope"})
        assert r.status_code == 400
        r = httpx.post(url, json={"messages": [{"role": "user", "content": "x" * 60_000}]})
        assert r.status_code == 413
        assert r.json()["error"]["code"] == 413
        r = httpx.post(url, json={"messages": [{"role": "user", "content": "word " * 500}]})
        assert r.status_code == 400
        assert "context window" in r.json()["error"]["message"]
        ok = httpx.post(f"{p.url}/s/good/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200
        p.end("bad")
        p.end("good")
    bad, good = list(read_traces(out))
    assert bad["failure_reason"] == "context_overflow"
    assert bad["status"] == "failed"
    assert good["status"] == "ok"


def test_unregistered_tokens_get_401_by_default(tiny_model):
    with running_proxy(tiny_model, open_sessions=False) as p:
        r = httpx.post(f"{p.url}/s/nope/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401
        assert "unknown session" in r.json()["error"]["message"]
        token = httpx.post(f"{p.url}/sessions", json={"task_id": "t1"}, headers=p.control).json()["token"]
        r = httpx.post(
            f"{p.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer hrl-{token}"},
        )
        assert r.status_code == 200
        trace = p.end(token)
    assert trace["task_id"] == "t1"
    assert len(trace["calls"]) == 1


def test_an_overflow_followed_by_a_side_call_still_ends_the_trace_as_context_overflow(tiny_model, tmp_path):
    """A harness that makes a title (a call without tools) after its agent turn overflowed: the episode ended on
    the overflow, and the side call after it does not hide that."""
    out = tmp_path / "t.jsonl"
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": SCRIPT, "max_model_len": 400}) as p:
        url = f"{p.url}/s/s1/v1/chat/completions"
        turn = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 8}
        assert httpx.post(url, json=turn).status_code == 200
        long = {"messages": [{"role": "user", "content": "word " * 500}], "tools": tools}
        assert httpx.post(url, json=long).status_code == 400
        title = {"messages": [{"role": "system", "content": "Generate a title"}, {"role": "user", "content": "hi"}]}
        assert httpx.post(url, json={**title, "max_tokens": 4}).status_code == 200
        p.end("s1")
    (trace,) = read_traces(out)
    assert trace["calls"][-1]["side"] and trace["failure_reason"] == "context_overflow"


def test_a_session_stopped_mid_call_is_cancelled_and_one_between_calls_is_not(tiny_model, tmp_path):
    """The proxy stopping while a call generates cuts that episode short: `cancelled` (set aside and run again on a
    resume, never trained on). A session whose calls had all ended keeps its own outcome."""
    import threading

    out = tmp_path / "t.jsonl"
    long_turn = " ".join(["word"] * 400)
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": [long_turn], "token_delay_s": 0.02}) as p:
        msg = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        assert httpx.post(f"{p.url}/s/done/v1/chat/completions", json=msg, timeout=30).status_code == 200
        started = threading.Event()

        def stream() -> None:
            body = {"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 400}
            try:
                with httpx.stream("POST", f"{p.url}/s/busy/v1/chat/completions", json=body, timeout=30) as r:
                    for _ in r.iter_bytes():
                        started.set()
            except httpx.HTTPError:
                pass  # the server went away mid-stream

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        assert started.wait(30)
    t.join(30)
    by = {tr["session"]: tr for tr in read_traces(out)}
    assert by["busy"]["failure_reason"] == "cancelled" and by["done"]["failure_reason"] is None


def test_stop_flushes_open_sessions(tiny_model, tmp_path):
    out = tmp_path / "t.jsonl"
    with running_proxy(tiny_model, traces=str(out)) as p:
        for tok in ("a", "b"):
            httpx.post(f"{p.url}/s/{tok}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert sorted(t["session"] for t in read_traces(out)) == ["a", "b"]
    assert all(json.loads(line)["metadata"]["ended_by"] == "proxy stop" for line in out.read_text().splitlines())


def test_engine_dying_mid_stream_is_an_error_in_dialect_shape(tiny_model, tmp_path):
    out = tmp_path / "t.jsonl"
    script = [{"text": "I will now crash halfway through this sentence.", "fail_after": 3}]
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": script}) as p:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", f"{p.url}/s/dies/v1/chat/completions", json=body) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200  # headers were sent before the engine died
        assert "scripted engine failure" in events[-2] and events[-1] == "data: [DONE]"
        r = httpx.post(f"{p.url}/s/dies2/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502 and r.json()["error"]["type"] == "server_error"
        p.end("dies")
        p.end("dies2")
    traces = list(read_traces(out))
    assert [t["failure_reason"] for t in traces] == ["engine_error", "engine_error"]
    assert traces[0]["calls"][0]["response_ids"] and traces[0]["calls"][0]["finish_reason"] == "error"
