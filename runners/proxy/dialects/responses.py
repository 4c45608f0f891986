"""OpenAI Responses (`POST /v1/responses`): Codex CLI, which speaks nothing else.

Input items become chat messages: `instructions` and system/developer messages → system; a run of assistant-side
items (reasoning, assistant message, function_call) → one assistant message whose `tool_calls` are the function
calls and whose `reasoning_content` is the reasoning text; `function_call_output` → a tool message (its output a
string or a list of parts). `input_image` and `input_file` parts, in a message or in a function call's output,
are media, refused or dropped by `proxy.media` (`base.admit_media`); for a vision model an `input_image` data URL
is decoded and kept where it stands (`base.media_text`). A `namespace` tool's functions (Codex groups each MCP
server's tools so: `mcp__playwright` holding `browser_click`, …) are offered as functions named `NS__NAME`
(`mcp__playwright__browser_click`, as Claude Code names MCP tools); a call of one goes back as a function_call with
`namespace` NS and `name` NAME, and a replayed one is joined again, so the history renders as the model produced it.
Other non-function tools (web_search, custom…) are dropped: the chat template can only offer functions. Tool call ids pass through unchanged, so the
history Codex sends back names the same calls the proxy produced.
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
    join_text,
    sampling,
    sse,
)

__all__ = ["ResponsesDialect", "join_text", "merge_leading_system"]

_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def merge_leading_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join the leading run of system messages into one (chat templates treat only a first system message as
    the system prompt); later system messages stay where they are."""
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    if n < 2:
        return messages
    head = {"role": "system", "content": "\n\n".join(m["content"] for m in messages[:n])}
    return [head, *messages[n:]]


def _function(t: dict[str, Any], name: str) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if t.get("description"):
        fn["description"] = t["description"]
    fn["parameters"] = t.get("parameters") or _EMPTY_SCHEMA
    return {"type": "function", "function": fn}


def flat_name(namespace: str, name: str) -> str:
    """The function name a namespaced tool is offered under: `NS__NAME`."""
    return f"{namespace}__{name}"


