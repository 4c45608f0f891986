"""The Responses, Anthropic and Gemini dialects: realistic agent requests → internal form, and ChatResults →
responses and streams that the official SDKs' own types and accumulators accept."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import TypeAdapter

from hrl.runners.proxy.dialects import BadRequestError, ChatRequest, ChatResult, get_dialect
from hrl.runners.proxy.template import ParsedReply

RID = "0123abcd"
CALL = {
    "id": "call_9f8e",
    "type": "function",
    "function": {"name": "shell", "arguments": '{"cmd": "echo hé > out.txt"}'},
}


def _results() -> dict[str, ChatResult]:
    return {
        "text": ChatResult(ParsedReply("Hello there, all done."), "stop", 100, 7),
        "tool": ChatResult(
            ParsedReply("Running it.", "I should run echo.", [copy.deepcopy(CALL)]), "tool_calls", 120, 30
        ),
        "bare_tool": ChatResult(
            ParsedReply("", "", [copy.deepcopy(CALL), {**copy.deepcopy(CALL), "id": "call_2"}]), "tool_calls", 9, 4
        ),
        "length": ChatResult(ParsedReply("A truncated ans", "thinking hard"), "length", 100, 16),
        "empty": ChatResult(ParsedReply(""), "stop", 5, 1),
    }


RESULTS = list(_results())


def _stream(dialect: str, result: ChatResult, req: ChatRequest) -> list[tuple[str | None, Any]]:
    """Drive an encoder the way the server does (reasoning deltas, then text deltas, then finish)."""
    enc = get_dialect(dialect).encoder(req, RID)
    raw = enc.start()
    reply = result.reply
    for i in range(0, len(reply.reasoning), 5):
        raw += enc.reasoning(reply.reasoning[i : i + 5])
    streamed = reply.content[:-3]  # the last characters only arrive with finish()
    for i in range(0, len(streamed), 4):
        raw += enc.text(streamed[i : i + 4])
    raw += enc.finish(result)
    return _events(raw)


def _events(raw: list[bytes]) -> list[tuple[str | None, Any]]:
    out = []
    for chunk in raw:
        text = chunk.decode()
        assert text.endswith("\n\n")
        lines = dict(line.split(": ", 1) for line in text.strip().split("\n"))
        out.append((lines.get("event"), json.loads(lines["data"])))
    return out


# ---- OpenAI Responses (Codex CLI) ------------------------------------------------------------------------------

CODEX_TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "cmd": {"type": "string"},
                "justification": {"type": "string"},
                "login": {"type": "boolean"},
            },
            "required": ["cmd"],
            "additionalProperties": False,
        },
    },
    {"type": "function", "name": "view_image", "description": "View a local image.", "parameters": None},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents", "tools": []},
    {"type": "web_search", "external_web_access": False},
]


def _codex_body(**over: Any) -> dict[str, Any]:
    def msg(role: str, text: str, kind: str = "input_text") -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    body = {
        "model": "fake-model",
        "instructions": "",
        "input": [
            msg("developer", "You are Codex, based on GPT-5."),
            msg("developer", "<permissions instructions>\nsandbox: danger-full-access\n</permissions instructions>"),
            msg("user", "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"),
            msg("user", "Create out.txt containing hi"),
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Plan"}],
                "content": [{"type": "reasoning_text", "text": "I should run echo."}],
                "encrypted_content": None,
            },
            {**msg("assistant", "Running it.", "output_text"), "id": "msg_1"},
            {"type": "function_call", "call_id": "call_a", "name": "exec_command", "arguments": '{"cmd":"echo hi"}'},
            {"type": "function_call", "call_id": "call_b", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
            {"type": "function_call_output", "call_id": "call_a", "output": "Chunk ID: 1\nProcess exited with code 0"},
            {"type": "function_call_output", "call_id": "call_b", "output": "out.txt\n"},
            {
                "type": "function_call",
                "call_id": "call_c",
                "name": "exec_command",
                "arguments": '{"cmd":"cat out.txt"}',
            },
            {"type": "function_call_output", "call_id": "call_c", "output": [{"type": "input_text", "text": "hi"}]},
            msg("developer", "<collaboration_mode>default</collaboration_mode>"),
        ],
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "none", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a2260d-3fcf-73e1-88f5-659755d12034",
        "client_metadata": {"originator": "codex_exec"},
    }
    return {**body, **over}


def _call(cid: str, name: str, args: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def test_responses_parses_a_codex_turn() -> None:
    req = get_dialect("responses").parse(_codex_body(), None)
    assert req.model == "fake-model"
    assert req.stream
    assert req.max_tokens is None
    assert req.messages == [
        {
            "role": "system",
            "content": "You are Codex, based on GPT-5.\n\n<permissions instructions>\nsandbox: "
            "danger-full-access\n</permissions instructions>",
        },
        {"role": "user", "content": "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"},
        {"role": "user", "content": "Create out.txt containing hi"},
        {
            "role": "assistant",
            "content": "Running it.",
            "reasoning_content": "I should run echo.",
            "tool_calls": [
                _call("call_a", "exec_command", '{"cmd":"echo hi"}'),
                _call("call_b", "exec_command", '{"cmd":"ls"}'),
            ],
        },
        {"role": "tool", "content": "Chunk ID: 1\nProcess exited with code 0", "tool_call_id": "call_a"},
        {"role": "tool", "content": "out.txt\n", "tool_call_id": "call_b"},
        {"role": "assistant", "content": "", "tool_calls": [_call("call_c", "exec_command", '{"cmd":"cat out.txt"}')]},
        {"role": "tool", "content": "hi", "tool_call_id": "call_c"},
        {"role": "system", "content": "<collaboration_mode>default</collaboration_mode>"},
    ]
    assert [t["function"]["name"] for t in req.tools or []] == ["exec_command", "view_image"]
    assert req.tools
    assert req.tools[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert req.tools[0]["function"]["parameters"] == CODEX_TOOLS[0]["parameters"]


def test_responses_string_input_instructions_and_sampling() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": "hi",
        "max_output_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
    }
    req = get_dialect("responses").parse(body, None)
    assert req.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert (req.max_tokens, req.temperature, req.top_p, req.tools, req.stream) == (50, 0.2, 0.9, None, False)
    assert get_dialect("responses").parse(_codex_body(tool_choice="none"), None).tools is None


@pytest.mark.parametrize("result", RESULTS)
def test_responses_response_and_stream_validate(result: str) -> None:
    from openai import omit
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import Response, ResponseStreamEvent

    res = _results()[result]
    dialect = get_dialect("responses")
    req = dialect.parse(_codex_body(), None)
    body = Response.model_validate(dialect.response(req, res, RID))
    assert body.status == ("incomplete" if res.finish == "length" else "completed")
    assert body.output_text == res.reply.content
    assert [(c.call_id, c.name, c.arguments) for c in body.output if c.type == "function_call"] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in res.reply.tool_calls
    ]
    assert body.usage
    assert body.usage.total_tokens == res.prompt_tokens + res.completion_tokens
    if res.finish == "length":
        assert body.incomplete_details
        assert body.incomplete_details.reason == "max_output_tokens"

    events = _stream("responses", res, req)
    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=CODEX_TOOLS, text_format=omit)  # type: ignore[arg-type]
    final = None
    for i, (name, data) in enumerate(events):
        assert name == data["type"]
        assert data["sequence_number"] == i
        for out in state.handle_event(adapter.validate_python(data)):
            if out.type in ("response.completed", "response.incomplete"):
                final = out.response
    assert [e[0] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1][0] == ("response.incomplete" if res.finish == "length" else "response.completed")
    assert final is not None
    streamed = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert streamed == res.reply.content
    # the streamed response ends exactly where the non-streamed one does
    assert _unparsed([o.model_dump() for o in final.output]) == [o.model_dump() for o in body.output]
    assert final.usage == body.usage
    assert final.status == body.status


def test_responses_reasoning_sent_at_finish_stays_in_its_turn() -> None:
    """Reasoning that was not streamed comes after the streamed message; Codex's echo still parses to the reply."""
    from openai.types.responses import Response

    dialect, res = get_dialect("responses"), _results()["tool"]
    enc = dialect.encoder(dialect.parse({"model": "m", "input": "go"}, None), RID)
    events = _events([*enc.start(), *enc.text("Running"), *enc.finish(res)])
    final = Response.model_validate(events[-1][1]["response"])
    assert [o.type for o in final.output] == ["message", "reasoning", "function_call"]
    echoed = [o.model_dump(exclude_none=True) for o in final.output]
    req = dialect.parse({"model": "m", "input": [{"role": "user", "content": "go"}, *echoed]}, None)
    assert req.messages[-1] == {
        "role": "assistant",
        "content": "Running it.",
        "reasoning_content": res.reply.reasoning,
        "tool_calls": res.reply.tool_calls,
    }


