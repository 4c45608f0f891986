"""Images in, token-exactly: a vision model's image parts are served in every dialect, streaming and not, through its
official SDK, against the real proxy and the embedded engine on the tiny vision model. The proxy renders one
placeholder per image and sends the images with the token prompt; the engine expands them, and the call records the
engine's prompt ids, each image's sha256 (of the bytes sent), size and placeholder range, and the run stores each
image once (`media/<sha256>` beside the traces). The same request to a text model is a 400 naming the part."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from typing import Any

import anthropic
import numpy as np
import openai
import pytest
import torch
from google import genai
from google.genai import types as gt
from PIL import Image

from hrl.runners.proxy.dialects import get_dialect
from hrl.runners.proxy.dialects.base import BadRequestError, MediaRefusedError
from hrl.runners.trace import call_prompt_ids, read_traces
from hrl.train.tiny import TinyVisionConfig, build_tiny_vision_model
from tests.proxy_helpers import running_proxy

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
ASK = "what is in the picture?"
RUN = 2 + TinyVisionConfig().image_tokens + 1  # <fake_token_around_image> <global-img> 4 × <image> <fake_…>


def _png(shift: int, size: tuple[int, int] = (64, 48)) -> bytes:
    w, h = size
    pixels = ((np.arange(h * w * 3).reshape(h, w, 3) * 7 + shift) % 251).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


ASKED, TOOL = _png(0), _png(100, (40, 40))  # the user's image, the tool's image
SHA = {hashlib.sha256(b).hexdigest(): b for b in (ASKED, TOOL)}


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _url(raw: bytes) -> str:
    return f"data:image/png;base64,{_b64(raw)}"


# Each conversation: the user's text and image, the model's tool call, the tool's result holding an image.
def _chat(url: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": ASK},
                                     {"type": "image_url", "image_url": {"url": _url(ASKED)}}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "the file:"},
                                                           {"type": "image_url", "image_url": {"url": _url(TOOL)}}]},
    ]  # fmt: skip
    tools: Any = [{"type": "function", "function": {"name": "read", "parameters": SCHEMA}}]
    if stream:
        list(client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=6, stream=True))
    else:
        client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=6)


def _responses(url: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    items: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": ASK},
                                     {"type": "input_image", "image_url": _url(ASKED)}]},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "the file:"}, {"type": "input_image", "image_url": _url(TOOL)}]},
    ]  # fmt: skip
    tools: Any = [{"type": "function", "name": "read", "parameters": SCHEMA}]
    if stream:
        list(client.responses.create(model="m", input=items, tools=tools, max_output_tokens=6, stream=True))
    else:
        client.responses.create(model="m", input=items, tools=tools, max_output_tokens=6)


def _anthropic(url: str, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)

    def image(raw: bytes) -> dict[str, Any]:
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(raw)}}

    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": ASK}, image(ASKED)]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                      "content": [{"type": "text", "text": "the file:"}, image(TOOL)]}]},
    ]  # fmt: skip
    kwargs: Any = {"model": "m", "max_tokens": 6, "messages": messages,
                   "tools": [{"name": "read", "input_schema": SCHEMA}]}  # fmt: skip
    if stream:
        list(client.messages.create(**kwargs, stream=True))
    else:
        client.messages.create(**kwargs)


def _gemini(url: str, stream: bool) -> None:
    client = genai.Client(
        api_key="unused", http_options=gt.HttpOptions(base_url=url, retry_options=gt.HttpRetryOptions(attempts=1))
    )
    tool_image = gt.FunctionResponsePart(inline_data=gt.FunctionResponseBlob(mime_type="image/png", data=TOOL))
    contents: Any = [
        gt.Content(role="user", parts=[gt.Part(text=ASK), gt.Part(inline_data=gt.Blob(mime_type="image/png",
                                                                                      data=ASKED))]),
        gt.Content(role="model", parts=[gt.Part(function_call=gt.FunctionCall(name="read", args={}, id="c1"))]),
        gt.Content(role="user", parts=[gt.Part(function_response=gt.FunctionResponse(
            name="read", id="c1", response={"output": "the file:"}, parts=[tool_image]))]),
    ]  # fmt: skip
    tool = gt.Tool(function_declarations=[gt.FunctionDeclaration(name="read", parameters_json_schema=SCHEMA)])
    config = gt.GenerateContentConfig(
        tools=[tool], max_output_tokens=6, automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True)
    )
    if stream:
        list(client.models.generate_content_stream(model="m", contents=contents, config=config))
    else:
        client.models.generate_content(model="m", contents=contents, config=config)


DRIVERS = {"chat": _chat, "responses": _responses, "anthropic": _anthropic, "gemini": _gemini}


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vl", seed=0))


@pytest.fixture(scope="module")
def serving(vision_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("images") / "traces.jsonl"
    with running_proxy(vision_model, engine="embedded", traces=str(out), max_image_bytes=4096) as p:
        yield p, out


def _expanded_run(vision_model: str, raw: bytes) -> list[int]:
    """What transformers' own processor makes of one image placeholder: the run the engine must have recorded."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(vision_model)
    image = Image.open(io.BytesIO(raw)).convert("RGB")
    return [int(t) for t in processor(text="<image>", images=[[image]], add_special_tokens=False)["input_ids"][0]]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(DRIVERS))