def _tools(t: Any, namespaces: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """The chat functions of one Responses tool: a function, a namespace's functions (flattened; `namespaces` maps
    each flat name back), or none (web_search, custom, …)."""
    if not isinstance(t, dict):
        raise BadRequestError("each tool must be an object")
    if t.get("type") == "namespace":
        if not isinstance(t.get("name"), str) or not t["name"] or not isinstance(t.get("tools") or [], list):
            raise BadRequestError("a namespace tool needs a 'name' and a list of 'tools'")
        out = []
        for sub in t.get("tools") or []:
            for fn in _tools(sub, namespaces):  # only its function tools
                flat = flat_name(t["name"], fn["function"]["name"])
                namespaces[flat] = (t["name"], fn["function"]["name"])
                out.append(_function(fn["function"], flat))
        return out
    if t.get("type") != "function":
        return []
    if not isinstance(t.get("name"), str) or not t["name"]:
        raise BadRequestError("a function tool needs a 'name'")
    return [_function(t, t["name"])]


def _reasoning_text(item: dict[str, Any]) -> str:
    """A replayed reasoning item's text: its content, else its summary (encrypted_content is dropped)."""
    content, summary = item.get("content") or [], item.get("summary") or []
    if not isinstance(content, list) or not isinstance(summary, list):
        raise BadRequestError("a reasoning item's 'content' and 'summary' must be lists of parts")
    texts = [[p.get("text") for p in parts if isinstance(p, dict)] for parts in (content, summary)]
    if not all(isinstance(t, str) for t in texts[0] + texts[1]):
        raise BadRequestError("a reasoning item's parts need a string 'text'")
    return "".join(texts[0]) if texts[0] else "\n\n".join(texts[1])


def _messages(body: dict[str, Any], media: list[MediaPart]) -> list[dict[str, Any]]:
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequestError("'input' must be a string or a non-empty list of items")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequestError("'instructions' must be a string")
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    turn: dict[str, Any] | None = None  # the assistant message the current run of assistant-side items builds

    def assistant() -> dict[str, Any]:
        nonlocal turn
        if turn is None:
            turn = {"role": "assistant", "content": ""}
            out.append(turn)
        return turn

    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequestError(f"input[{i}]: each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "assistant":
            msg = assistant()
            msg["content"] += join_text(item.get("content"), "", f"input[{i}].content", media)
        elif kind == "message":
            role = _ROLES.get(item.get("role", ""))
            if role is None:
                raise BadRequestError(f"input[{i}].role: unknown message role {item.get('role')!r}")
            turn = None
            out.append({"role": role, "content": join_text(item.get("content"), "\n\n", f"input[{i}].content", media)})
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                msg = assistant()
                msg["reasoning_content"] = msg.get("reasoning_content", "") + text
        elif kind == "function_call":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
                raise BadRequestError("a function_call item needs 'call_id' and 'name'")
            args = item.get("arguments") or "{}"
            if not isinstance(args, str):
                raise BadRequestError("function_call 'arguments' must be a JSON string")
            if item.get("namespace") is not None and not isinstance(item["namespace"], str):
                raise BadRequestError("a function_call item's 'namespace' must be a string")
            name = flat_name(item["namespace"], item["name"]) if item.get("namespace") else item["name"]
            call = {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": args}}
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise BadRequestError("a function_call_output item needs 'call_id'")
            turn = None
            output = join_text(item.get("output"), "\n\n", f"input[{i}].output", media)
            out.append({"role": "tool", "content": output, "tool_call_id": item["call_id"]})
        else:
            raise BadRequestError(
                f"unsupported input item type {kind!r} (supported: message, function_call, "
                "function_call_output, reasoning)"
            )
    return merge_leading_system(out)


def _arguments_item(rid: str, i: int, call: dict[str, Any], req: ChatRequest | None = None) -> dict[str, Any]:
    """A function_call output item; a call of a namespaced function names its namespace apart."""
    fn = call["function"]
    item = {
        "type": "function_call",
        "id": f"fc_{rid}_{i}",
        "call_id": call["id"],
        "name": fn["name"],
        "arguments": fn.get("arguments") or "{}",
        "status": "completed",
    }
    split = (req.extra.get("namespaces") or {}).get(fn["name"]) if req is not None else None
    if split is not None:
        item["namespace"], item["name"] = split
    return item


def _reasoning_item(rid: str, text: str) -> dict[str, Any]:
    # The text goes in `content` (what the model thought) and as the one summary part (what Codex shows).
    return {
        "type": "reasoning",
        "id": f"rs_{rid}",
        "summary": [{"type": "summary_text", "text": text}] if text else [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def _message_item(rid: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": status, "content": [part]}


def _usage(result: ChatResult) -> dict[str, Any]:
    p, c = result.prompt_tokens, result.completion_tokens
    return {
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": c,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": p + c,
    }


def _rid(rid: str) -> str:
    return rid if rid.startswith("resp_") else f"resp_{rid}"


class ResponsesDialect:
    name = "responses"

    def parse(self, body: dict[str, Any], model: str | None, images: bool = False) -> ChatRequest:
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise BadRequestError("'tools' must be a list")
        namespaces: dict[str, tuple[str, str]] = {}
        functions = [f for t in tools for f in _tools(t, namespaces)]
        choice = body.get("tool_choice", "auto")
        media = MediaParts(images)
        return ChatRequest(
            model=str(body.get("model") or model or ""),
            messages=_messages(body, media),
            tools=functions if functions and choice != "none" else None,
            stream=bool(body.get("stream")),
            **sampling(body, max_tokens="max_output_tokens", temperature="temperature", top_p="top_p"),
            extra={
                "tool_choice": choice if choice in ("auto", "none", "required") else "auto",
                "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
                **({"namespaces": namespaces} if namespaces else {}),
            },
            media=media,
        )

    def output(self, result: ChatResult, rid: str, req: ChatRequest | None = None) -> list[dict[str, Any]]:
        """The output items of a finished response, in order: reasoning, message, function calls."""
        rid, reply = _rid(rid), result.reply
        status = "incomplete" if result.finish == "length" else "completed"
        items = [_reasoning_item(rid, reply.reasoning)] if reply.reasoning else []
        if reply.content:
            items.append(_message_item(rid, reply.content, status))
        items += [_arguments_item(rid, i, c, req) for i, c in enumerate(reply.tool_calls)]
        return items

    def envelope(
        self, req: ChatRequest, rid: str, created: int, output: list[dict[str, Any]], result: ChatResult | None
    ) -> dict[str, Any]:
        """The response object around `output`; in progress while `result` is None."""
        status = "in_progress" if result is None else "incomplete" if result.finish == "length" else "completed"
        return {
            "id": _rid(rid),
            "object": "response",
            "created_at": created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": req.model,
            "output": output,
            "parallel_tool_calls": req.extra.get("parallel_tool_calls", True),
            "tool_choice": req.extra.get("tool_choice", "auto"),
            "tools": [],
            "temperature": req.temperature,
            "top_p": req.top_p,
            "max_output_tokens": req.max_tokens,
            "usage": _usage(result) if result is not None else None,
        }

    def response(self, req: ChatRequest, result: ChatResult, rid: str) -> dict[str, Any]:
        return self.envelope(req, rid, int(time.time()), self.output(result, rid, req), result)

    def encoder(self, req: ChatRequest, rid: str) -> _ResponsesStream:
        return _ResponsesStream(self, req, rid)

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": _error_code(status)}}


def _error_code(status: int) -> str:
    """A code from the set the Responses API uses for failed responses."""
    return "rate_limit_exceeded" if status == 429 else "server_error" if status >= 500 else "invalid_prompt"


class _ResponsesStream:
    """Streams one response: lifecycle events, a reasoning item and a message item as deltas arrive, then the
    function calls (whole) and `response.completed` / `response.incomplete` with the full response object.

    Deltas must concatenate to a prefix of the final reasoning / text: `finish` sends whatever is missing and
    closes the open item with the final value, which is what Codex records. Reasoning that was not streamed is
    sent whole at the end; it still belongs to this assistant turn when Codex sends the items back."""

    def __init__(self, dialect: ResponsesDialect, req: ChatRequest, rid: str) -> None:
        self.dialect, self.req, self.rid = dialect, req, _rid(rid)
        self.created, self.seq = int(time.time()), 0
        self.items: list[dict[str, Any]] = []  # output items, in output_index order
        self.open: dict[str, Any] | None = None  # the reasoning or message item receiving deltas (the last item)
        self.sent = ""  # what the open item has received
        self._tmpl_item: dict[str, Any] | None = None
        self._tmpl = SSETemplate({})

    def _event(self, kind: str, **fields: Any) -> bytes:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **fields}, event=kind)

    def _at(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _open(self, item: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.items.append(item)
        self.open, self.sent = item, ""
        added = dict(item, content=[], summary=[]) if item["type"] == "reasoning" else dict(item, content=[])
        return [
            *out,
            self._event("response.output_item.added", output_index=len(self.items) - 1, item=added),
            self._event("response.content_part.added", **self._at(), part=item["content"][0]),
        ]

    def _delta(self, delta: str) -> bytes:
        self.sent += delta
        assert self.open is not None
        if self._tmpl_item is not self.open:  # one template per open item: seq and text are encoded per delta
            self._tmpl_item = self.open
            reasoning = self.open["type"] == "reasoning"
            kind = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
            data = {"type": kind, "sequence_number": HOLE, **self._at(), "delta": HOLE}
            self._tmpl = SSETemplate(data if reasoning else data | {"logprobs": []}, event=kind)
        self.seq += 1
        return self._tmpl.fill(self.seq - 1, delta)

    def _close(self, final: str | None = None, status: str = "completed") -> list[bytes]:
        """Finish the open item with `final` (or what was streamed), sending a last delta when it extends that."""
        if self.open is None:
            return []
        out = []
        text = self.sent if final is None else final
        if text.startswith(self.sent) and len(text) > len(self.sent):
            out.append(self._delta(text[len(self.sent) :]))
        at = self._at()
        item = self.items[-1] = dict(self.open, content=[dict(self.open["content"][0], text=text)])
        if item["type"] == "reasoning":
            item["summary"] = [{"type": "summary_text", "text": text}] if text else []
            out.append(self._event("response.reasoning_text.done", **at, text=text))
        else:
            item["status"] = status
            out.append(self._event("response.output_text.done", **at, text=text, logprobs=[]))
        out.append(self._event("response.content_part.done", **at, part=item["content"][0]))
        out.append(self._event("response.output_item.done", output_index=at["output_index"], item=item))
        self.open = None
        return out

    def _whole(self, item: dict[str, Any], text: str, status: str = "completed") -> list[bytes]:
        return [*self._open(item), *self._close(text, status)]

    def start(self) -> list[bytes]:
        snapshot = self.dialect.envelope(self.req, self.rid, self.created, [], None)
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def reasoning(self, delta: str) -> list[bytes]:
        if not delta:
            return []
        out = [] if self.open and self.open["type"] == "reasoning" else self._open(_reasoning_item(self.rid, ""))
        return [*out, self._delta(delta)]

    def text(self, delta: str) -> list[bytes]:
        if not delta:
            return []
        item = _message_item(self.rid, "", "in_progress")
        out = [] if self.open and self.open["type"] == "message" else self._open(item)
        return [*out, self._delta(delta)]

    def finish(self, result: ChatResult) -> list[bytes]:
        reply, status = result.reply, "incomplete" if result.finish == "length" else "completed"
        streamed = {item["type"] for item in self.items}
        out: list[bytes] = []
        if self.open is not None:
            out += self._close(reply.reasoning if self.open["type"] == "reasoning" else reply.content, status)
        if reply.reasoning and "reasoning" not in streamed:
            out += self._whole(_reasoning_item(self.rid, ""), reply.reasoning)
        if reply.content and "message" not in streamed:
            out += self._whole(_message_item(self.rid, "", "in_progress"), reply.content, status)
        for i, call in enumerate(reply.tool_calls):
            item, index = _arguments_item(self.rid, i, call, self.req), len(self.items)
            self.items.append(item)
            at = {"item_id": item["id"], "output_index": index}
            out += [
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item=dict(item, arguments="", status="in_progress"),
                ),
                self._event("response.function_call_arguments.delta", **at, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **at, arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        final = self.dialect.envelope(self.req, self.rid, self.created, self.items, result)
        out.append(self._event(f"response.{status}", response=final))
        return out

    def error(self, status: int, message: str) -> list[bytes]:
        failed = self.dialect.envelope(self.req, self.rid, self.created, self.items, None)
        failed.update(status="failed", error={"code": _error_code(status), "message": message})
        return [self._event("response.failed", response=failed)]
