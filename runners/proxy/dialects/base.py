"""The dialect protocol: one agent wire format ↔ the proxy's internal form (OpenAI-chat-shaped messages).

A dialect parses a request body into a `ChatRequest`, renders a finished `ChatResult` as its response body,
encodes a stream as SSE events, and shapes errors the way that dialect's clients expect.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass, field
from typing import Any, Protocol

from hrl.config import MediaPolicy
from hrl.runners.proxy.jsonio import dumps
from hrl.runners.proxy.template import IMAGE_MARK, ParsedReply, image_mark
from hrl.runners.proxy.toolprompt import ToolsRefusedError

__all__ = [
    "HOLE",
    "IMAGE_MARK",
    "MEDIA_PARTS",
    "TEXT_PARTS",
    "BadRequestError",
    "ChatRequest",
    "ChatResult",
    "Dialect",
    "MediaPart",
    "MediaParts",
    "MediaPolicy",
    "MediaRefusedError",
    "SSETemplate",
    "StreamEncoder",
    "ToolsRefusedError",
    "admit_media",
    "as_object",
    "check_request",
    "image_mark",
    "join_text",
    "media_counts",
    "media_kind",
    "media_text",
    "note_media",
    "part_text",
    "sampling",
    "sse",
    "text_bytes",
    "text_of",
]


class BadRequestError(ValueError):
    """The request body is not valid for its dialect; answered with a 400 in that dialect's error shape."""


class MediaRefusedError(BadRequestError):
    """The request holds media (an image, a document, audio, video) the served model cannot take, and
    `proxy.media` is `refuse`: a 400 in the dialect's error shape naming the part."""


@dataclass(frozen=True)
class MediaPart:
    """A media part a dialect found while flattening a request into text: left out of that text, or, for an image
    the served model takes (`MediaParts.images`), decoded and marked in the text where it stands (`image_mark`)."""

    at: str  # its path in the dialect's own names, e.g. messages[2].content[1]
    kind: str  # image | document | audio | video
    data: bytes | None = field(default=None, repr=False)  # an image's bytes, when the model takes it; else None
    mime: str = ""
    sha256: str = ""
    width: int = 0
    height: int = 0


class MediaParts(list[MediaPart]):
    """The media parts a parse finds. `images`: the served model takes images, so image parts are decoded and kept
    (marked in the text) instead of left out; other media are left out as before."""

    def __init__(self, images: bool = False) -> None:
        super().__init__()
        self.images = images


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
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    include_usage: bool = False
    ignore_eos: bool = False  # vLLM's extension: generate up to max_tokens whatever the model samples
    extra: dict[str, Any] = field(default_factory=dict)  # dialect-specific bits the encoder needs back
    media: list[MediaPart] = field(default_factory=list)  # media parts left out of `messages` (see admit_media)


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

    def parse(self, body: dict[str, Any], model: str | None, images: bool = False) -> ChatRequest: ...
    def response(self, req: ChatRequest, result: ChatResult, rid: str) -> dict[str, Any]: ...
    def encoder(self, req: ChatRequest, rid: str) -> StreamEncoder: ...
    def error(self, status: int, message: str) -> dict[str, Any]: ...


# ---- validation: every malformed request is a 400 that names the field ----------------------------------------

# internal name → (integer?, lowest, highest, lowest allowed itself?)
_LIMITS: dict[str, tuple[bool, float, float, bool]] = {
    "max_tokens": (True, 1, 1 << 24, True),
    "temperature": (False, 0.0, 10.0, True),
    "top_p": (False, 0.0, 1.0, False),
    "top_k": (True, -1, 1 << 20, True),  # -1 and 0: no top-k
    "min_p": (False, 0.0, 1.0, True),
    "repetition_penalty": (False, 0.0, 2.0, False),
    "presence_penalty": (False, -2.0, 2.0, True),
    "frequency_penalty": (False, -2.0, 2.0, True),
    "seed": (True, -(1 << 63), (1 << 64) - 1, True),
}
_ROLES = ("system", "user", "assistant", "tool")


