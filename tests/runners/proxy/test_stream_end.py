"""A reply cut by `max_tokens` inside a multi-byte character: the streamed text is the non-streamed text (the
incomplete bytes as U+FFFD, flushed at the end of the stream), so the agent's next request, holding that text,
continues the branch, in every dialect, through each one's official SDK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import pytest
from google import genai
from google.genai import types as gtypes
from openai import OpenAI
from transformers import AutoTokenizer

from hrl.runners.trace import call_prompt_ids
from tests.proxy_helpers import running_proxy

TURN = "ok 写 done"  # 写 is three UTF-8 bytes: byte-level BPE splits it into several tokens
FOLLOW_UP = "and then?"

# A driver sends one conversation turn: (base url, history of (role, text or the SDK's own reply), stream, max
# tokens) -> (the reply's text, what the agent keeps of the reply for its next request).
Driver = Callable[[str, list[Any], bool, int], tuple[str, Any]]


def _chat(url: str, history: list[Any], stream: bool, n: int) -> tuple[str, Any]:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    msgs = [{"role": r, "content": t} for r, t in history]
    if stream:
        chunks = client.chat.completions.create(model="m", messages=msgs, max_tokens=n, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = client.chat.completions.create(model="m", messages=msgs, max_tokens=n).choices[0].message.content or ""
    return text, ("assistant", text)


def _responses(url: str, history: list[Any], stream: bool, n: int) -> tuple[str, Any]:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    items: list[Any] = []
    for role, kept in history:
        items += kept if role == "assistant" else [{"role": role, "content": kept}]
    if stream:  # a reply cut at max tokens ends with response.incomplete (the SDK's stream helper wants completed)
        events = client.responses.create(model="m", input=items, max_output_tokens=n, stream=True)
        resp = next(
            e.response for e in reversed(list(events)) if e.type in ("response.completed", "response.incomplete")
        )
    else:
        resp = client.responses.create(model="m", input=items, max_output_tokens=n)
    return resp.output_text, ("assistant", [o.model_dump(exclude_none=True) for o in resp.output])


def _anthropic(url: str, history: list[Any], stream: bool, n: int) -> tuple[str, Any]:
    client = anthropic.Anthropic(base_url=url, api_key="unused")
    msgs = [{"role": r, "content": t} for r, t in history]
    if stream:
        with client.messages.stream(model="m", max_tokens=n, messages=msgs) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(model="m", max_tokens=n, messages=msgs)
    text = "".join(b.text for b in msg.content if b.type == "text")
    return text, ("assistant", [b.model_dump(exclude_none=True) for b in msg.content])


def _gemini(url: str, history: list[Any], stream: bool, n: int) -> tuple[str, Any]:
    client = genai.Client(api_key="unused", http_options=gtypes.HttpOptions(base_url=url))
    contents = [
        gtypes.Content(role="model" if r == "assistant" else r, parts=[gtypes.Part(text=t)]) for r, t in history
    ]
    config = gtypes.GenerateContentConfig(max_output_tokens=n)
    if stream:
        chunks = client.models.generate_content_stream(model="m", contents=contents, config=config)
        parts = [
            p
            for ch in chunks
            if ch.candidates and ch.candidates[0].content
            for p in ch.candidates[0].content.parts or []
        ]
    else:
        parts = client.models.generate_content(model="m", contents=contents, config=config).candidates[0].content.parts
    text = "".join(p.text or "" for p in parts or [])
    return text, ("assistant", text)


DRIVERS: dict[str, Driver] = {"chat": _chat, "responses": _responses, "anthropic": _anthropic, "gemini": _gemini}


def _cut_inside_a_character(model: str) -> int:
    """How many tokens of TURN end inside 写: the first prefix whose decoding ends with an incomplete character."""
    tok = AutoTokenizer.from_pretrained(model)
    ids = tok.encode(TURN, add_special_tokens=False)
    cuts = [k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd")]
    assert cuts, f"the tokenizer keeps 写 whole ({ids}): no cut inside a character to test"
    return cuts[0]


def _two_turns(model: str, dialect: str, stream: bool, n: int) -> tuple[str, dict[str, Any]]:
    """The cut reply's text, and the trace of the conversation that holds it in its next request."""
    drive = DRIVERS[dialect]
    with running_proxy(model, engine_options={"turns": [TURN, "fine."]}) as p:
        url = f"{p.url}/s/cut"
        text, kept = drive(url, [("user", "say it")], stream, n)
        drive(url, [("user", "say it"), kept, ("user", FOLLOW_UP)], stream, 8)
        trace = p.end("cut")
    return text, trace


@pytest.mark.parametrize("dialect", list(DRIVERS))
def test_a_reply_cut_inside_a_character_streams_its_last_bytes_and_the_branch_goes_on(tiny_model, dialect):
    n = _cut_inside_a_character(tiny_model)
    texts = {}
    for stream in (False, True):
        text, trace = _two_turns(tiny_model, dialect, stream, n)
        first, second = trace["calls"]
        assert first["finish_reason"] == "length" and len(first["response_ids"]) == n
        assert second.get("parent") == first["call_id"], f"stream={stream}: the follow-up started a new branch"
        prev = call_prompt_ids(trace, 0) + first["response_ids"]
        assert call_prompt_ids(trace, 1)[: len(prev)] == prev  # the sampled ids, verbatim
        texts[stream] = text
    assert texts[True] == texts[False], texts  # the agent reads the same text, streamed or not
    assert texts[True].endswith("\ufffd")  # the incomplete character, as the whole reply decodes it