def _unparsed(obj: Any) -> Any:
    """Drop the `parsed…` fields the SDK's accumulator adds."""
    if isinstance(obj, dict):
        return {k: _unparsed(v) for k, v in obj.items() if not k.startswith("parsed")}
    return [_unparsed(v) for v in obj] if isinstance(obj, list) else obj


def test_responses_history_round_trips() -> None:
    """Codex sends the output items back as input: they parse to exactly the reply the proxy produced."""
    dialect, res = get_dialect("responses"), _results()["tool"]
    out = dialect.response(dialect.parse(_codex_body(), None), res, RID)["output"]
    req = dialect.parse({"model": "m", "input": [{"role": "user", "content": "go"}, *out]}, None)
    reply = res.reply
    assert req.messages[-1] == {
        "role": "assistant",
        "content": reply.content,
        "reasoning_content": reply.reasoning,
        "tool_calls": reply.tool_calls,
    }


def test_responses_namespace_tools_are_offered_flat_and_called_back_by_namespace() -> None:
    """Codex groups an MCP server's tools in a namespace tool: the template sees `NS__NAME` functions; the model's
    call of one goes back (whole and streamed) as a function_call naming the namespace apart, which Codex routes to
    the server; replayed, it renders as the model produced it. Other non-function tools are still dropped."""
    from openai.types.responses import Response

    click = {"type": "function", "name": "browser_click", "description": "Click.",
             "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}}  # fmt: skip
    tools = [{"type": "namespace", "name": "mcp__playwright", "description": "Playwright.", "tools": [click]},
             {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
             {"type": "web_search"}]  # fmt: skip
    dialect = get_dialect("responses")
    req = dialect.parse({"model": "m", "input": "go", "tools": tools}, None)
    assert [t["function"]["name"] for t in req.tools or []] == ["mcp__playwright__browser_click", "exec_command"]
    assert (req.tools or [])[0]["function"]["parameters"] == click["parameters"]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "mcp__playwright__browser_click", "arguments": '{"target": "e5"}'}}  # fmt: skip
    res = ChatResult(ParsedReply("", "", [call, copy.deepcopy(CALL)]), "tool_calls", 9, 4)
    out = dialect.response(req, res, RID)["output"]
    assert [(o.get("namespace"), o["name"]) for o in out] == [("mcp__playwright", "browser_click"), (None, "shell")]
    final = Response.model_validate(_stream("responses", res, req)[-1][1]["response"]).model_dump(exclude_none=True)
    assert [(o.get("namespace"), o["name"]) for o in final["output"]] == [("mcp__playwright", "browser_click"),
                                                                          (None, "shell")]  # fmt: skip
    again = dialect.parse({"model": "m", "input": [{"role": "user", "content": "go"}, *out], "tools": tools}, None)
    assert again.messages[-1]["tool_calls"] == [call, CALL]
    with pytest.raises(BadRequestError, match="namespace"):
        dialect.parse({"model": "m", "input": "go", "tools": [{"type": "namespace", "tools": [click]}]}, None)


