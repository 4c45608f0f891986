"""Gemini API (`POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent?alt=sse`): Gemini CLI.

The route carries what the body does not: the server passes the `{model}` of the URL as `parse`'s `model`, and
for `:streamGenerateContent` sets `body["stream"] = True` before calling `parse` (the body has no stream field).

`systemInstruction` → the system message. A `model` turn → one assistant message (text parts joined, `thought`
parts → `reasoning_content`, `functionCall` parts → `tool_calls`); a `user` turn → tool messages for its
`functionResponse` parts (content `json.dumps(response, ensure_ascii=False)`) and a user message for its text,
in part order. Calls keep the `id` they carry; a call without one gets `call_{turn}_{i}` (its position, so the
same history always converts the same), and a response without one takes the id of the earliest unanswered
call of the same name in the model turn before it. Declarations' schemas get their Gemini type names
("OBJECT", "STRING") lower-cased. `thoughtSignature`, `thinkingConfig` and `responseMimeType` are ignored.
`inlineData` and `fileData` parts, in a turn or in a `functionResponse`'s `parts`, are media (of the kind their
`mimeType` names), refused or dropped by `proxy.media` (`base.admit_media`); for a vision model an image's
`inlineData` is decoded and kept where it stands (a `functionResponse`'s after its JSON; `base.media_text`).
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
    as_object,
    media_text,
    sampling,
    sse,
)

__all__ = ["GeminiDialect"]

_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not")


def _schema(schema: Any) -> Any:
    """A JSON schema with Gemini's upper-case type names lower-cased (only `type` keys, wherever schemas nest)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            value = value.lower() if isinstance(value, str) else [t.lower() if isinstance(t, str) else t for t in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            value = {name: _schema(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            value = [_schema(sub) for sub in value]
        elif key in _SUBSCHEMAS:
            value = _schema(value)
        out[key] = value
    return out


def _parts(content: Any, at: str) -> list[dict[str, Any]]:
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise BadRequestError(f"{at}.parts: each content needs 'parts', a list of objects")
    return parts


def _text(part: dict[str, Any], at: str, media: list[MediaPart]) -> str | None:
    """A part's text (None for a part without: a call, a response, or media, which is added to `media`), its type
    checked."""
    if "text" not in part:
        return media_text(part, at, media)
    if not isinstance(part["text"], str):
        raise BadRequestError(f"{at}.text: must be a string, got {type(part['text']).__name__}")
    if not isinstance(part.get("thought", False), bool):
        raise BadRequestError(f"{at}.thought: must be a boolean, got {type(part['thought']).__name__}")
    return part["text"]  # type: ignore[no-any-return]


def _object(value: Any, at: str) -> dict[str, Any]:
    """An optional object field of a call or response part ({} when absent or null)."""
    if value is not None and not isinstance(value, dict):
        raise BadRequestError(f"{at}: must be an object, got {type(value).__name__}")
    return value or {}


def _model_turn(parts: list[dict[str, Any]], turn: int, media: list[MediaPart]) -> dict[str, Any]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        at = f"contents[{turn}].parts[{j}]"
        if "functionCall" in part:
            fc = part["functionCall"]
            if not isinstance(fc, dict) or not isinstance(fc.get("name"), str):
                raise BadRequestError(f"{at}.functionCall: a functionCall part needs a 'name'")
            args = json.dumps(_object(fc.get("args"), f"{at}.functionCall.args"), ensure_ascii=False)
            call_id = fc.get("id") or f"call_{turn}_{len(calls)}"
            calls.append({"id": call_id, "type": "function", "function": {"name": fc["name"], "arguments": args}})
        elif (text := _text(part, at, media)) is not None:
            (thoughts if part.get("thought") else texts).append(text)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if any(thoughts):
        msg["reasoning_content"] = "".join(thoughts)
    return msg


def _user_turn(
    parts: list[dict[str, Any]], turn: int, unanswered: list[tuple[str, str]], media: list[MediaPart]
) -> list[dict[str, Any]]:
    """Messages of a user turn; `unanswered` holds (name, id) of the calls before it and loses those answered."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, part in enumerate(parts):
        at = f"contents[{turn}].parts[{i}]"
        if "functionResponse" in part:
            fr = part["functionResponse"]
            if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
                raise BadRequestError(f"{at}.functionResponse: a functionResponse part needs a 'name'")
            match = next(
                (c for c in unanswered if c[1] == fr.get("id") or (not fr.get("id") and c[0] == fr["name"])), None
            )
            if match is not None:
                unanswered.remove(match)
            call_id = fr.get("id") or (match[1] if match else f"call_{turn}_{i}")
            if texts:
                out.append({"role": "user", "content": "\n\n".join(texts)})
                texts = []
            content = json.dumps(_object(fr.get("response"), f"{at}.functionResponse.response"), ensure_ascii=False)
            content += "".join(_response_media(fr, f"{at}.functionResponse", media))
            out.append({"role": "tool", "content": content, "tool_call_id": call_id})
        elif (text := _text(part, at, media)) is not None:
            texts.append(text)
    if texts or not out:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _response_media(fr: dict[str, Any], at: str, media: list[MediaPart]) -> list[str]:
    """A functionResponse's own `parts` (a tool's image or file): media, added to `media`; the marks of the images
    the model takes, which follow the response's JSON in the tool message."""
    parts = fr.get("parts")
    marks = (
        media_text(part, f"{at}.parts[{k}]", media) for k, part in enumerate(parts if isinstance(parts, list) else [])
    )
    return [m for m in marks if m is not None]


