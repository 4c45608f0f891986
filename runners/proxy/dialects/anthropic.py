"""Anthropic Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`): Claude Code.

`system` and system-role entries in `messages` (Claude Code's mid-conversation reminders) become system
messages where they stand, so a conversation that grows by appending still converts by appending; a leading run
of them is joined into one. A user turn's `tool_result` blocks become tool messages and its text blocks a user
message, in block order; an assistant turn's `tool_use` blocks become `tool_calls` (arguments serialised with
`json.dumps(input, ensure_ascii=False)`) and its `thinking` blocks `reasoning_content`. `image` and `document`
blocks, in a turn or in a `tool_result`'s content, are media, refused or dropped by `proxy.media`
(`base.admit_media`), but for a vision model a base64 `image` block is decoded and kept where it stands; other blocks without text (`redacted_thinking`, server tool blocks) are left out. Tool
call ids pass through unchanged both ways, so the `tool_result` blocks Claude Code sends back name the calls the
proxy produced. Every SSE event carries its `event:` line: the SDKs skip events without one.
"""

from __future__ import annotations

import json
from typing import Any

from hrl.runners.proxy.dialects.base import (
    HOLE,
    BadRequestError,
    ChatRequest,
    ChatResult,
    MediaPart,
    MediaParts,
    SSETemplate,
    join_text,
    media_text,
    part_text,
    sampling,
    sse,
)
from hrl.runners.proxy.dialects.responses import merge_leading_system