def test_responses_errors() -> None:
    from openai.types.responses import ResponseFailedEvent
    from openai.types.shared import ErrorObject

    dialect = get_dialect("responses")
    for status, kind in [(400, "invalid_request_error"), (500, "server_error")]:
        err = ErrorObject.model_validate(dialect.error(status, "boom")["error"])
        assert (err.type, err.message) == (kind, "boom")
    enc = dialect.encoder(dialect.parse({"model": "m", "input": "hi"}, None), RID)
    enc.start()
    enc.text("partial")
    [(name, data)] = _events(enc.error(502, "engine died"))
    failed = ResponseFailedEvent.model_validate(data)
    assert name == "response.failed"
    assert failed.response.error
    assert failed.response.error.message == "engine died"
    assert failed.response.status == "failed"
    assert failed.response.error.code == "server_error"


# ---- Anthropic Messages (Claude Code) --------------------------------------------------------------------------

BASH = {
    "name": "Bash",
    "description": "Executes a given bash command and returns its output.",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}, "description": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
    },
}


def _claude_body(**over: Any) -> dict[str, Any]:
    body = {
        "model": "fake-model",
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": json.dumps({"device_id": "abc", "session_id": "s1"})},
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197;"},
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "You are an interactive agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nAs you answer, use this context.\n</system-reminder>"},
                    {"type": "text", "text": "Create out.txt containing hi", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {"role": "system", "content": "Available agent types for the Agent tool: general-purpose"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I'll use Bash.", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Running it."},
                    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "echo hé > out.txt"}},
                    {"type": "tool_use", "id": "toolu_02", "name": "Bash", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "(Bash completed with no output)"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_02",
                        "is_error": True,
                        "content": [{"type": "text", "text": "Error: no command"}, {"type": "image", "source": {}}],
                    },
                    {"type": "text", "text": "<system-reminder>Todo list is empty</system-reminder>"},
                ],
            },
        ],
        "tools": [BASH, {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
        "tool_choice": {"type": "auto"},
    }
    return {**body, **over}


def test_anthropic_parses_a_claude_code_turn() -> None:
    req = get_dialect("anthropic").parse(_claude_body(), None)
    assert (req.model, req.max_tokens, req.stream) == ("fake-model", 32000, True)
    assert [(m.at, m.kind) for m in req.media] == [("messages[3].content[1].content[1]", "image")]  # proxy.media
    assert req.messages == [
        {
            "role": "system",
            "content": "x-anthropic-billing-header: cc_version=2.1.197;\n\nYou are Claude Code, Anthropic's official "
            "CLI.\n\nYou are an interactive agent.",
        },
        {
            "role": "user",
            "content": "<system-reminder>\nAs you answer, use this context.\n</system-reminder>\n\n"
            "Create out.txt containing hi",
        },
        {"role": "system", "content": "Available agent types for the Agent tool: general-purpose"},
        {
            "role": "assistant",
            "content": "Running it.",
            "reasoning_content": "I'll use Bash.",
            "tool_calls": [
                _call("toolu_01", "Bash", '{"command": "echo hé > out.txt"}'),
                _call("toolu_02", "Bash", "{}"),
            ],
        },
        {"role": "tool", "content": "(Bash completed with no output)", "tool_call_id": "toolu_01"},
        {"role": "tool", "content": "Error: no command", "tool_call_id": "toolu_02"},
        {"role": "user", "content": "<system-reminder>Todo list is empty</system-reminder>"},
    ]
    assert req.tools == [
        {
            "type": "function",
            "function": {"name": "Bash", "description": BASH["description"], "parameters": BASH["input_schema"]},
        }
    ]


def test_anthropic_leading_system_role_merges_and_sampling() -> None:
    body = {
        "model": "m",
        "system": "Be brief.",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Agents: none"}]},
            {"role": "user", "content": "hi"},
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "stop_sequences": ["\n\nHuman:"],
        "tools": [BASH],
        "tool_choice": {"type": "none"},
    }
    req = get_dialect("anthropic").parse(body, None)
    assert req.messages == [
        {"role": "system", "content": "Be brief.\n\nAgents: none"},
        {"role": "user", "content": "hi"},
    ]
    assert (req.temperature, req.top_p, req.top_k, req.max_tokens, req.tools) == (0.5, 0.9, 20, None, None)


@pytest.mark.parametrize("result", RESULTS)
def test_anthropic_response_and_stream_validate(result: str) -> None:
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import Message, RawMessageStreamEvent

    res = _results()[result]
    dialect = get_dialect("anthropic")
    req = dialect.parse(_claude_body(), None)
    body = Message.model_validate(dialect.response(req, res, RID))
    assert body.id.startswith("msg_")
    assert body.stop_reason == {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[res.finish]
    assert "".join(b.text for b in body.content if b.type == "text") == res.reply.content
    assert [(b.id, b.name, b.input) for b in body.content if b.type == "tool_use"] == [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in res.reply.tool_calls
    ]
    assert (body.usage.input_tokens, body.usage.output_tokens) == (res.prompt_tokens, res.completion_tokens)

    events = _stream("anthropic", res, req)
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    for name, data in events:
        assert name == data["type"]
        snapshot = accumulate_event(event=adapter.validate_python(data), current_snapshot=snapshot, json_bufs=bufs)
    assert [events[0][0], *[e[0] for e in events[-2:]]] == ["message_start", "message_delta", "message_stop"]
    assert snapshot is not None
    assert Message.model_validate(snapshot.model_dump()).model_dump() == body.model_dump()


def test_anthropic_history_round_trips() -> None:
    dialect, res = get_dialect("anthropic"), _results()["tool"]
    content = dialect.response(dialect.parse(_claude_body(), None), res, RID)["content"]
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": content}]}
    reply = res.reply
    assert dialect.parse(body, None).messages[-1] == {
        "role": "assistant",
        "content": reply.content,
        "reasoning_content": reply.reasoning,
        "tool_calls": [_call(CALL["id"], "shell", json.dumps({"cmd": "echo hé > out.txt"}, ensure_ascii=False))],
    }


def test_anthropic_count_tokens_and_errors() -> None:
    from anthropic.types.shared import ErrorResponse

    dialect = get_dialect("anthropic")
    assert dialect.count_tokens_body(42) == {"input_tokens": 42}  # type: ignore[attr-defined]
    for status, kind in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (502, "api_error"),
    ]:
        err = ErrorResponse.model_validate(dialect.error(status, "boom"))
        assert (err.error.type, err.error.message) == (kind, "boom")
    [(name, data)] = _events(dialect.encoder(ChatRequest("m", []), RID).error(500, "engine died"))
    assert name == "error"
    assert ErrorResponse.model_validate(data).error.type == "api_error"


# ---- Gemini generateContent (Gemini CLI) -----------------------------------------------------------------------


def _gemini_body(**over: Any) -> dict[str, Any]:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "<session_context>\nThis is the Gemini CLI.\n</session_context>"}]},
            {"role": "user", "parts": [{"text": "Create out.txt containing hi"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "Thinking about it", "thought": True},
                    {"text": "Running "},
                    {"text": "it."},
                    {
                        "functionCall": {"id": "call_x", "name": "run_shell_command", "args": {"command": "echo hi"}},
                        "thoughtSignature": "c2ln",
                    },
                    {"functionCall": {"name": "read_file", "args": {"path": "out.txt"}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "read_file", "response": {"output": "hi\n"}}},
                    {
                        "functionResponse": {
                            "id": "call_x",
                            "name": "run_shell_command",
                            "response": {"output": "<untrusted_context>ok</untrusted_context>"},
                        }
                    },
                ],
            },
        ],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are an interactive CLI agent."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "run_shell_command",
                        "description": "Runs a shell command.",
                        "parametersJsonSchema": {
                            "type": "object",
                            "properties": {"command": {"type": "string"}},
                            "required": ["command"],
                        },
                    },
                    {
                        "name": "read_file",
                        "description": "Reads a file.",
                        "parameters": {
                            "type": "OBJECT",
                            "properties": {
                                "path": {"type": "STRING"},
                                "type": {"type": "STRING", "enum": ["TEXT", "BINARY"]},
                                "lines": {"type": "ARRAY", "items": {"type": "INTEGER"}},
                            },
                            "required": ["path"],
                        },
                    },
                ]
            },
            {"googleSearch": {}},
        ],
        "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64, "thinkingConfig": {"includeThoughts": True}},
    }
    return {**body, **over}