def _number(value: Any, name: str, limits: tuple[bool, float, float, bool]) -> int | float | None:
    integer, lo, hi, lo_ok = limits
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:  # NaN is not a number
        raise BadRequestError(f"'{name}' must be {'an integer' if integer else 'a number'}, got {_show(value)}")
    if integer and not float(value).is_integer():
        raise BadRequestError(f"'{name}' must be an integer, got {_show(value)}")
    if not (lo <= value if lo_ok else lo < value) or value > hi:
        raise BadRequestError(f"'{name}' must be in {'[' if lo_ok else '('}{lo:g}, {hi:g}], got {_show(value)}")
    return int(value) if integer else float(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


def sampling(body: Any, **fields: str) -> dict[str, Any]:
    """Sampling parameters from `body` under the dialect's own field names, e.g. `max_tokens="max_output_tokens"`;
    each checked for type and range (a BadRequestError names the dialect's field)."""
    if not isinstance(body, dict):
        raise BadRequestError(f"sampling parameters must be an object, got {_show(body)}")
    return {key: _number(body.get(name), name, _LIMITS[key]) for key, name in fields.items()}


def as_object(value: Any, name: str) -> dict[str, Any]:
    """An optional JSON object field: {} when absent, a BadRequestError naming it when it is something else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequestError(f"'{name}' must be an object, got {_show(value)}")
    return value


def _need(ok: bool, where: str, what: str, value: Any) -> None:
    if not ok:
        raise BadRequestError(f"{where}: must be {what}, got {_show(value)}")


def check_request(req: ChatRequest) -> None:
    """The internal form every dialect parses into, checked whole before the proxy uses it: roles, text content,
    tool calls and tools of the right shapes (paths name the internal, Chat-Completions-shaped field)."""
    _need(isinstance(req.model, str), "model", "a string", req.model)
    _need(isinstance(req.messages, list) and bool(req.messages), "messages", "a non-empty list", req.messages)
    for i, m in enumerate(req.messages):
        at = f"messages[{i}]"
        _need(isinstance(m, dict), at, "an object", m)
        _need(m.get("role") in _ROLES, f"{at}.role", f"one of {', '.join(_ROLES)}", m.get("role"))
        _need(isinstance(m.get("content"), str), f"{at}.content", "text", m.get("content"))
        for key in ("tool_call_id", "reasoning_content"):
            _need(isinstance(m.get(key, ""), str), f"{at}.{key}", "a string", m.get(key))
        calls = m.get("tool_calls", [])
        _need(isinstance(calls, list), f"{at}.tool_calls", "a list", calls)
        for j, c in enumerate(calls):
            _check_call(c, f"{at}.tool_calls[{j}]")
    _need(req.tools is None or isinstance(req.tools, list), "tools", "a list", req.tools)
    for k, t in enumerate(req.tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        _need(isinstance(fn, dict), f"tools[{k}].function", "an object", fn)
        assert isinstance(fn, dict)
        _need(
            isinstance(fn.get("name"), str) and bool(fn["name"]), f"tools[{k}].function.name", "a name", fn.get("name")
        )
        params = fn.get("parameters", {})
        _need(params is None or isinstance(params, dict), f"tools[{k}].function.parameters", "an object", params)
    fields = vars(req)
    for key in _LIMITS:
        _number(fields[key], key, _LIMITS[key])


def _check_call(c: Any, at: str) -> None:
    fn = c.get("function") if isinstance(c, dict) else None
    _need(isinstance(fn, dict), f"{at}.function", "an object", fn)
    assert isinstance(fn, dict)
    _need(isinstance(fn.get("name"), str), f"{at}.function.name", "a string", fn.get("name"))
    args = fn.get("arguments")
    _need(isinstance(args, str | dict), f"{at}.function.arguments", "a JSON string or an object", args)
    _need(isinstance(c.get("id", ""), str), f"{at}.id", "a string", c.get("id"))


def text_bytes(obj: Any) -> int:
    """The UTF-8 size of the text in a parsed JSON value (its strings, keys included): what a prompt built from it
    holds at least, counted without building it."""
    if isinstance(obj, str):
        return len(obj) if obj.isascii() else len(obj.encode("utf-8", "surrogatepass"))
    if isinstance(obj, dict):
        return sum(text_bytes(k) + text_bytes(v) for k, v in obj.items())
    if isinstance(obj, list):
        return sum(text_bytes(v) for v in obj)
    return 0


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; `data` is JSON-encoded unless it is already a string."""
    payload = data.encode() if isinstance(data, str) else dumps(data)
    return (b"event: " + event.encode() + b"\ndata: " if event else b"data: ") + payload + b"\n\n"


HOLE = "\x00hole\x00"  # a value in an event template, filled per delta (see SSETemplate)


class SSETemplate:
    """An event encoded once with `HOLE` where per-delta values go; `fill` JSON-encodes only those values (the
    per-token hot path of every dialect's stream). Values fill the holes in the order they occur in the JSON."""

    def __init__(self, data: Any, event: str | None = None) -> None:
        self.parts = sse(data, event).split(dumps(HOLE))

    def fill(self, *values: Any) -> bytes:
        out = [self.parts[0]]
        for value, part in zip(values, self.parts[1:], strict=True):
            out += (dumps(value), part)
        return b"".join(out)


# a text part's type → the field its text is in (Chat, Responses, Anthropic; a Gemini part has no type)
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "summary_text": "text",
              "reasoning_text": "text", "refusal": "refusal"}  # fmt: skip

