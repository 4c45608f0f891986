"""Media in requests (images, documents, audio): every dialect through its official SDK, streaming and not, against
the real proxy. By default (`proxy.media: refuse`) a request holding media is a 400 in the dialect's error shape
naming the part; with `proxy.media: drop` it is answered without the media, and the call and the trace count what
was dropped. Parts that are not media (cache_control text, thinking, thoughtSignature, reasoning items) parse as
before, so the agent CLIs' ordinary text traffic is untouched."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as gerrors
from google.genai import types as gt

from hrl.runners.proxy.dialects import get_dialect
from hrl.runners.proxy.dialects.base import MediaPart, MediaRefusedError, admit_media
from hrl.runners.trace import read_traces
from tests.proxy_helpers import running_proxy

PNG = b"\x89PNG\r\n\x1a\n"  # a PNG's signature: what the proxy sees of an image is only that it is one
PNG_B64 = base64.b64encode(PNG).decode()
PDF_URL = "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.4").decode()
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
ASK = "what is in the picture?"

# Each conversation holds an image in the user's first turn, then a tool call whose result is a document: the
# refusal names the first part by its path, and a drop counts both.
FIRST = {
    "chat": "messages[0].content[1]",
    "responses": "input[0].content[1]",
    "anthropic": "messages[0].content[1]",
    "gemini": "contents[0].parts[1]",
}


def _chat(url: str, stream: bool) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": ASK},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "file", "file": {"file_data": PDF_URL,
                                                                                   "filename": "a.pdf"}}]},
    ]  # fmt: skip
    tools: Any = [{"type": "function", "function": {"name": "read", "parameters": SCHEMA}}]
    if stream:
        chunks = client.chat.completions.create(model="m", messages=messages, tools=tools, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return client.chat.completions.create(model="m", messages=messages, tools=tools).choices[0].message.content or ""


def _responses(url: str, stream: bool) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    items: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": ASK},
                                     {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}"}]},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_file", "file_data": PDF_URL, "filename": "a.pdf"}]},
    ]  # fmt: skip
    tools: Any = [{"type": "function", "name": "read", "parameters": SCHEMA}]
    if stream:
        events = client.responses.create(model="m", input=items, tools=tools, stream=True)
        return "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return client.responses.create(model="m", input=items, tools=tools).output_text


def _anthropic(url: str, stream: bool) -> str:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a memo"}}
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": ASK}, image]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [document]}]},
    ]
    kwargs: Any = {"model": "m", "max_tokens": 64, "messages": messages,
                   "tools": [{"name": "read", "input_schema": SCHEMA}]}  # fmt: skip
    if stream:
        events = client.messages.create(**kwargs, stream=True)
        return "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    return "".join(b.text for b in client.messages.create(**kwargs).content if b.type == "text")


def _gemini(url: str, stream: bool) -> str:
    client = genai.Client(
        api_key="unused", http_options=gt.HttpOptions(base_url=url, retry_options=gt.HttpRetryOptions(attempts=1))
    )
    pdf = gt.FunctionResponsePart(
        file_data=gt.FunctionResponseFileData(file_uri="gs://b/a.pdf", mime_type="application/pdf")
    )
    contents: Any = [
        gt.Content(role="user", parts=[gt.Part(text=ASK), gt.Part(inline_data=gt.Blob(mime_type="image/png", data=PNG))]),
        gt.Content(role="model", parts=[gt.Part(function_call=gt.FunctionCall(name="read", args={}, id="c1"))]),
        gt.Content(role="user", parts=[gt.Part(function_response=gt.FunctionResponse(
            name="read", id="c1", response={"output": "attached"}, parts=[pdf]))]),
    ]  # fmt: skip
    tool = gt.Tool(function_declarations=[gt.FunctionDeclaration(name="read", parameters_json_schema=SCHEMA)])
    config = gt.GenerateContentConfig(
        tools=[tool], automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True)
    )
    if stream:
        chunks = client.models.generate_content_stream(model="m", contents=contents, config=config)
        return "".join(p.text or "" for ch in chunks for p in ch.candidates[0].content.parts)
    return client.models.generate_content(model="m", contents=contents, config=config).text or ""


DRIVERS = {"chat": _chat, "responses": _responses, "anthropic": _anthropic, "gemini": _gemini}


def _refusal(e: Exception) -> tuple[int, str]:
    """The status and message of an SDK's error, read from the dialect's own error shape."""
    if isinstance(e, anthropic.APIStatusError):
        body: Any = e.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return e.status_code, body["error"]["message"]
    if isinstance(e, openai.APIStatusError):  # chat and responses: {"error": {message, type, param, code}}
        body = e.body
        assert body["type"] == "invalid_request_error"
        return e.status_code, body["message"]
    assert isinstance(e, gerrors.APIError) and e.status == "INVALID_ARGUMENT"
    return e.code, e.message or ""


@pytest.fixture(scope="module")
def refusing(tiny_model):
    with running_proxy(tiny_model) as p:
        yield p


@pytest.fixture(scope="module")
def dropping(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("media") / "traces.jsonl"
    with running_proxy(tiny_model, traces=str(out), media="drop") as p:
        yield p, out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(DRIVERS))
def test_media_is_refused_naming_the_part(refusing, dialect, stream):
    token = f"refuse-{dialect}-{stream}"
    with pytest.raises((openai.APIStatusError, anthropic.APIStatusError, gerrors.APIError)) as info:
        DRIVERS[dialect](f"{refusing.url}/s/{token}", stream)
    status, message = _refusal(info.value)
    assert status == 400
    assert message == (
        f"{FIRST[dialect]}: an image part (and 1 more media part); this model has no vision input "
        "(set proxy.media: drop to drop media and flag the trace)"
    )
    trace = refusing.end(token)
    assert trace["calls"] == []  # nothing reached the engine
    assert [(r["status"], r["error"]) for r in trace["rejected"]] == [(400, message)]


def test_count_tokens_refuses_media_too(refusing):
    client = anthropic.Anthropic(base_url=f"{refusing.url}/s/count", api_key="unused", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\]: an image part;"):
        client.messages.count_tokens(model="m", messages=[{"role": "user", "content": [image]}])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(DRIVERS))
def test_dropped_media_is_counted_in_the_call_and_the_trace(dropping, dialect, stream):
    proxy, out = dropping
    token = f"drop-{dialect}-{stream}"
    assert DRIVERS[dialect](f"{proxy.url}/s/{token}", stream) == "Done."  # the scripted engine's reply
    trace = proxy.end(token, reward=1.0)
    (call,) = trace["calls"]
    assert call["finish_reason"] == "stop" and call["stream"] is stream
    assert call["dropped_media"] == {"image": 1, "document": 1}
    assert trace["dropped_media"] == {"image": 1, "document": 1}
    written = {t["session"]: t for t in read_traces(out)}
    assert written[token]["dropped_media"] == {"image": 1, "document": 1}  # what the file holds, re-read


def test_a_text_only_call_has_no_dropped_media(dropping):
    proxy, _ = dropping
    client = openai.OpenAI(base_url=f"{proxy.url}/s/text/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    trace = proxy.end("text", reward=0.0)
    assert "dropped_media" not in trace and "dropped_media" not in trace["calls"][0]


def test_inspect_and_report_show_the_dropped_media(dropping, tmp_path):
    proxy, out = dropping
    client = openai.OpenAI(base_url=f"{proxy.url}/s/shown/v1", api_key="unused", max_retries=0)
    image = {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}"}
    client.responses.create(model="m", input=[{"role": "user", "content": [image, image]}])
    trace_id = proxy.end("shown", reward=1.0)["trace_id"]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    hrl = [sys.executable, "-m", "hrl.cli"]
    shown = subprocess.run([*hrl, "inspect", str(out), "--trace", trace_id], capture_output=True, text=True,
                           timeout=60, env=env)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "dropped media (proxy.media: drop): 2 images" in shown.stdout  # the call
    assert "dropped media: 2 images (left out of training by default)" in shown.stdout  # the trace
    report = subprocess.run([*hrl, "report", str(out), "--out", str(tmp_path / "r.html"), "--json"],
                            capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert report.returncode == 0, report.stderr
    flagged = sum(1 for t in read_traces(out) if t.get("dropped_media"))
    assert flagged >= 1 and json.loads(report.stdout)["dropped_media"] == flagged
    assert "dropped media: 2 images" in (tmp_path / "r.html").read_text()


# ---- parsing: where each dialect finds media, and what is not media ----------------------------------------

_B64 = {"type": "base64", "media_type": "image/png", "data": PNG_B64}
NESTED = [  # (dialect, body, the media parts the parse finds)
    ("chat", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
     [MediaPart("messages[0].content[0]", "audio")]),
    ("chat", {"messages": [{"role": "tool", "tool_call_id": "c", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
     [MediaPart("messages[0].content[1]", "image")]),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "https://x/y.png"}]}]},
     [MediaPart("input[0].output[1]", "image")]),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f1"}]}]},
     [MediaPart("input[0].content[0]", "document")]),
    ("anthropic", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c",
        "content": [{"type": "text", "text": "see"}, {"type": "image", "source": _B64}]}]}]},
     [MediaPart("messages[0].content[0].content[1]", "image")]),
    ("anthropic", {"system": [{"type": "text", "text": "s"}], "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]}]},
     [MediaPart("messages[0].content[0]", "document")]),
    ("gemini", {"contents": [{"role": "user", "parts": [
        {"inlineData": {"mimeType": "audio/wav", "data": "AAAA"}},
        {"fileData": {"mimeType": "video/mp4", "fileUri": "gs://b/v.mp4"}}]}]},
     [MediaPart("contents[0].parts[0]", "audio"), MediaPart("contents[0].parts[1]", "video")]),
    ("gemini", {"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "read", "response": {},
        "parts": [{"inlineData": {"mimeType": "image/png", "data": PNG_B64}}]}}]}]},
     [MediaPart("contents[0].parts[0].functionResponse.parts[0]", "image")]),
]  # fmt: skip


@pytest.mark.parametrize(("dialect", "body", "found"), NESTED, ids=[f"{d}-{i}" for i, (d, _, _) in enumerate(NESTED)])
def test_each_dialect_finds_media_wherever_content_is_flattened(dialect, body, found):
    req = get_dialect(dialect).parse(body, "m")
    assert req.media == found
    with pytest.raises(MediaRefusedError, match=f"^{re.escape(found[0].at)}: "):  # the first part, by its path
        admit_media(req.media, "refuse")
    counts = admit_media(req.media, "drop")
    assert counts == {p.kind: sum(q.kind == p.kind for q in found) for p in found}  # audio and video keep own keys


TEXT_ONLY = {  # what the agent CLIs send in ordinary text use (see the dialects' docstrings)
    "chat": {"messages": [{"role": "system", "content": [{"type": "text", "text": "s"}]},
                          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                          {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]},
    "responses": {"input": [
        {"role": "developer", "content": "rules"}, {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "encrypted_content": "x"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}]},
    "anthropic": {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "sig"},
                                          {"type": "redacted_thinking", "data": "x"},
                                          {"type": "tool_use", "id": "c", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c",
                                      "content": [{"type": "text", "text": "out"}]}]}]},
    "gemini": {"systemInstruction": {"parts": [{"text": "s"}]}, "contents": [
        {"role": "user", "parts": [{"text": "a"}]},
        {"role": "model", "parts": [{"text": "t", "thought": True, "thoughtSignature": "sig"},
                                    {"functionCall": {"name": "bash", "args": {}}, "thoughtSignature": "sig"}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "bash", "response": {"output": "x"}}}]}]},
}  # fmt: skip


@pytest.mark.parametrize("dialect", list(TEXT_ONLY))
def test_parts_that_are_not_media_pass_as_before(dialect):
    req = get_dialect(dialect).parse(TEXT_ONLY[dialect], "m")
    assert req.media == []
    assert admit_media(req.media, "refuse") == {}
    assert req.messages  # parsed into text as it always was


def test_the_refusal_names_the_input_the_model_lacks():
    for kind, text in (("document", "a document part; this model has no document input"),
                       ("audio", "an audio part; this model has no audio input")):  # fmt: skip
        with pytest.raises(MediaRefusedError, match=f"^x: {text} "):
            admit_media([MediaPart("x", kind)], "refuse")