def test_gemini_parses_a_gemini_cli_turn() -> None:
    req = get_dialect("gemini").parse({**_gemini_body(), "stream": True}, "fake-model")
    assert (req.model, req.stream, req.temperature, req.top_p, req.top_k) == ("fake-model", True, 1, 0.95, 64)
    assert req.messages == [
        {"role": "system", "content": "You are an interactive CLI agent."},
        {"role": "user", "content": "<session_context>\nThis is the Gemini CLI.\n</session_context>"},
        {"role": "user", "content": "Create out.txt containing hi"},
        {
            "role": "assistant",
            "content": "Running it.",
            "reasoning_content": "Thinking about it",
            "tool_calls": [
                _call("call_x", "run_shell_command", '{"command": "echo hi"}'),
                _call("call_2_1", "read_file", '{"path": "out.txt"}'),
            ],
        },
        {"role": "tool", "content": '{"output": "hi\\n"}', "tool_call_id": "call_2_1"},
        {
            "role": "tool",
            "content": '{"output": "<untrusted_context>ok</untrusted_context>"}',
            "tool_call_id": "call_x",
        },
    ]
    read_file = (req.tools or [])[1]["function"]["parameters"]
    assert read_file == {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "type": {"type": "string", "enum": ["TEXT", "BINARY"]},
            "lines": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["path"],
    }
    assert len(req.tools or []) == 2
    none = {
        "toolConfig": {"functionCallingConfig": {"mode": "NONE"}},
        "generationConfig": {"maxOutputTokens": 9, "seed": 3},
    }
    req = get_dialect("gemini").parse(_gemini_body(**none), "m")
    assert (req.tools, req.max_tokens, req.seed, req.stream) == (None, 9, 3, False)


