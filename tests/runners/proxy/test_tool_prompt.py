"""A chat template that cannot show tools (plain ChatML, as SmolLM2's) never drops a request's tools silently: under
`proxy.tool_prompt: auto` (hermes) the proxy shows them in the Hermes tool prompt, reads the replies with the hermes
parser and records `tool_prompt: hermes` with the call, in every dialect, multi-turn token-exactly; under `refuse` the
request is a 400 naming the setting. A template that shows tools renders what it rendered before."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from hrl.runners.proxy.template import ChatTemplate
from hrl.runners.proxy.toolprompt import hermes_tool_messages, template_shows_tools
from hrl.runners.trace import call_prompt_ids
from tests.proxy_helpers import PLAIN_CHATML, TOOLS, running_proxy

SCRIPT = [
    {"tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]},
    "Two files: m.py and tests/.",
]
BASH = TOOLS[0]["function"]


@pytest.fixture(scope="module")
def chatml_model(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model with SmolLM2's template, which shows no tool."""
    out = tmp_path_factory.mktemp("chatml") / "model"
    shutil.copytree(tiny_model, out)
    (out / "chat_template.jinja").write_text(PLAIN_CHATML)
    return str(out)


def test_a_template_that_ignores_tools_is_told_apart(tiny_model: str, chatml_model: str) -> None:
    plain, tools = ChatTemplate(chatml_model), ChatTemplate(tiny_model)
    assert not plain.shows_tools and not template_shows_tools(plain.tokenizer)
    assert tools.shows_tools and template_shows_tools(tools.tokenizer)
    assert plain.tool_parser.name == "hermes"  # the format the tool prompt asks for


def test_the_hermes_tool_prompt_and_history() -> None:
    msgs = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "fix m.py"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
                {"id": "b", "type": "function", "function": {"name": "bash", "arguments": {"command": "pwd"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "m.py"},
        {"role": "tool", "tool_call_id": "b", "content": "/w"},
        {"role": "user", "content": "go on"},
    ]
    out = hermes_tool_messages(msgs, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "user"]
    system = out[0]["content"]
    assert system.startswith("You fix bugs.\n\n# Tools\n\n") and "<tools>\n{" in system
    assert '"name": "bash"' in system and "(写文件)" in system and "within <tool_call></tool_call> XML tags" in system
    assert out[2] == {"role": "assistant", "content": 'Looking.\n<tool_call>\n{"name": "bash", "arguments": '
                      '{"command": "ls"}}\n</tool_call>\n<tool_call>\n{"name": "bash", "arguments": {"command": '
                      '"pwd"}}\n</tool_call>'}  # fmt: skip
    assert out[3] == {"role": "user", "content": "<tool_response>\nm.py\n</tool_response>\n<tool_response>\n/w\n"
                      "</tool_response>"}  # fmt: skip
    assert hermes_tool_messages(msgs[1:2], TOOLS)[0]["role"] == "system"  # none: a system message of its own
    for n in range(1, len(msgs)):  # append-only: a message (other than a tool result, which joins the last) adds one
        if msgs[n]["role"] != "tool":
            assert hermes_tool_messages(msgs[: n + 1], TOOLS)[:-1] == hermes_tool_messages(msgs[:n], TOOLS)


def _chat(url: str, token: str, messages: list[dict]) -> dict:
    r = httpx.post(f"{url}/s/{token}/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS[:1]},
                   timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def test_tools_are_shown_in_the_hermes_tool_prompt_multi_turn_exactly(chatml_model: str) -> None:
    with running_proxy(chatml_model, engine_options={"turns": SCRIPT}) as p:
        template = p.proxy.template
        msgs = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "list the files"}]
        first = _chat(p.url, "t1", msgs)["choices"][0]
        assert first["finish_reason"] == "tool_calls"  # the hermes parser read the reply
        (call,) = first["message"]["tool_calls"]
        assert call["function"]["name"] == "bash"
        msgs += [first["message"], {"role": "tool", "tool_call_id": call["id"], "content": "m.py\ntests/"}]
        second = _chat(p.url, "t1", msgs)["choices"][0]
        assert second["message"]["content"].startswith("Two files")
        trace = p.end("t1")
    calls = trace["calls"]
    assert [c.get("tool_prompt") for c in calls] == ["hermes", "hermes"]
    prompt = template.decode(call_prompt_ids(trace, 0))
    assert prompt.startswith("<|im_start|>system\nYou fix bugs.\n\n# Tools\n") and '"name": "bash"' in prompt
    assert "<tool_call>" in prompt and "SmolLM" not in prompt
    full = call_prompt_ids(trace, 0) + calls[0]["response_ids"]
    assert call_prompt_ids(trace, 1)[: len(full)] == full  # the sampled ids, reused verbatim
    assert calls[1]["parent"] == calls[0]["call_id"]
    second_prompt = template.decode(call_prompt_ids(trace, 1))
    assert second_prompt.endswith("<|im_start|>user\n<tool_response>\nm.py\ntests/\n</tool_response><|im_end|>\n"
                                  "<|im_start|>assistant\n")  # fmt: skip
    # the prompt is exactly what the template renders of the injected conversation (nothing else added)
    assert call_prompt_ids(trace, 0) == template.encode(template.render(msgs[:2], TOOLS[:1]))