__all__ = ["AnthropicDialect"]

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _blocks(content: Any, at: str) -> list[tuple[str, dict[str, Any]]]:
    """A message's content blocks with their paths (`at`: the content's path)."""
    if isinstance(content, str):
        return [(at, {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise BadRequestError(f"{at}: must be a string or a list of content blocks")
    for j, b in enumerate(content):
        if not isinstance(b, dict):
            raise BadRequestError(f"{at}[{j}]: must be a content block (an object)")
    return [(f"{at}[{j}]", b) for j, b in enumerate(content)]


def _assistant(content: Any, at: str, media: list[MediaPart]) -> dict[str, Any]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for where, block in _blocks(content, at):
        kind = block.get("type")
        if kind == "text":
            texts.append(part_text(block, where, media) or "")
        elif kind == "thinking":  # its signature is not checked; redacted_thinking blocks are dropped
            thinking = block.get("thinking") or ""
            if not isinstance(thinking, str):
                raise BadRequestError(f"{where}.thinking: a thinking block's 'thinking' must be a string")
            thoughts.append(thinking)
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise BadRequestError(f"{where}: a tool_use block needs 'id' and 'name'")
            if not isinstance(block.get("input", {}), dict):
                raise BadRequestError(f"{where}.input: must be an object, got {type(block['input']).__name__}")
            args = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": args}}
            )
        elif (image := media_text(block, where, media)) is not None:
            texts.append(image)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if any(thoughts):
        msg["reasoning_content"] = "".join(thoughts)
    return msg


def _user(content: Any, at: str, media: list[MediaPart]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for where, block in _blocks(content, at):
        if block.get("type") == "text":
            texts.append(part_text(block, where, media) or "")
        elif block.get("type") == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise BadRequestError(f"{where}: a tool_result block needs 'tool_use_id'")
            if texts:
                out.append({"role": "user", "content": "\n\n".join(texts)})
                texts = []
            result = join_text(block.get("content"), "\n\n", f"{where}.content", media)
            out.append({"role": "tool", "content": result, "tool_call_id": block["tool_use_id"]})
        elif (image := media_text(block, where, media)) is not None:
            texts.append(image)
    if texts or not out:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _messages(body: dict[str, Any], media: list[MediaPart]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' must be a non-empty list")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise BadRequestError("'system' must be a string or a list of text blocks")
    text = join_text(system, "\n\n", "system", media)
    out: list[dict[str, Any]] = [{"role": "system", "content": text}] if text else []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        at = f"messages[{i}].content"
        if role == "user":
            out += _user(m.get("content"), at, media)
        elif role == "assistant":
            out.append(_assistant(m.get("content"), at, media))
        elif role == "system":
            out.append({"role": "system", "content": join_text(m.get("content"), "\n\n", at, media)})
        else:
            raise BadRequestError(f"messages[{i}].role: must be user, assistant or system, not {role!r}")
    return merge_leading_system(out)


def _tool(t: Any) -> dict[str, Any] | None:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise BadRequestError("each tool must be an object with a 'name'")
    if t.get("type") not in (None, "custom") or "input_schema" not in t:
        return None  # server tools (web_search_…, bash_…, text_editor_…) the template cannot offer
    fn: dict[str, Any] = {"name": t["name"]}
    if t.get("description"):
        fn["description"] = t["description"]
    fn["parameters"] = t["input_schema"]
    return {"type": "function", "function": fn}


def _input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the `input` object (arguments that are not a JSON object give {})."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": _input(fn.get("arguments"))}


def _mid(rid: str) -> str:
    return rid if rid.startswith("msg_") else f"msg_{rid}"


class AnthropicDialect:
    name = "anthropic"

    def parse(self, body: dict[str, Any], model: str | None, images: bool = False) -> ChatRequest:
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise BadRequestError("'tools' must be a list")
        functions = [f for f in (_tool(t) for t in tools) if f is not None]
        choice = body.get("tool_choice")
        none = isinstance(choice, dict) and choice.get("type") == "none"
        media = MediaParts(images)
        return ChatRequest(
            model=str(body.get("model") or model or ""),
            messages=_messages(body, media),
            tools=functions if functions and not none else None,
            stream=bool(body.get("stream")),
            **sampling(body, max_tokens="max_tokens", temperature="temperature", top_p="top_p", top_k="top_k"),
            media=media,
        )

    def response(self, req: ChatRequest, result: ChatResult, rid: str) -> dict[str, Any]:
        reply = result.reply
        content: list[dict[str, Any]] = []
        if reply.reasoning:
            content.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
        if reply.content:
            content.append({"type": "text", "text": reply.content})
        content += [_tool_use(c) for c in reply.tool_calls]
        return {
            "id": _mid(rid),
            "type": "message",
            "role": "assistant",
            "model": req.model,
            "content": content,
            "stop_reason": _STOP[result.finish],
            "stop_sequence": None,
            "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens},
        }

    def encoder(self, req: ChatRequest, rid: str) -> _AnthropicStream:
        return _AnthropicStream(req, rid)

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = _ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def count_tokens_body(self, n: int) -> dict[str, Any]:
        """The answer to `/v1/messages/count_tokens` (its body parses like a messages request without max_tokens)."""
        return {"input_tokens": n}


class _AnthropicStream:
    """message_start, one content block per kind as deltas arrive (thinking, text), the tool_use blocks whole,
    then message_delta (stop_reason, usage) and message_stop.

    Deltas must concatenate to a prefix of the final reasoning / text: `finish` sends what is missing. Set
    `req.extra["prompt_tokens"]` before `encoder()` for message_start to carry the prompt size; message_delta
    always carries the final counts."""

    def __init__(self, req: ChatRequest, rid: str) -> None:
        self.req, self.id = req, _mid(rid)
        self.index = -1  # of the last block started
        self.open: str | None = None  # type of the block receiving deltas
        self.sent = ""
        self.kinds: set[str] = set()
        self._tmpl_key: tuple[str | None, int] = (None, -1)
        self._tmpl = SSETemplate({})

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open, self.sent = block["type"], ""
        self.kinds.add(block["type"])
        return [*out, self._event("content_block_start", index=self.index, content_block=block)]

    def _delta(self, delta: str) -> bytes:
        self.sent += delta
        key = (self.open, self.index)
        if self._tmpl_key != key:  # one template per content block: only the text is encoded per delta
            inner = {"type": "thinking_delta", "thinking": HOLE} if self.open == "thinking" else None
            inner = inner or {"type": "text_delta", "text": HOLE}
            data = {"type": "content_block_delta", "index": self.index, "delta": inner}
            self._tmpl_key, self._tmpl = key, SSETemplate(data, event="content_block_delta")
        return self._tmpl.fill(delta)

    def _close(self, final: str | None = None) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if final is not None and final.startswith(self.sent) and len(final) > len(self.sent):
            out.append(self._delta(final[len(self.sent) :]))
        self.open = None
        return [*out, self._event("content_block_stop", index=self.index)]

    def _whole(self, block: dict[str, Any], text: str) -> list[bytes]:
        return [*self._open(block), *self._close(text)]

    def start(self) -> list[bytes]:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.req.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": int(self.req.extra.get("prompt_tokens", 0)), "output_tokens": 0},
        }
        return [self._event("message_start", message=message)]

    def reasoning(self, delta: str) -> list[bytes]:
        if not delta:
            return []
        out = [] if self.open == "thinking" else self._open({"type": "thinking", "thinking": "", "signature": ""})
        return [*out, self._delta(delta)]

    def text(self, delta: str) -> list[bytes]:
        if not delta:
            return []
        out = [] if self.open == "text" else self._open({"type": "text", "text": ""})
        return [*out, self._delta(delta)]

    def finish(self, result: ChatResult) -> list[bytes]:
        reply, kinds = result.reply, set(self.kinds)
        out = self._close(reply.reasoning if self.open == "thinking" else reply.content)
        if reply.reasoning and "thinking" not in kinds:
            out += self._whole({"type": "thinking", "thinking": "", "signature": ""}, reply.reasoning)
        if reply.content and "text" not in kinds:
            out += self._whole({"type": "text", "text": ""}, reply.content)
        for call in reply.tool_calls:
            block = _tool_use(call)
            args = json.dumps(block["input"], ensure_ascii=False)
            out += self._open(dict(block, input={}))
            out.append(
                self._event(
                    "content_block_delta", index=self.index, delta={"type": "input_json_delta", "partial_json": args}
                )
            )
            out += self._close()
        usage = {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}
        delta = {"stop_reason": _STOP[result.finish], "stop_sequence": None}
        return [*out, self._event("message_delta", delta=delta, usage=usage), self._event("message_stop")]

    def error(self, status: int, message: str) -> list[bytes]:
        return [sse(AnthropicDialect().error(status, message), event="error")]