@pytest.mark.parametrize("result", RESULTS)
def test_gemini_response_and_stream_validate(result: str) -> None:
    from google.genai.types import GenerateContentResponse

    res = _results()[result]
    dialect = get_dialect("gemini")
    req = dialect.parse({**_gemini_body(), "stream": True}, "fake-model")
    body = GenerateContentResponse.model_validate(dialect.response(req, res, RID))
    cand = body.candidates[0]  # type: ignore[index]
    assert cand.finish_reason == ("MAX_TOKENS" if res.finish == "length" else "STOP")
    parts = cand.content.parts or []  # type: ignore[union-attr]
    assert "".join(p.text or "" for p in parts if not p.thought) == res.reply.content
    assert "".join(p.text or "" for p in parts if p.thought) == res.reply.reasoning
    calls = [(p.function_call.id, p.function_call.name, p.function_call.args) for p in parts if p.function_call]
    assert calls == [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in res.reply.tool_calls
    ]
    assert body.usage_metadata
    assert body.usage_metadata.total_token_count == res.prompt_tokens + res.completion_tokens

    chunks = [
        GenerateContentResponse.model_validate(data) for name, data in _stream("gemini", res, req) if name is None
    ]
    streamed = [p for c in chunks for p in c.candidates[0].content.parts]  # type: ignore[index, union-attr]
    assert "".join(p.text or "" for p in streamed if not p.thought) == res.reply.content
    assert "".join(p.text or "" for p in streamed if p.thought) == res.reply.reasoning
    assert [(p.function_call.id, p.function_call.args) for p in streamed if p.function_call] == [
        (c[0], c[2]) for c in calls
    ]
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])  # type: ignore[index]
    assert chunks[-1].candidates[0].finish_reason == cand.finish_reason  # type: ignore[index]
    assert chunks[-1].usage_metadata == body.usage_metadata


