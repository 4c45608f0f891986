"""The served model's tokenizer and chat template: messages → prompt ids, sampled ids → text and tool calls."""

from __future__ import annotations

import json
import re
from typing import Any

from hrl.runners.models import model_file
from hrl.runners.proxy.reasoning import (
    REASONING_PARSERS,
    ReasoningParser,
    detect_reasoning,
    get_reasoning_parser,
    reasoning_of,
)
from hrl.runners.proxy.toolparsers import ToolParser, detect_model, get_tool_parser
from hrl.runners.proxy.toolparsers.base import ParsedReply
from hrl.runners.proxy.toolparsers.hermes import HermesParser
from hrl.runners.proxy.toolprompt import ToolsRefusedError, hermes_tool_messages, template_shows_tools

__all__ = [
    "IMAGE_MARK",
    "ChatTemplate",
    "IncrementalDecoder",
    "ParsedReply",
    "StreamSplitter",
    "image_mark",
    "parse_hermes",
    "parse_reply",
    "parser_of",
    "reasoning_of",
]

# where an image the model takes stands in a message's text (dialects.base.media_text): private-use characters
# around its sha256, so the text (and the message keys a session compares) differ when the image does; the
# template's image placeholder replaces it just before tokenizing (ChatTemplate.encode)
IMAGE_MARK = re.compile("\ue000image:([0-9a-f]{64})\ue001")


def image_mark(sha256: str) -> str:
    return f"\ue000image:{sha256}\ue001"


def parse_hermes(text: str, tool_calls: bool = True) -> ParsedReply:
    """Parse Hermes-style `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks and a leading <think>.
    With `tool_calls` False (the request offered no tools) tool-call markup stays plain text."""
    return HermesParser().parse(text, tool_calls=tool_calls)


def parser_of(template: Any) -> ToolParser:
    """The tool-call parser of a template (Hermes for a template that names none)."""
    parser = template.tool_parser
    return parser if isinstance(parser, ToolParser) else HermesParser()


def parse_reply(template: Any, text: str, tool_calls: bool, tools: list[dict[str, Any]] | None) -> ParsedReply:
    """A whole reply: reasoning first (the template's reasoning parser), then tool calls in the rest."""
    reasoning, rest = reasoning_of(template).split(text)
    reply = parser_of(template).parse(rest, tool_calls=tool_calls, tools=tools)
    if reasoning:
        reply.reasoning = f"{reasoning}\n{reply.reasoning}" if reply.reasoning else reasoning
    return reply