SCHEMA = BASH["parameters"]
BODIES = {
    "responses": ("v1/responses", {"model": "m", "input": "list the files", "tools": [
        {"type": "function", "name": "bash", "description": BASH["description"], "parameters": SCHEMA}]}),
    "anthropic": ("v1/messages", {"model": "m", "max_tokens": 64, "messages": [
        {"role": "user", "content": "list the files"}], "tools": [
        {"name": "bash", "description": BASH["description"], "input_schema": SCHEMA}]}),
    "gemini": ("v1beta/models/m:generateContent", {"contents": [
        {"role": "user", "parts": [{"text": "list the files"}]}], "tools": [
        {"functionDeclarations": [{"name": "bash", "description": BASH["description"], "parameters": SCHEMA}]}]}),
}  # fmt: skip


def test_every_dialect_shows_the_tools(chatml_model: str) -> None:
    with running_proxy(chatml_model, engine_options={"turns": SCRIPT}) as p:
        for name, (path, body) in BODIES.items():
            r = httpx.post(f"{p.url}/s/{name}/{path}", json=body, timeout=60)
            assert r.status_code == 200, (name, r.text)
            assert "bash" in r.text and "ls -la" in r.text, (name, r.text)  # the reply's tool call
            trace = p.end(name)
            (call,) = trace["calls"]
            assert call["dialect"] == name and call["tool_prompt"] == "hermes"
            assert call["finish_reason"] == "tool_calls"
            assert "<tools>\n" in p.proxy.template.decode(call_prompt_ids(trace, 0))


def test_refuse_is_a_400_naming_the_setting(chatml_model: str) -> None:
    with running_proxy(chatml_model, engine_options={"turns": SCRIPT}, tool_prompt="refuse") as p:
        body = {"model": "m", "messages": [{"role": "user", "content": "list the files"}], "tools": TOOLS[:1]}
        r = httpx.post(f"{p.url}/s/r/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "cannot show tools" in message and "proxy.tool_prompt" in message and chatml_model in message
        assert "malformed" not in message
        anthropic = {
            "model": "m",
            "max_tokens": 8,
            "messages": body["messages"],
            "tools": BODIES["anthropic"][1]["tools"],
        }
        assert httpx.post(f"{p.url}/s/r/v1/messages/count_tokens", json=anthropic, timeout=60).status_code == 400
        plain = httpx.post(f"{p.url}/s/r/v1/chat/completions", json={**body, "tools": None}, timeout=60)
        assert plain.status_code == 200, plain.text  # without tools: served as ever
        trace = p.end("r")
    assert len(trace["calls"]) == 1 and "tool_prompt" not in trace["calls"][0]
    assert trace["metadata"]["rejected_requests"] == 2


def test_a_template_that_shows_tools_is_used_as_it_is(tiny_model: str) -> None:
    with running_proxy(tiny_model, engine_options={"turns": SCRIPT}, tool_prompt="refuse") as p:
        assert p.proxy.template.shows_tools  # refuse changes nothing for it
        msgs = [{"role": "user", "content": "list the files"}]
        assert _chat(p.url, "s", msgs)["choices"][0]["finish_reason"] == "tool_calls"
        trace = p.end("s")
        tok = p.proxy.template.tokenizer
    (call,) = trace["calls"]
    assert "tool_prompt" not in call
    rendered = tok.apply_chat_template(msgs, tools=TOOLS[:1], add_generation_prompt=True, tokenize=False)
    assert call["prompt_ids"] == tok.encode(rendered, add_special_tokens=False)


def test_the_verdict_is_cached_per_template(chatml_model: str) -> None:
    from hrl.runners.proxy import toolprompt as module

    ChatTemplate(chatml_model)
    assert module._shows_tools[Path(chatml_model, "chat_template.jinja").read_text()] is False