def test_an_image_in_a_turn_and_in_a_tool_result_is_recorded_token_exactly(serving, vision_model, dialect, stream):
    proxy, out = serving
    token = f"img-{dialect}-{stream}"
    DRIVERS[dialect](f"{proxy.url}/s/{token}", stream)
    trace = proxy.end(token, reward=1.0)
    (call,) = trace["calls"]
    assert call["stream"] is stream and "error" not in call
    media = call["media"]
    # the user's image, then the tool's, in prompt order: sha256 of the bytes the SDK sent, their sizes
    assert [m["sha256"] for m in media] == [hashlib.sha256(ASKED).hexdigest(), hashlib.sha256(TOOL).hexdigest()]
    assert [(m["mime"], m["bytes"], m["width"], m["height"]) for m in media] == [
        ("image/png", len(ASKED), 64, 48), ("image/png", len(TOOL), 40, 40)]  # fmt: skip
    prompt = call["prompt_ids"]
    for m in media:  # each placeholder range holds the processor's run for that very image, nothing else
        offset, length = m["placeholder"]
        assert length == RUN
        assert prompt[offset : offset + length] == _expanded_run(vision_model, SHA[m["sha256"]])
    image_id = 816  # the tiny vision model's <image>: only inside the ranges (no placeholder left unexpanded)
    inside = {i for m in media for i in range(m["placeholder"][0], sum(m["placeholder"]))}
    assert {i for i, t in enumerate(prompt) if t == image_id} <= inside
    for sha, raw in SHA.items():  # stored once per run, content-addressed, beside the traces
        assert (out.parent / "media" / sha).read_bytes() == raw
    written = {t["session"]: t for t in read_traces(out)}[token]
    assert written["calls"][0]["media"] == media