class ChatTemplate:
    """Loads a model's tokenizer once and renders conversations to ids with its chat template."""

    def __init__(
        self, model_path: str, tool_parser: str = "auto", reasoning_parser: str = "auto", tool_prompt: str = "auto"
    ) -> None:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        self.model_path = model_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if not self.tokenizer.chat_template:
            raise ValueError(f"tokenizer of {model_path} has no chat template")
        tok = self.tokenizer
        self.shows_tools = template_shows_tools(tok)  # else a request's tools go in as `tool_prompt` says
        self.tool_prompt = tool_prompt  # proxy.tool_prompt (TOOL_PROMPTS)
        name = detect_model(model_path, tok.chat_template) if tool_parser == "auto" else tool_parser
        if tool_parser == "auto" and not self.shows_tools:
            name = "hermes"  # the tools are shown in the Hermes tool prompt: the model answers in its format
        self.tool_parser: ToolParser = get_tool_parser(name)  # how this model writes tool calls
        if reasoning_parser == "auto":
            reasoning_parser = detect_reasoning(str(tok.chat_template), self._generation_prompt(), name)
        self.reasoning_parser: ReasoningParser = get_reasoning_parser(reasoning_parser)  # how it writes reasoning
        # the Rust tokenizer: ~3x faster than tok.decode
        backend = tok.backend_tokenizer if isinstance(tok, PreTrainedTokenizerFast) else None
        self._raw_decode = backend.decode if backend is not None else tok.decode
        # and, for encoding, the same ids as tok.encode without its Python wrapper (a third of a short prompt's
        # cost); tests/runners/proxy/test_template_ids.py holds them equal for every family. The batch form lets
        # go of the GIL while it works (`encode` holds it: a 1 MB prompt stalled the proxy's event loop for
        # seconds from its worker thread), and `_fast` skips the offsets, whose freeing held it for 70 ms a MB.
        self._backend_encode = backend.encode_batch_fast if backend is not None else None  # tokenizers >= 0.20
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        has_im_end = isinstance(im_end, int) and im_end != tok.unk_token_id
        self.end_of_turn: str = "<|im_end|>" if has_im_end else str(tok.eos_token)
        stops = {tok.eos_token_id, im_end if has_im_end else None, *_generation_stops(model_path)}
        self.stop_ids: tuple[int, ...] = tuple(sorted(t for t in stops if isinstance(t, int)))
        # a vision model's: the text its template writes for an image part, and the id the engine expands
        self.image_placeholder, self.image_token_id = _image_placeholder(self, model_path)

    @property
    def takes_images(self) -> bool:
        """Whether the model has vision (a vision tower in its config) and its template writes an image part."""
        return self.image_placeholder is not None

    def _generation_prompt(self) -> str:
        """The prompt of a one-message conversation ("" when the template cannot render one)."""
        try:
            return self.render([{"role": "user", "content": "hi"}])
        except Exception:  # a template that needs more than one user message: nothing to learn from it
            return ""

    def injected_tool_prompt(self, tools: Any) -> str | None:
        """The tool prompt `render` shows `tools` in itself ("hermes"), or None where the template shows them (or
        there are none). Raises ToolsRefusedError where the template cannot and `tool_prompt` is refuse."""
        if not tools or self.shows_tools:
            return None
        if self.tool_prompt == "refuse":
            raise ToolsRefusedError(
                f"the chat template of {self.model_path} cannot show tools (it renders none of a request's tools), "
                "and proxy.tool_prompt is refuse: set proxy.tool_prompt to hermes (hrl serve --tool-prompt hermes) "
                "to show them in the Hermes tool prompt, or serve a model whose template shows tools"
            )
        return "hermes"

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        if self.injected_tool_prompt(tools):  # the template cannot show them: the Hermes tool prompt does
            messages, tools = hermes_tool_messages(messages, tools or []), None
        return str(
            self.tokenizer.apply_chat_template(
                _mapped_arguments(messages), tools=tools or None, add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        )  # fmt: skip

    def encode(self, text: str) -> list[int]:
        """The ids of `text`; each image mark (dialects.base.IMAGE_MARK) becomes the template's image placeholder,
        one per image, which the engine expands (never the proxy)."""
        if "\ue000" in text and self.image_placeholder is not None:
            text = IMAGE_MARK.sub(self.image_placeholder, text)
        if self._backend_encode is not None:
            return list(self._backend_encode([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._raw_decode(ids, skip_special_tokens=False))

    def reply_text(self, ids: list[int]) -> str:
        """Decode sampled ids for the user: the trailing stop token is not part of the message."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.decode(ids)


def _image_placeholder(template: ChatTemplate, model_path: str) -> tuple[str | None, int | None]:
    """(the text the chat template writes for one image part, the image token id in config.json) for a model whose
    config has a vision tower and whose template writes images; (None, None) for any other."""
    f = model_file(model_path, "config.json")
    try:
        config = json.loads(f.read_text()) if f is not None else {}
    except (ValueError, OSError):
        return None, None
    token = config.get("image_token_id", config.get("image_token_index"))
    if not isinstance(config.get("vision_config"), dict) or not isinstance(token, int):
        return None, None
    a, b = "\ue010", "\ue011"
    parts = [{"type": "text", "text": a}, {"type": "image"}, {"type": "text", "text": b}]
    try:
        text = str(template.tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False))
    except Exception:  # a template that cannot render an image part: the model is served as text-only
        return None, None
    start, end = text.find(a), text.find(b)
    placeholder = text[start + 1 : end] if 0 <= start < end else ""
    if not placeholder or token not in template.encode(placeholder):
        return None, None
    return placeholder, token


def _generation_stops(model_path: str) -> list[Any]:
    """The ids generation_config.json stops at (families that end a turn with more than one token: GLM's
    <|observation|> and <|user|>, gpt-oss's <|call|> and <|return|>, Llama's <|eom_id|>); an HF id's from the
    local HF cache."""
    f = model_file(model_path, "generation_config.json")
    try:
        eos = json.loads(f.read_text()).get("eos_token_id") if f is not None else None
    except (ValueError, OSError, AttributeError):
        return []
    return eos if isinstance(eos, list) else [eos]


def _mapped_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose tool-call arguments are JSON strings, with those parsed into objects (as vLLM hands them to
    a template: several families' templates iterate the arguments); arguments that are not JSON stay strings."""
    if not any(m.get("tool_calls") for m in messages):
        return messages
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_mapped_call(c) for c in calls]}
        out.append(m)
    return out


def _mapped_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**fn, "arguments": args}} if isinstance(args, dict) else call