def _messages(body: dict[str, Any], media: list[MediaPart]) -> list[dict[str, Any]]:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise BadRequestError("'contents' must be a non-empty list")
    system = body.get("systemInstruction")
    if system is None or isinstance(system, str):
        text = system or ""
    else:
        parts = _parts(system, "systemInstruction")
        texts = (_text(p, f"systemInstruction.parts[{j}]", media) for j, p in enumerate(parts))
        text = "\n\n".join(t for t in texts if t is not None)
    out: list[dict[str, Any]] = [{"role": "system", "content": text}] if text else []
    unanswered: list[tuple[str, str]] = []
    for turn, content in enumerate(contents):
        parts = _parts(content, f"contents[{turn}]")
        role = content.get("role") or "user"
        if role == "model":
            msg = _model_turn(parts, turn, media)
            unanswered = [(c["function"]["name"], c["id"]) for c in msg.get("tool_calls", [])]
            out.append(msg)
        elif role in ("user", "function", "tool"):
            out += _user_turn(parts, turn, unanswered, media)
        else:
            raise BadRequestError(f"a content's role must be 'user' or 'model', not {role!r}")
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequestError("'tools' must be a list of objects")
    out = []
    for decl in (d for t in tools for d in t.get("functionDeclarations") or []):  # googleSearch & co. are dropped
        if not isinstance(decl, dict) or not isinstance(decl.get("name"), str):
            raise BadRequestError("each function declaration needs a 'name'")
        fn: dict[str, Any] = {"name": decl["name"]}
        if decl.get("description"):
            fn["description"] = decl["description"]
        fn["parameters"] = _schema(decl.get("parametersJsonSchema") or decl.get("parameters") or _EMPTY_SCHEMA)
        out.append({"type": "function", "function": fn})
    return out


def _args(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the `args` object (arguments that are not a JSON object give {})."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _calls(result: ChatResult) -> list[dict[str, Any]]:
    return [
        {"functionCall": {"id": c["id"], "name": c["function"]["name"], "args": _args(c["function"].get("arguments"))}}
        for c in result.reply.tool_calls
    ]


def _usage(result: ChatResult) -> dict[str, int]:
    p, c = result.prompt_tokens, result.completion_tokens
    return {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c}


def _chunk(req: ChatRequest, rid: str, parts: list[dict[str, Any]], result: ChatResult | None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: dict[str, Any] = {"candidates": [candidate]}
    if result is not None:
        candidate["finishReason"] = _FINISH[result.finish]
        out["usageMetadata"] = _usage(result)
    return {**out, "modelVersion": req.model, "responseId": rid}


class GeminiDialect:
    name = "gemini"

    def parse(self, body: dict[str, Any], model: str | None, images: bool = False) -> ChatRequest:
        config = as_object(body.get("generationConfig"), "generationConfig")
        tools = _tools(body)
        calling = as_object(as_object(body.get("toolConfig"), "toolConfig").get("functionCallingConfig"),
                            "toolConfig.functionCallingConfig")  # fmt: skip
        mode = calling.get("mode")
        media = MediaParts(images)
        return ChatRequest(
            model=str(model or body.get("model") or ""),
            messages=_messages(body, media),
            tools=tools if tools and mode != "NONE" else None,
            stream=bool(body.get("stream")),
            **sampling(
                config,
                max_tokens="maxOutputTokens",
                temperature="temperature",
                top_p="topP",
                top_k="topK",
                seed="seed",
                presence_penalty="presencePenalty",
                frequency_penalty="frequencyPenalty",
            ),
            media=media,
        )

    def response(self, req: ChatRequest, result: ChatResult, rid: str) -> dict[str, Any]:
        reply = result.reply
        parts = [{"text": reply.reasoning, "thought": True}] if reply.reasoning else []
        if reply.content:
            parts.append({"text": reply.content})
        return _chunk(req, rid, (parts + _calls(result)) or [{"text": ""}], result)

    def encoder(self, req: ChatRequest, rid: str) -> _GeminiStream:
        return _GeminiStream(req, rid)

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = _STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        return {"error": {"code": status, "message": message, "status": kind}}


class _GeminiStream:
    """`data:` events, each a partial GenerateContentResponse: one per delta (thought parts for reasoning), then
    a last one with what the deltas missed, the function calls, finishReason and usageMetadata.

    Deltas must concatenate to a prefix of the final reasoning / text; `finish` sends the rest."""

    def __init__(self, req: ChatRequest, rid: str) -> None:
        self.req, self.rid = req, rid
        self.sent = {"reasoning": "", "text": ""}
        self._templates: dict[str, SSETemplate] = {}

    def _send(self, kind: str, delta: str) -> list[bytes]:
        if not delta:
            return []
        self.sent[kind] += delta
        if kind not in self._templates:  # encoded once per stream: only the text is encoded per delta
            part = {"text": HOLE, "thought": True} if kind == "reasoning" else {"text": HOLE}
            self._templates[kind] = SSETemplate(_chunk(self.req, self.rid, [part], None))
        return [self._templates[kind].fill(delta)]

    def _rest(self, kind: str, final: str) -> list[dict[str, Any]]:
        sent = self.sent[kind]
        if not final.startswith(sent) or len(final) == len(sent):
            return []
        return [{"text": final[len(sent) :], "thought": True} if kind == "reasoning" else {"text": final[len(sent) :]}]

    def start(self) -> list[bytes]:
        return []

    def reasoning(self, delta: str) -> list[bytes]:
        return self._send("reasoning", delta)

    def text(self, delta: str) -> list[bytes]:
        return self._send("text", delta)

    def finish(self, result: ChatResult) -> list[bytes]:
        parts = self._rest("reasoning", result.reply.reasoning) + self._rest("text", result.reply.content)
        return [sse(_chunk(self.req, self.rid, (parts + _calls(result)) or [{"text": ""}], result))]

    def error(self, status: int, message: str) -> list[bytes]:
        return [sse(GeminiDialect().error(status, message))]