def test_the_recorded_prompt_and_logprobs_are_transformers_own(serving, vision_model):
    """The engine's expanded prompt is what the processor's chat template makes of the same conversation, and the
    logprobs recorded are those of one forward of the model with the processor's pixels."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    proxy, _ = serving
    client = openai.OpenAI(base_url=f"{proxy.url}/s/ref/v1", api_key="unused", max_retries=0)
    content: Any = [{"type": "text", "text": ASK}, {"type": "image_url", "image_url": {"url": _url(ASKED)}}]
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=8)
    (call,) = proxy.end("ref", reward=0.0)["calls"]
    processor = AutoProcessor.from_pretrained(vision_model)
    image = Image.open(io.BytesIO(ASKED)).convert("RGB")
    messages = [{"role": "user", "content": [{"type": "text", "text": ASK}, {"type": "image", "image": image}]}]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")  # fmt: skip
    assert call["prompt_ids"] == inputs["input_ids"][0].tolist()
    model = AutoModelForImageTextToText.from_pretrained(vision_model).eval()
    ids = torch.tensor([call["prompt_ids"] + call["response_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=inputs["pixel_values"],
                       pixel_attention_mask=inputs["pixel_attention_mask"]).logits[0].float()  # fmt: skip
    n = len(call["prompt_ids"])
    expected = torch.log_softmax(logits[n - 1 : -1], -1).gather(-1, torch.tensor(call["response_ids"])[:, None])[:, 0]
    assert np.abs(np.array(call["response_logprobs"]) - expected.numpy()).max() < 1e-4


def test_an_image_sent_again_each_turn_extends_the_earlier_ids_and_is_stored_once(serving):
    """Three turns, each re-sending the conversation with its image, the last adding the same image again: each
    prompt extends the previous call's prompt and reply id for id (0 drift; the engine expands the same bytes the
    same way), the earlier images keep their ranges, and the run holds the image once."""
    proxy, out = serving
    client = openai.OpenAI(base_url=f"{proxy.url}/s/again/v1", api_key="unused", max_retries=0)
    image: Any = {"type": "image_url", "image_url": {"url": _url(ASKED)}}
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": ASK}, image]}]
    for seed, follow_up in enumerate(("and now?", [{"type": "text", "text": "and this one?"}, image], None)):
        # seeded: the random tiny model samples its own <image> token now and then, which the next turn refuses
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4, seed=seed)
        reply = reply.choices[0].message.content
        if follow_up is not None:
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
    trace = proxy.end("again", reward=0.0)
    calls = trace["calls"]
    assert [len(c["media"]) for c in calls] == [1, 1, 2]
    for i in (1, 2):
        before, now = calls[i - 1], calls[i]
        earlier = call_prompt_ids(trace, i - 1) + before["response_ids"]
        assert now["parent"] == before["call_id"] and now["prompt_ref"]["length"] == len(earlier)
        assert call_prompt_ids(trace, i)[: len(earlier)] == earlier  # id for id: nothing re-tokenized
        assert now["media"][: len(before["media"])] == before["media"]  # the earlier images where they were
    stored = [p.name for p in (out.parent / "media").iterdir()]  # one file per image, whatever was sent how often
    assert hashlib.sha256(ASKED).hexdigest() in stored and set(stored) <= set(SHA)


def test_a_changed_image_starts_a_new_branch(serving):
    """The same text around other bytes: the earlier ids are not reused (the message keys hold the image's hash)."""
    proxy, _ = serving
    client = openai.OpenAI(base_url=f"{proxy.url}/s/changed/v1", api_key="unused", max_retries=0)

    def turn(raw: bytes) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "text", "text": ASK}, {"type": "image_url",
                                                                         "image_url": {"url": _url(raw)}}]}  # fmt: skip

    reply = client.chat.completions.create(model="m", messages=[turn(ASKED)], max_tokens=4, seed=0)  # as above
    reply = reply.choices[0].message.content
    again = [turn(TOOL), {"role": "assistant", "content": reply}, {"role": "user", "content": "and now?"}]
    client.chat.completions.create(model="m", messages=again, max_tokens=4)
    one, two = proxy.end("changed", reward=0.0)["calls"]
    assert [m["sha256"] for m in one["media"]] == [hashlib.sha256(ASKED).hexdigest()]
    assert "parent" not in two and [m["sha256"] for m in two["media"]] == [hashlib.sha256(TOOL).hexdigest()]