class IncrementalDecoder:
    """Turns sampled ids into text deltas without re-decoding the whole response at every token, and never
    emits half a UTF-8 character (ids that end mid-character are held until the character completes)."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.stops = frozenset(template.stop_ids)
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._before: str | None = ""  # the text of ids[prefix:read], decoded once per emit (None: not yet)

    def push(self, ids: list[int]) -> str:
        stops = self.stops
        self.ids.extend(ids if stops.isdisjoint(ids) else [i for i in ids if i not in stops])
        if self._before is None:
            self._before = self.template.decode(self.ids[self._prefix : self._read])
        before = self._before
        now = self.template.decode(self.ids[self._prefix :])
        if now.endswith("\ufffd") or len(now) <= len(before):
            return ""
        self._prefix, self._read, self._before = self._read, len(self.ids), None
        return now[len(before) :]

    def flush(self) -> str:
        """At the end of the stream: the text still held back. A reply cut inside a character (`max_tokens`) ends
        with its incomplete bytes decoded as U+FFFD, as the whole reply decodes them, so the streamed text is the
        non-streamed text and the agent's next request extends the sampled ids."""
        before = self._before
        if before is None:
            before = self.template.decode(self.ids[self._prefix : self._read])
        now = self.template.decode(self.ids[self._prefix :])
        self._prefix, self._read, self._before = len(self.ids), len(self.ids), ""
        return now[len(before) :]


class StreamSplitter:
    """Splits streamed text into reasoning (the template's reasoning parser: `<think>…</think>`, a reply that starts
    inside an opened `<think>`, gpt-oss's analysis channel) and visible text, holding back tool calls (sent whole
    at the end) and any tail that might be the start of one (`parser` says where they begin)."""

    def __init__(
        self,
        tool_calls: bool = True,
        parser: ToolParser | None = None,
        tools: Any = None,
        reasoning: ReasoningParser | None = None,
    ) -> None:
        self.parser = parser or HermesParser()
        self.tools = tools
        self.reasoning = (reasoning or REASONING_PARSERS["think"]).stream()
        self.mode = "text"  # text -> tool
        self.held = ""
        self.sent = False  # visible text was sent (a family whose calls open the reply no longer expects one)
        self.tool_calls = tool_calls or self.parser.framed
        self.triggers = {s[0] for s in self.parser.starts} if self.tool_calls else set()

    def feed(self, delta: str) -> list[tuple[str, str]]:
        if self.reasoning.done:
            if self.mode == "text" and self.sent and not self.held and not any(c in delta for c in self.triggers):
                return [("text", delta)]  # the hot path: plain text, nothing held back
            return self._text(delta)
        return self._pieces(self.reasoning.feed(delta))

    def _pieces(self, pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for kind, text in pieces:
            if kind == "reasoning":
                out.append((kind, text))
            else:
                out += self._text(text)
        return out

    def _text(self, delta: str) -> list[tuple[str, str]]:
        self.held += delta
        out: list[tuple[str, str]] = []
        while self.held and self.mode != "tool":
            idx, keep = self.parser.stream_split(self.held, not self.sent) if self.tool_calls else (-1, 0)
            if idx >= 0:
                if idx:
                    out.append(("text", self.held[:idx]))
                self.held, self.mode = self.held[idx:], "tool"
                continue
            if len(self.held) > keep:
                out.append(("text", self.held[: len(self.held) - keep]))
                self.held = self.held[len(self.held) - keep :]
                self.sent = True
            return out
        return out

    def flush(self) -> list[tuple[str, str]]:
        """At the end of a stream: release what was held back (a partial tag, text around a tool call, a call
        that did not parse)."""
        out = self._pieces(self.reasoning.flush())
        held, self.held = self.held, ""
        if self.mode == "tool":
            return out + self.parser.rest(held, self.tools)
        return out + ([("text", held)] if held else [])
