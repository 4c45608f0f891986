"""Reasoning through the real proxy in each dialect's native field, with its official SDK, streaming and not:
chat `reasoning_content`, Responses reasoning items, Anthropic thinking blocks, Gemini thought parts. The harness
sends the reasoning back the way it received it; the proxy takes it (call 2 extends call 1), and the trace keeps
exactly the ids the engine sampled."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest
from google import genai
from google.genai import types as gtypes
from openai import OpenAI

from hrl.runners.engines.scripted import render_turn
from hrl.runners.proxy.dialects import get_dialect
from hrl.runners.proxy.template import ChatTemplate
from tests.proxy_helpers import running_proxy
from tests.runners.proxy.test_reasoning import think_open_model

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CALL = {"name": "bash", "arguments": {"command": "ls"}}
# per family: the two scripted turns (what the model samples) and what the agent must see of each:
# (reasoning, text, tool called?)
FAMILIES: dict[str, tuple[list[Any], list[tuple[str, str, bool]], dict[str, str]]] = {
    "think": (
        [
            {"text": "<think>\nThe files first.\n</think>\n\nLooking.", "tool_calls": [CALL]},
            "<think>\nAll seen.\n</think>\n\nDone: two files.",
        ],
        [("The files first.", "Looking.", True), ("All seen.", "Done: two files.", False)],
        {},
    ),
    "think-open": (
        [{"text": "The files first.\n</think>\n\nLooking.", "tool_calls": [CALL]}, "All seen.\n</think>\n\nDone."],
        [("The files first.", "Looking.", True), ("All seen.", "Done.", False)],
        {},
    ),
    "harmony": (
        [
            "<|channel|>analysis<|message|>The files first.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.bash <|constrain|>json<|message|>{"command": "ls"}',
            "<|channel|>analysis<|message|>All seen.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
        ],
        [("The files first.", "", True), ("All seen.", "Done.", False)],
        {"tool_parser": "gpt-oss", "reasoning_parser": "harmony"},
    ),
}


def _chat(url: str, stream: bool) -> list[tuple[str, str, bool]]:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    tools = [{"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}]
    msgs: list = [{"role": "user", "content": "list the files"}]
    seen = []
    for _ in range(2):
        if stream:
            chunks = list(client.chat.completions.create(model="m", messages=msgs, tools=tools, stream=True))
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            msg: dict = {"role": "assistant", "content": "".join(d.content or "" for d in deltas)}
            msg["reasoning_content"] = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
            calls = [tc for d in deltas for tc in (d.tool_calls or [])]
            if calls:
                msg["tool_calls"] = [
                    {"id": t.id, "type": "function", "function": t.function.model_dump()} for t in calls
                ]
        else:
            out = client.chat.completions.create(model="m", messages=msgs, tools=tools).choices[0].message
            msg = out.model_dump(exclude_none=True)  # reasoning_content included: the harness replays it
        seen.append((msg.get("reasoning_content", ""), msg.get("content") or "", bool(msg.get("tool_calls"))))
        msgs.append(msg)
        msgs += [{"role": "tool", "tool_call_id": t["id"], "content": "a b"} for t in msg.get("tool_calls", [])]
    return seen


def _responses(url: str, stream: bool) -> list[tuple[str, str, bool]]:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    tools = [{"type": "function", "name": "bash", "parameters": SCHEMA}]
    items: list = [{"role": "user", "content": "list the files"}]
    seen = []
    for _ in range(2):
        if stream:
            with client.responses.stream(model="m", input=items, tools=tools) as s:
                events = list(s)
                resp = s.get_final_response()
            deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
            done = [e.text for e in events if e.type == "response.reasoning_text.done"]
            assert done == ([deltas] if deltas else [])
        else:
            resp = client.responses.create(model="m", input=items, tools=tools)
        kinds = [o.type for o in resp.output]
        assert kinds[0] == "reasoning", kinds  # reasoning comes first, as the Responses API orders it
        reasoning = resp.output[0].content[0].text
        assert [p.text for p in resp.output[0].summary] == [reasoning]
        text = "".join(c.text for o in resp.output if o.type == "message" for c in o.content)
        calls = [o for o in resp.output if o.type == "function_call"]
        seen.append((reasoning, text, bool(calls)))
        items += [o.model_dump(exclude_none=True) for o in resp.output]
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "a b"} for c in calls]
    return seen


def _anthropic(url: str, stream: bool) -> list[tuple[str, str, bool]]:
    client = anthropic.Anthropic(base_url=url, api_key="unused")
    tools = [{"name": "bash", "input_schema": SCHEMA}]
    msgs: list = [{"role": "user", "content": "list the files"}]
    seen = []
    for _ in range(2):
        kwargs = {"model": "m", "max_tokens": 256, "messages": msgs, "tools": tools}
        if stream:
            with client.messages.stream(**kwargs) as s:
                events = list(s)
                msg = s.get_final_message()
            thinking = "".join(e.delta.thinking for e in events if e.type == "content_block_delta"
                               and e.delta.type == "thinking_delta")  # fmt: skip
            assert thinking == "".join(b.thinking for b in msg.content if b.type == "thinking")
        else:
            msg = client.messages.create(**kwargs)
        assert msg.content[0].type == "thinking"
        uses = [b for b in msg.content if b.type == "tool_use"]
        text = "".join(b.text for b in msg.content if b.type == "text")
        seen.append((msg.content[0].thinking, text, bool(uses)))
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        if uses:
            results = [{"type": "tool_result", "tool_use_id": b.id, "content": "a b"} for b in uses]
            msgs.append({"role": "user", "content": results})
    return seen


def _gemini(url: str, stream: bool) -> list[tuple[str, str, bool]]:
    client = genai.Client(api_key="unused", http_options=gtypes.HttpOptions(base_url=url))
    decl = gtypes.FunctionDeclaration(name="bash", parameters_json_schema=SCHEMA)
    config = gtypes.GenerateContentConfig(
        tools=[gtypes.Tool(function_declarations=[decl])],
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: list = [gtypes.Content(role="user", parts=[gtypes.Part(text="list the files")])]
    seen = []
    for _ in range(2):
        if stream:
            chunks = client.models.generate_content_stream(model="m", contents=contents, config=config)
            parts = [p for ch in chunks for p in ch.candidates[0].content.parts]
        else:
            parts = (
                client.models.generate_content(model="m", contents=contents, config=config).candidates[0].content.parts
            )
        reasoning = "".join(p.text or "" for p in parts if p.thought)
        text = "".join(p.text or "" for p in parts if not p.thought)
        calls = [p.function_call for p in parts if p.function_call]
        seen.append((reasoning, text, bool(calls)))
        contents.append(gtypes.Content(role="model", parts=parts))
        if calls:
            answers = [gtypes.Part(function_response=gtypes.FunctionResponse(name=c.name, id=c.id, response={"o": 1}))
                       for c in calls]  # fmt: skip
            contents.append(gtypes.Content(role="user", parts=answers))
    return seen


DRIVERS = {"chat": _chat, "responses": _responses, "anthropic": _anthropic, "gemini": _gemini}


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory) -> dict[str, str]:
    opened = think_open_model(tiny_model, tmp_path_factory.mktemp("think-open") / "m")
    return {"think": tiny_model, "think-open": opened, "harmony": tiny_model}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(DRIVERS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_reasoning_in_the_native_field_and_replayed(models, family, dialect, stream):
    turns, expected, config = FAMILIES[family]
    with running_proxy(models[family], engine_options={"turns": turns}, **config) as p:
        assert p.proxy.template.reasoning_parser.name == family
        seen = DRIVERS[dialect](f"{p.url}/s/r", stream)
        trace = p.end("r")
        template = p.proxy.template
    assert [(r, t.strip(), c) for r, t, c in seen] == expected  # a stream sends the newline before a call
    calls = trace["calls"]
    assert [c["finish_reason"] for c in calls] == ["tool_calls", "stop"]
    assert calls[1]["parent"] == calls[0]["call_id"]  # the replayed reasoning kept the history append-only
    assert "rejected" not in trace
    for call, turn in zip(calls, turns, strict=True):  # recorded ids: exactly what the engine sampled
        assert call["response_ids"] == template.encode(render_turn(turn, template.end_of_turn))


REPLAYS = {
    "chat": {"messages": [{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "a", "reasoning_content": "R"}]},
    "responses": {"input": [{"role": "user", "content": "q"},
                            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "R"}]},
                            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}]},
    "anthropic": {"max_tokens": 9, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "R", "signature": "s"},
                                          {"type": "redacted_thinking", "data": "opaque"},
                                          {"type": "text", "text": "a"}]}]},
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "q"}]},
                            {"role": "model", "parts": [{"text": "R", "thought": True, "thoughtSignature": "x"},
                                                        {"text": "a"}]}]},
}  # fmt: skip


@pytest.mark.parametrize("dialect", list(REPLAYS))
def test_replayed_reasoning_becomes_the_assistant_messages_reasoning(tiny_model, dialect):
    req = get_dialect(dialect).parse(REPLAYS[dialect], "m")
    assert req.messages[-1] == {"role": "assistant", "content": "a", "reasoning_content": "R"}
    rendered = ChatTemplate(tiny_model).render(req.messages)
    assert "<think>\nR\n</think>" in rendered  # this template renders it; another may drop it


MALFORMED = {
    "chat": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a",
                                                             "reasoning_content": {"x": 1}}]},
    "responses": {"input": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": 5}]},
                            {"role": "user", "content": "q"}]},
    "anthropic": {"max_tokens": 9, "messages": [{"role": "user", "content": "q"},
                                                {"role": "assistant", "content": [{"type": "thinking",
                                                                                   "thinking": ["x"]}]}]},
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "q"}]},
                            {"role": "model", "parts": [{"text": {"t": 1}, "thought": True}]}]},
}  # fmt: skip
ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages",
          "gemini": "/v1beta/models/m:generateContent"}  # fmt: skip


def test_malformed_reasoning_is_a_4xx_and_the_proxy_keeps_serving(tiny_model):
    with running_proxy(tiny_model) as p:
        for dialect, body in MALFORMED.items():
            r = httpx.post(f"{p.url}/s/bad{ROUTES[dialect]}", json=body, timeout=30)
            assert r.status_code in (200, 400), (dialect, r.status_code, r.text)  # taken as empty, or refused
        ok = httpx.post(f"{p.url}/s/ok{ROUTES['chat']}", json=REPLAYS["chat"], timeout=30)
    assert ok.status_code == 200
