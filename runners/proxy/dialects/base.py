"""The dialect protocol: one agent wire format ↔ the proxy's internal form (OpenAI-chat-shaped messages).

A dialect parses a request body into a `ChatRequest`, renders a finished `ChatResult` as its response body,
encodes a stream as SSE events, and shapes errors the way that dialect's clients expect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from hrl.runners.proxy.template import ParsedReply

__all__ = ["BadRequestError", "ChatRequest", "ChatResult", "Dialect", "StreamEncoder", "sse"]


class BadRequestError(ValueError):
    """The request body is not valid for its dialect; answered with a 400 in that dialect's error shape."""


@dataclass
class ChatRequest:
    """A request in internal form. messages/tools use OpenAI Chat Completions shapes (content as a string)."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    include_usage: bool = False
    ignore_eos: bool = False  # vLLM's extension: generate up to max_tokens whatever the model samples
    extra: dict[str, Any] = field(default_factory=dict)  # dialect-specific bits the encoder needs back


@dataclass
class ChatResult:
    """What the engine produced for a request, parsed."""

    reply: ParsedReply
    finish: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int


class StreamEncoder(Protocol):
    def start(self) -> list[bytes]: ...
    def reasoning(self, delta: str) -> list[bytes]: ...
    def text(self, delta: str) -> list[bytes]: ...
    def finish(self, result: ChatResult) -> list[bytes]: ...
    def error(self, status: int, message: str) -> list[bytes]: ...


class Dialect(Protocol):
    name: str  # "chat" | "responses" | "anthropic" | "gemini" — recorded in each call

    def parse(self, body: dict[str, Any], model: str | None) -> ChatRequest: ...
    def response(self, req: ChatRequest, result: ChatResult, rid: str) -> dict[str, Any]: ...
    def encoder(self, req: ChatRequest, rid: str) -> StreamEncoder: ...
    def error(self, status: int, message: str) -> dict[str, Any]: ...


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; `data` is JSON-encoded unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


def text_of(content: Any) -> str:
    """Flatten message content given as a string or as a list of parts into text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
        return "".join(out)
    raise BadRequestError(f"unsupported content type {type(content).__name__}")