def test_inspect_and_report_show_each_calls_images(serving, vision_model, tmp_path):
    import os
    import subprocess
    import sys

    proxy, out = serving
    client = openai.OpenAI(base_url=f"{proxy.url}/s/shown/v1", api_key="unused", max_retries=0)
    content: Any = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": _url(TOOL)}}]
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=2)
    trace = proxy.end("shown", reward=0.0)
    offset, length = trace["calls"][0]["media"][0]["placeholder"]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    shown = subprocess.run([sys.executable, "-m", "hrl.cli", "inspect", str(out), "--trace", trace["trace_id"],
                            "--model", vision_model], capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    sha = hashlib.sha256(TOOL).hexdigest()[:12]
    assert f"image {sha} image/png 40×40 {len(TOOL)} B: prompt tokens {offset}+{length}" in shown.stdout
    # the text shows the image once, where it was, not its expanded placeholder run decoded as words
    assert f"what is this?[image {sha} image/png 40×40]" in shown.stdout and "<image>" not in shown.stdout
    atif = subprocess.run([sys.executable, "-m", "hrl.cli", "export", str(out), "--format", "atif", "--out",
                           str(tmp_path / "atif"), "--model", vision_model], capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert atif.returncode == 0, atif.stderr
    traj = json.loads((tmp_path / "atif" / f"{trace['trace_id']}.json").read_text())
    full = hashlib.sha256(TOOL).hexdigest()
    before, image, after = traj["steps"][0]["message"]  # the prompt as decoded: the template's text around the image
    assert before["type"] == after["type"] == "text" and before["text"].endswith("what is this?")
    assert image == {"type": "image", "source": {"media_type": "image/png", "path": f"media/{full}"}}
    assert (tmp_path / "atif" / "media" / full).read_bytes() == TOOL  # where the trajectory points, the same bytes
    report = subprocess.run([sys.executable, "-m", "hrl.cli", "report", str(out), "--out", str(tmp_path / "r.html")],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert '<img src="data:image/jpeg;base64,' in html and f'alt="{full}">' in html  # the image itself, shown
    assert f"image {sha} · image/png 40×40 · {len(TOOL)} B · prompt tokens {offset}+{length}" in html


def test_count_tokens_counts_the_expanded_images(serving):
    """Anthropic's count_tokens on the embedded engine counts each image's expanded run: the prompt tokens the same
    request then reports."""
    proxy, _ = serving
    client = anthropic.Anthropic(base_url=f"{proxy.url}/s/count", api_key="unused", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(ASKED)}}
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": ASK}, image]}]
    counted = client.messages.count_tokens(model="m", messages=messages).input_tokens
    used = client.messages.create(model="m", max_tokens=2, messages=messages).usage.input_tokens
    (call,) = proxy.end("count", reward=0.0)["calls"]
    assert counted == used == len(call["prompt_ids"])


def test_limits_and_remote_urls_are_refused_naming_the_part(serving):
    proxy, _ = serving
    client = openai.OpenAI(base_url=f"{proxy.url}/s/limits/v1", api_key="unused", max_retries=0)
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3)).astype("uint8")  # PNG cannot compress it
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, "PNG")
    big = buf.getvalue()  # over the fixture's max_image_bytes of 4096
    assert len(big) > 4096
    content: Any = [{"type": "image_url", "image_url": {"url": _url(big)}}]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}])
    assert info.value.status_code == 413
    assert "messages[0].content[0]: an image of" in str(info.value) and "proxy.max_image_bytes" in str(info.value)
    remote: Any = [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[0\]: an image by remote URL"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": remote}])
    spelled: Any = [{"type": "text", "text": "<image>"}, {"type": "image_url", "image_url": {"url": _url(ASKED)}}]
    with pytest.raises(openai.BadRequestError, match="2 image placeholder tokens for 1 images"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": spelled}])
    proxy.end("limits")


def test_the_scripted_engine_plays_turns_for_a_vision_model_expanding_its_images(vision_model):
    """Offline (no weights run): the scripted engine expands the images with the model's processor, as a real
    engine would, so a harness's image calls are recorded with their ranges."""
    with running_proxy(vision_model) as proxy:
        _anthropic(f"{proxy.url}/s/scripted", stream=True)
        (call,) = proxy.end("scripted", reward=1.0)["calls"]
    assert [m["sha256"] for m in call["media"]] == [hashlib.sha256(ASKED).hexdigest(), hashlib.sha256(TOOL).hexdigest()]
    for m in call["media"]:
        offset, length = m["placeholder"]
        assert call["prompt_ids"][offset : offset + length] == _expanded_run(vision_model, SHA[m["sha256"]])


def test_a_replica_set_carries_images_and_one_replica_without_them_makes_a_400_naming_the_part(vision_model):
    """Replicas behind one proxy (`engine: replicas`, as `--placement ray` runs them): the image goes to the replica
    with the prompt and is recorded as from any engine. A set in which one replica cannot take images refuses
    them, with a 400 naming the part, since a call may land on or fail over to any replica."""
    options = {"replicas": [{"engine": "scripted"}, {"engine": "scripted"}]}
    with running_proxy(vision_model, engine="replicas", engine_options=options) as proxy:
        client = anthropic.Anthropic(base_url=f"{proxy.url}/s/x", api_key="unused", max_retries=0)
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(ASKED)}}
        messages: Any = [{"role": "user", "content": [{"type": "text", "text": ASK}, image]}]
        client.messages.create(model="m", max_tokens=4, messages=messages)
        (call,) = proxy.end("x")["calls"]
        (media,) = call["media"]
        assert media["sha256"] == hashlib.sha256(ASKED).hexdigest() and media["placeholder"][1] > 1
        assert call["image_processor"] is not None
        next(iter(proxy.proxy.engine.replicas.values())).engine.takes_images = False
        client = anthropic.Anthropic(base_url=f"{proxy.url}/s/y", api_key="unused", max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[1\]: an image part; the "
                                                           r"replicas engine cannot take images"):  # fmt: skip
            client.messages.create(model="m", max_tokens=4, messages=messages)