def test_gemini_history_round_trips() -> None:
    dialect, res = get_dialect("gemini"), _results()["tool"]
    content = dialect.response(dialect.parse(_gemini_body(), "m"), res, RID)["candidates"][0]["content"]
    req = dialect.parse({"contents": [{"role": "user", "parts": [{"text": "go"}]}, content]}, "m")
    reply = res.reply
    assert req.messages[-1] == {
        "role": "assistant",
        "content": reply.content,
        "reasoning_content": reply.reasoning,
        "tool_calls": [_call(CALL["id"], "shell", json.dumps({"cmd": "echo hé > out.txt"}, ensure_ascii=False))],
    }


def test_gemini_errors() -> None:
    from google.genai.errors import APIError

    dialect = get_dialect("gemini")
    for status, kind in [(400, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"), (404, "NOT_FOUND"), (500, "INTERNAL")]:
        body = dialect.error(status, "boom")
        err = APIError(status, body)
        assert (err.code, err.status, err.message) == (status, kind, "boom")
    [chunk] = dialect.encoder(ChatRequest("m", []), RID).error(500, "engine died")
    assert chunk.startswith(b'data: {"error":')  # google-genai raises on stream chunks that start like this


# ---- all three -------------------------------------------------------------------------------------------------

BODIES = {"responses": _codex_body, "anthropic": _claude_body, "gemini": _gemini_body}


@pytest.mark.parametrize("name", list(BODIES))
def test_parse_is_deterministic(name: str) -> None:
    dialect = get_dialect(name)
    a, b = dialect.parse(BODIES[name](), "m"), dialect.parse(copy.deepcopy(BODIES[name]()), "m")
    assert json.dumps([a.messages, a.tools], sort_keys=True) == json.dumps([b.messages, b.tools], sort_keys=True)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("responses", {"model": "m"}),
        ("responses", {"input": []}),
        ("responses", {"input": 3}),
        ("responses", {"input": ["hi"]}),
        ("responses", {"input": [{"type": "message", "role": "robot", "content": "x"}]}),
        ("responses", {"input": [{"type": "function_call", "name": "f"}]}),
        ("responses", {"input": [{"type": "function_call_output", "output": "x"}]}),
        ("responses", {"input": [{"type": "item_reference", "id": "x"}]}),
        ("responses", {"input": "hi", "tools": {"type": "function"}}),
        ("responses", {"input": "hi", "tools": [{"type": "function"}]}),
        ("responses", {"input": [{"role": "user", "content": 5}]}),
        ("responses", {"input": "hi", "instructions": ["x"]}),
        ("anthropic", {"model": "m"}),
        ("anthropic", {"messages": []}),
        ("anthropic", {"messages": "hi"}),
        ("anthropic", {"messages": [{"role": "robot", "content": "x"}]}),
        ("anthropic", {"messages": [{"role": "user", "content": 5}]}),
        ("anthropic", {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "input": {}}]}]}),
        ("anthropic", {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}),
        ("anthropic", {"messages": [{"role": "user", "content": "x"}], "system": 5}),
        ("anthropic", {"messages": [{"role": "user", "content": "x"}], "tools": [{"input_schema": {}}]}),
        ("gemini", {}),
        ("gemini", {"contents": []}),
        ("gemini", {"contents": [{"role": "user"}]}),
        ("gemini", {"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}),
        ("gemini", {"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}),
        ("gemini", {"contents": [{"parts": [{"functionResponse": {"response": {}}}]}]}),
        (
            "gemini",
            {"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [{"description": "d"}]}]},
        ),
        ("gemini", {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": 3}),
    ],
)
def test_malformed_bodies_are_bad_requests(name: str, body: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError):
        get_dialect(name).parse(body, "m")
