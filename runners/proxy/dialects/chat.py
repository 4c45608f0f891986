"""OpenAI Chat Completions (`POST /v1/chat/completions`): opencode, Qwen Code, mini-swe-agent, aider.

Content given as a list of parts is joined into text; `image_url`, `input_audio` and `file` parts (and vLLM's
`audio_url`, `video_url`) are media, refused or dropped by `proxy.media` (`base.admit_media`); for a vision model an
`image_url` data URL is decoded and kept where it stands (`base.media_text`).
"""

from __future__ import annotations

import time
from typing import Any

from hrl.runners.proxy.dialects.base import (
    HOLE,
    BadRequestError,
    ChatRequest,
    ChatResult,
    MediaPart,
    MediaParts,
    SSETemplate,
    as_object,
    sampling,
    sse,
    text_of,
)

__all__ = ["ChatDialect"]

# the sampling knobs a chat request may carry (top_k, min_p and repetition_penalty: vLLM's extensions)
_KNOBS = {k: k for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                         "frequency_penalty")}  # fmt: skip


def _message(m: Any, i: int, media: list[MediaPart]) -> dict[str, Any]:
    if not isinstance(m, dict) or "role" not in m:
        raise BadRequestError(f"messages[{i}]: each message needs a role")
    out: dict[str, Any] = {"role": m["role"], "content": text_of(m.get("content"), f"messages[{i}].content", media)}
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadRequestError(f"'tool_calls' must be a list, got {type(calls).__name__}")
    for j, c in enumerate(calls):
        if not isinstance(c, dict) or not isinstance(c.get("function"), dict) or "name" not in c["function"]:
            raise BadRequestError(f"tool_calls[{j}] must be an object with a 'function' holding a 'name'")
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id", ""),
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"},
            }
            for c in calls
        ]
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    reasoning = m.get("reasoning_content") or m.get("reasoning")  # `reasoning`: the newer name some servers use
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def _usage(result: ChatResult) -> dict[str, int]:
    p, c = result.prompt_tokens, result.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


class ChatDialect:
    name = "chat"

    def parse(self, body: dict[str, Any], model: str | None, images: bool = False) -> ChatRequest:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("'messages' must be a non-empty list")
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise BadRequestError("'tools' must be a list")
        if body.get("tool_choice") == "none":
            tools = None
        limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        media = MediaParts(images)
        return ChatRequest(
            model=str(body.get("model") or model or ""),
            messages=[_message(m, i, media) for i, m in enumerate(messages)],
            tools=tools,
            stream=bool(body.get("stream")),
            **sampling(body, max_tokens=limit, seed="seed", **_KNOBS),
            include_usage=bool(as_object(body.get("stream_options"), "stream_options").get("include_usage")),
            ignore_eos=bool(body.get("ignore_eos")),
            media=media,
        )

    def _msg(self, result: ChatResult) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": result.reply.content or None}
        if result.reply.reasoning:
            msg["reasoning_content"] = result.reply.reasoning
        if result.reply.tool_calls:
            msg["tool_calls"] = result.reply.tool_calls
        return msg

    def response(self, req: ChatRequest, result: ChatResult, rid: str) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [{"index": 0, "message": self._msg(result), "finish_reason": result.finish}],
            "usage": _usage(result),
        }

    def encoder(self, req: ChatRequest, rid: str) -> _ChatStream:
        return _ChatStream(req, rid)

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = "rate_limit_exceeded" if status == 429 else "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}


class _ChatStream:
    def __init__(self, req: ChatRequest, rid: str) -> None:
        self.req, self.rid, self.created = req, rid, int(time.time())
        self._text: SSETemplate | None = None

    def _data(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.req.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(self._data(delta, finish))

    def start(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def reasoning(self, delta: str) -> list[bytes]:
        return [self._chunk({"reasoning_content": delta})]

    def text(self, delta: str) -> list[bytes]:
        # the per-token hot path: only the text is JSON-encoded, the rest of the chunk is fixed per stream
        if self._text is None:
            self._text = SSETemplate(self._data({"content": HOLE}))
        return [self._text.fill(delta)]

    def finish(self, result: ChatResult) -> list[bytes]:
        out = [self._chunk({"tool_calls": [{"index": i, **call}]}) for i, call in enumerate(result.reply.tool_calls)]
        out.append(self._chunk({}, result.finish))
        if self.req.include_usage:
            usage = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created}
            out.append(sse({**usage, "model": self.req.model, "choices": [], "usage": _usage(result)}))
        out.append(b"data: [DONE]\n\n")
        return out

    def error(self, status: int, message: str) -> list[bytes]:
        return [sse(ChatDialect().error(status, message)), b"data: [DONE]\n\n"]