def test_the_same_request_to_a_text_model_is_a_400_naming_the_part(tiny_model):
    refused = pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\]: an image part .*no vision")
    with running_proxy(tiny_model) as proxy, refused:
        _chat(f"{proxy.url}/s/text", stream=False)


KEPT = [  # (dialect, body, the image's path): where each dialect keeps an image for a vision model
    ("chat", {"messages": [{"role": "tool", "tool_call_id": "c", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": _url(TOOL)}}]}]},
     "messages[0].content[1]"),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": _url(TOOL)}]}]},
     "input[0].output[1]"),
    ("anthropic", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c",
        "content": [{"type": "text", "text": "see"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": _b64(TOOL)}}]}]}]},
     "messages[0].content[0].content[1]"),
    ("gemini", {"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "read", "response": {},
        "parts": [{"inlineData": {"mimeType": "image/png", "data": _b64(TOOL)}}]}}]}]},
     "contents[0].parts[0].functionResponse.parts[0]"),
]  # fmt: skip


@pytest.mark.parametrize(("dialect", "body", "at"), KEPT, ids=[d for d, _, _ in KEPT])
def test_each_dialect_keeps_a_tool_results_image_in_the_tool_message(dialect, body, at):
    req = get_dialect(dialect).parse(body, "m", images=True)
    (image,) = req.media
    assert (image.at, image.kind, image.data, image.width) == (at, "image", TOOL, 40)
    (tool,) = [m for m in req.messages if m["role"] == "tool"]
    assert tool["content"].endswith(f"\ue000image:{hashlib.sha256(TOOL).hexdigest()}\ue001")
    assert get_dialect(dialect).parse(body, "m").media[0].data is None  # a text model's parse leaves it out


def _png_header(width: int, height: int) -> bytes:
    """A PNG's signature, header chunk and end: what PIL reads to size an image, without its pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
        + chunk(b"IEND", b"")
    )


def test_a_part_that_is_not_an_image_is_a_400():
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _url(b"%PDF")}}]}]}
    with pytest.raises(BadRequestError, match=r"messages\[0\]\.content\[0\]: the image's 4 bytes are not an image"):
        get_dialect("chat").parse(body, "m", images=True)
    bomb = _png_header(20000, 20000)  # 400M pixels declared: PIL refuses it as a decompression bomb
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _url(bomb)}}]}]}
    with pytest.raises(BadRequestError, match=r"messages\[0\]\.content\[0\]: the image's \d+ bytes are not an image"):
        get_dialect("chat").parse(body, "m", images=True)
    body = {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f1"}]}]}
    with pytest.raises(MediaRefusedError, match=r"input\[0\]\.content\[0\]: an image part without a data: URL"):
        get_dialect("responses").parse(body, "m", images=True)
