"""Every dialect through the real proxy with its official SDK, streaming and not: multi-turn with tool calls,
and call k+1's prompt ids always begin with call k's prompt + response ids."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from google import genai
from google.genai import types as gtypes
from openai import OpenAI

from hrl.runners.trace import call_prompt_ids, read_traces
from tests.proxy_helpers import running_proxy

SCRIPT = [
    {"text": "Looking.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]},
    {"tool_calls": [{"name": "bash", "arguments": {"command": "python -m pytest -q"}}]},
    "All tests pass now.",
]
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def _responses(url: str, stream: bool) -> None:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    tools = [{"type": "function", "name": "bash", "description": "run", "parameters": SCHEMA}]
    items: list = [{"role": "user", "content": "fix the tests"}]
    for _ in range(3):
        if stream:
            with client.responses.stream(model="m", input=items, tools=tools, instructions="You fix bugs.") as s:
                resp = s.get_final_response()
        else:
            resp = client.responses.create(model="m", input=items, tools=tools, instructions="You fix bugs.")
        calls = [o for o in resp.output if o.type == "function_call"]
        items += [o.model_dump(exclude_none=True) for o in resp.output]
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls]
        if not calls:
            break


def _anthropic(url: str, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused")
    tools = [{"name": "bash", "description": "run", "input_schema": SCHEMA}]
    msgs: list = [{"role": "user", "content": "fix the tests"}]
    for _ in range(3):
        kwargs = {"model": "m", "max_tokens": 256, "system": "You fix bugs.", "messages": msgs, "tools": tools}
        if stream:
            with client.messages.stream(**kwargs) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kwargs)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        uses = [b for b in msg.content if b.type == "tool_use"]
        if not uses:
            break
        msgs.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"} for b in uses]}
        )


def _gemini(url: str, stream: bool) -> None:
    client = genai.Client(api_key="unused", http_options=gtypes.HttpOptions(base_url=url))
    tool = gtypes.Tool(
        function_declarations=[
            gtypes.FunctionDeclaration(name="bash", description="run", parameters_json_schema=SCHEMA)
        ]
    )
    config = gtypes.GenerateContentConfig(
        tools=[tool],
        system_instruction="You fix bugs.",
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: list = [gtypes.Content(role="user", parts=[gtypes.Part(text="fix the tests")])]
    for _ in range(3):
        if stream:
            parts = [
                p
                for ch in client.models.generate_content_stream(model="m", contents=contents, config=config)
                for p in ch.candidates[0].content.parts
            ]
        else:
            parts = (
                client.models.generate_content(model="m", contents=contents, config=config).candidates[0].content.parts
            )
        contents.append(gtypes.Content(role="model", parts=parts))
        calls = [p.function_call for p in parts if p.function_call]
        if not calls:
            break
        contents.append(
            gtypes.Content(
                role="user",
                parts=[
                    gtypes.Part(
                        function_response=gtypes.FunctionResponse(name=c.name, id=c.id, response={"output": "ok"})
                    )
                    for c in calls
                ],
            )
        )


def _chat(url: str, stream: bool) -> None:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    tools = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": SCHEMA}}]
    msgs: list = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "fix the tests"}]
    for _ in range(3):
        if stream:
            chunks = [
                c
                for c in client.chat.completions.create(model="m", messages=msgs, tools=tools, stream=True)
                if c.choices
            ]
            content = "".join(c.choices[0].delta.content or "" for c in chunks)
            calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
            msg: dict = {"role": "assistant", "content": content}
            if calls:
                msg["tool_calls"] = [
                    {"id": t.id, "type": "function", "function": t.function.model_dump()} for t in calls
                ]
        else:
            msg = (
                client.chat.completions.create(model="m", messages=msgs, tools=tools)
                .choices[0]
                .message.model_dump(exclude_none=True)
            )
        msgs.append(msg)
        if not msg.get("tool_calls"):
            break
        msgs += [{"role": "tool", "tool_call_id": t["id"], "content": "ok"} for t in msg["tool_calls"]]


DRIVERS = {"chat": _chat, "responses": _responses, "anthropic": _anthropic, "gemini": _gemini}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(DRIVERS))
def test_sdk_multi_turn_is_token_exact(tiny_model, tmp_path, dialect, stream):
    out = tmp_path / "t.jsonl"
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": SCRIPT}) as p:
        if dialect == "anthropic":
            assert httpx.head(f"{p.url}/s/ep/").status_code == 200  # Claude Code's preflight
        DRIVERS[dialect](f"{p.url}/s/ep", stream)
        p.end("ep", reward=1.0)
    (trace,) = list(read_traces(out))
    calls = trace["calls"]
    assert len(calls) == 3
    assert {c["dialect"] for c in calls} == {dialect}
    assert all(c["stream"] is stream for c in calls)
    assert [c["finish_reason"] for c in calls] == ["tool_calls", "tool_calls", "stop"]
    for k in range(1, 3):
        prev = call_prompt_ids(trace, k - 1) + calls[k - 1]["response_ids"]
        assert call_prompt_ids(trace, k)[: len(prev)] == prev
        assert calls[k]["parent"] == calls[k - 1]["call_id"]
    assert [t["name"] for t in trace["tools"]] == ["bash", "bash"], json.dumps(trace["tools"])


def test_anthropic_count_tokens(tiny_model):
    with running_proxy(tiny_model) as p:
        client = anthropic.Anthropic(base_url=f"{p.url}/s/x", api_key="unused")
        n = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello there"}])
    assert n.input_tokens > 5