# a media part's type → its kind: Chat (image_url, input_audio, file; vLLM's audio_url, video_url), Responses
# (input_image, input_file), Anthropic (image, document). A Gemini part has no type: its inlineData / fileData
# carries media, of the kind its mimeType names.
MEDIA_PARTS = {"image_url": "image", "input_image": "image", "image": "image", "file": "document",
               "input_file": "document", "document": "document", "input_audio": "audio", "audio_url": "audio",
               "video_url": "video"}  # fmt: skip
_GEMINI_MEDIA = ("inlineData", "fileData", "inline_data", "file_data")  # the REST API takes either spelling
_MIME_KINDS = {"image": "image", "audio": "audio", "video": "video"}  # a mimeType's top level → kind; else document

_INPUT = {"image": "vision", "audio": "audio", "video": "video", "document": "document"}  # kind → the input it needs


def media_kind(part: dict[str, Any]) -> str | None:
    """`image`, `document`, `audio` or `video` for a content part that carries media, else None (text, a tool
    call, a thinking block, a type hrl does not know: those keep their own handling)."""
    kind = part.get("type")
    if isinstance(kind, str) and kind in MEDIA_PARTS:
        return MEDIA_PARTS[kind]
    for key in _GEMINI_MEDIA:
        if key in part:
            data = part[key] if isinstance(part[key], dict) else {}
            mime = data.get("mimeType") or data.get("mime_type")
            return _MIME_KINDS.get(mime.split("/")[0], "document") if isinstance(mime, str) else "document"
    return None


_IMAGE_MIMES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}


def _image_source(part: dict[str, Any], at: str) -> tuple[str, str]:
    """(declared mime type, base64 data) of an image part in any dialect; a remote URL, a file id or an uploaded
    file is a MediaRefusedError naming the part (sandboxes have no network, and hrl keeps no file store)."""
    kind = part.get("type")
    if kind in ("image_url", "input_image"):  # Chat: {"image_url": {"url"}}; Responses: {"image_url": "…"}
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            raise MediaRefusedError(f"{at}: an image part without a data: URL (a file_id or none); send the image "
                                    "inline as a data: URL")  # fmt: skip
        head, sep, data = url.partition(",")
        if not (url.startswith("data:") and sep and head.endswith(";base64")):
            raise MediaRefusedError(f"{at}: an image by remote URL ({url[:80]}); only inline data: URLs (base64) "
                                    "are served: the model's sandbox has no network to fetch it")  # fmt: skip
        return head[5 : -len(";base64")], data
    if kind == "image":  # Anthropic: {"source": {"type": "base64", "media_type", "data"}}
        source = part.get("source") if isinstance(part.get("source"), dict) else {}
        if source.get("type") != "base64":
            raise MediaRefusedError(f"{at}: an image of source type {source.get('type')!r}; only base64 images are "
                                    "served (a URL cannot be fetched: the model's sandbox has no network)")  # fmt: skip
        return str(source.get("media_type") or ""), source.get("data")  # type: ignore[return-value]
    for key in ("inlineData", "inline_data"):  # Gemini
        if isinstance(part.get(key), dict):
            blob = part[key]
            return str(blob.get("mimeType") or blob.get("mime_type") or ""), blob.get("data")  # type: ignore[return-value]
    raise MediaRefusedError(f"{at}: an image by file reference (fileData); only inline images are served")


def _standard_b64(data: str) -> str:
    """Base64 in its standard alphabet, padded: Google's SDK sends the URL-safe one (`-`, `_`)."""
    data = data.strip().translate(str.maketrans("-_", "+/"))
    return data + "=" * (-len(data) % 4)


