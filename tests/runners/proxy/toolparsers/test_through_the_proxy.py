"""Through the real proxy (scripted engine, tiny model, OpenAI SDK): a tool call that does not parse reaches the
agent as text and is flagged in the trace and the metrics; `proxy.tool_parser` picks another family's format."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from hrl.runners.metrics import TOOL_PARSE_ERRORS, step_metrics
from tests.proxy_helpers import running_proxy

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
BROKEN = 'Running it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'


def _ask(client: OpenAI, stream: bool) -> tuple[str, list]:
    msgs = [{"role": "user", "content": "list the files"}]
    if not stream:
        msg = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS).choices[0].message
        return msg.content or "", list(msg.tool_calls or [])
    text, calls = "", []
    for chunk in client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        text += (delta.content or "") if delta else ""
        calls += (delta.tool_calls or []) if delta else []
    return text, calls


@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_call_reaches_the_agent_as_text_and_is_flagged(tiny_model, stream):
    with running_proxy(tiny_model, engine_options={"turns": [BROKEN]}) as p:
        client = OpenAI(base_url=f"{p.url}/s/bad/v1", api_key="unused")
        text, calls = _ask(client, stream)
        trace = p.end("bad")
    assert calls == [] and text.strip() == BROKEN
    (call,) = trace["calls"]
    assert call["finish_reason"] == "stop" and call["tool_parse_error"].startswith("hermes:")
    assert step_metrics([trace])[TOOL_PARSE_ERRORS] == 1.0


def test_a_well_formed_call_has_no_flag(tiny_model):
    turn = {"text": "Ok.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}
    with running_proxy(tiny_model, engine_options={"turns": [turn]}) as p:
        _, calls = _ask(OpenAI(base_url=f"{p.url}/s/ok/v1", api_key="unused"), stream=False)
        trace = p.end("ok")
    assert [c.function.name for c in calls] == ["bash"]
    assert "tool_parse_error" not in trace["calls"][0] and step_metrics([trace])[TOOL_PARSE_ERRORS] == 0.0


@pytest.mark.parametrize("stream", [False, True])
def test_configured_parser_reads_its_family(tiny_model, stream):
    """The tiny model samples plain text; with `tool_parser: kimi-k2` the proxy reads Kimi-K2 markup in it."""
    turn = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
            '{"command": "ls"}<|tool_call_end|><|tool_calls_section_end|>')  # fmt: skip
    with running_proxy(tiny_model, engine_options={"turns": [turn]}, tool_parser="kimi-k2") as p:
        assert p.proxy.template.tool_parser.name == "kimi-k2"
        text, calls = _ask(OpenAI(base_url=f"{p.url}/s/k/v1", api_key="unused"), stream)
        trace = p.end("k")
    assert text == "" and trace["calls"][0]["finish_reason"] == "tool_calls"
    named = [c.function.name for c in calls if c.function and c.function.name]
    args = "".join(c.function.arguments or "" for c in calls if c.function)
    assert named == ["bash"] and json.loads(args) == {"command": "ls"}