def decode_image(part: dict[str, Any], at: str) -> MediaPart:
    """An image part decoded: its bytes, declared mime type, sha256 and size (read from the image's header). A part
    that holds no readable image is a BadRequestError naming it."""
    mime, data = _image_source(part, at)
    if not isinstance(data, str):
        raise BadRequestError(f"{at}: an image part needs its data as a base64 string")
    try:
        raw = base64.b64decode(_standard_b64(data), validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadRequestError(f"{at}: the image's data is not valid base64 ({e})") from None
    from PIL import Image, UnidentifiedImageError  # only a model that takes images reads them

    try:
        with Image.open(io.BytesIO(raw)) as img:
            fmt, (width, height) = img.format, img.size
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as e:  # a bomb: too many pixels
        raise BadRequestError(
            f"{at}: the image's {len(raw)} bytes are not an image this proxy can read ({e})"
        ) from None
    mime = mime or _IMAGE_MIMES.get(str(fmt), "")
    return MediaPart(at, "image", raw, mime, hashlib.sha256(raw).hexdigest(), width, height)


def media_text(part: Any, at: str, media: list[MediaPart]) -> str | None:
    """What a non-text part puts in the text: for an image the model takes (`MediaParts.images`) its mark, the
    decoded image added to `media`; for other media None, the part noted in `media` (see `admit_media`); None
    for a part that is not media."""
    if isinstance(part, dict) and isinstance(media, MediaParts) and media.images and media_kind(part) == "image":
        image = decode_image(part, at)
        media.append(image)
        return image_mark(image.sha256)
    note_media(part, at, media)
    return None


def note_media(part: Any, at: str, media: list[MediaPart]) -> bool:
    """Whether `part` carries media; if so it is added to `media` (`at`: its path in the dialect's names)."""
    kind = media_kind(part) if isinstance(part, dict) else None
    if kind is not None:
        media.append(MediaPart(at, kind))
    return kind is not None


def media_counts(media: list[MediaPart]) -> dict[str, int]:
    """Media parts left out (not kept for the model) by kind, e.g. {"image": 2, "document": 1}; {} for none."""
    counts: dict[str, int] = {}
    for part in (m for m in media if m.data is None):
        counts[part.kind] = counts.get(part.kind, 0) + 1
    return counts


def admit_media(media: list[MediaPart], policy: MediaPolicy) -> dict[str, int]:
    """The one rule for media the served model cannot take (images it takes are decoded into the request and not
    counted here): `refuse` (the default) answers a MediaRefusedError naming the first part, and `drop` lets the
    request through without them, which the call and its trace then record (`dropped_media`: what this returns)."""
    media = [m for m in media if m.data is None]
    if media and policy == "refuse":
        first, more = media[0], len(media) - 1
        article = "an" if first.kind[0] in "aeiou" else "a"
        others = f" (and {more} more media part{'s' if more > 1 else ''})" if more else ""
        raise MediaRefusedError(
            f"{first.at}: {article} {first.kind} part{others}; this model has no {_INPUT[first.kind]} input "
            "(set proxy.media: drop to drop media and flag the trace)"
        )
    return media_counts(media)


def part_text(part: Any, at: str, media: list[MediaPart]) -> str | None:
    """The text of one content part: for an image a vision model takes, its mark (`media_text`); None for a part the
    template cannot take: other media (added to `media`, see `admit_media`) or a type hrl does not know. A part that is not an object, or a text part
    whose text is missing or not a string, is a BadRequestError naming the field (`at`: the part's path in the
    dialect's own names). A bare string is taken as text."""
    if isinstance(part, str):
        return part
    _need(isinstance(part, dict), at, "an object (a content part)", part)
    kind = part.get("type")
    _need(kind is None or isinstance(kind, str), f"{at}.type", "a string", kind)
    field = TEXT_PARTS.get(kind) if kind is not None else "text" if "text" in part else None
    if field is None:
        return media_text(part, at, media)
    if field not in part:
        raise BadRequestError(f"{at}.{field}: missing (a {kind or 'text'} part needs its text)")
    text = part[field]
    _need(isinstance(text, str), f"{at}.{field}", "a string", text)
    return text  # type: ignore[no-any-return]


def join_text(content: Any, sep: str, where: str, media: list[MediaPart]) -> str:
    """Flatten content given as a string or a list of parts into text, the parts' texts joined with `sep`; the
    media parts it leaves out are added to `media`."""
    if content is None or isinstance(content, str):
        return content or ""
    _need(isinstance(content, list), where, "a string or a list of content parts", content)
    texts = (part_text(part, f"{where}[{i}]", media) for i, part in enumerate(content))
    return sep.join(t for t in texts if t is not None)


def text_of(content: Any, where: str, media: list[MediaPart]) -> str:
    """Flatten Chat Completions message content (a string or a list of parts) into text."""
    return join_text(content, "", where, media)
