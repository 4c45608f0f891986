"""The served model's tokenizer and chat template: messages → prompt ids, sampled ids → text and tool calls."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatTemplate", "IncrementalDecoder", "ParsedReply", "StreamSplitter", "parse_hermes"]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


@dataclass
class ParsedReply:
    """What the model said, split into reasoning, visible text and tool calls (OpenAI `tool_calls` shape)."""

    content: str
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def parse_hermes(text: str, tool_calls: bool = True) -> ParsedReply:
    """Parse Hermes-style `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks and a leading <think>.
    With `tool_calls` False (the request offered no tools) tool-call markup stays plain text."""
    reasoning = ""
    m = _THINK.match(text)
    if m:
        reasoning, text = m.group(1).strip(), text[m.end() :]
    calls = []
    for raw in _TOOL_CALL.findall(text) if tool_calls else []:
        try:
            obj = json.loads(raw)
            name, args = obj["name"], obj.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            continue  # not a well-formed call: it stays in the visible text
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": str(name), "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
    if calls:
        text = _TOOL_CALL.sub("", text).strip()
    return ParsedReply(content=text, reasoning=reasoning, tool_calls=calls)


class ChatTemplate:
    """Loads a model's tokenizer once and renders conversations to ids with its chat template."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if not self.tokenizer.chat_template:
            raise ValueError(f"tokenizer of {model_path} has no chat template")
        tok = self.tokenizer
        backend = getattr(tok, "backend_tokenizer", None)  # the Rust tokenizer: ~3x faster than tok.decode
        self._raw_decode = backend.decode if backend is not None else tok.decode
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        has_im_end = isinstance(im_end, int) and im_end != tok.unk_token_id
        self.end_of_turn: str = "<|im_end|>" if has_im_end else str(tok.eos_token)
        self.stop_ids: tuple[int, ...] = tuple(
            sorted(t for t in {tok.eos_token_id, im_end if has_im_end else None} if isinstance(t, int))
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._raw_decode(ids, skip_special_tokens=False))

    def reply_text(self, ids: list[int]) -> str:
        """Decode sampled ids for the user: the trailing stop token is not part of the message."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.decode(ids)


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


class StreamSplitter:
    """Splits streamed text into reasoning (a leading <think>…</think>) and visible text, holding back tool
    calls (sent whole at the end) and any tail that might be the start of a tag."""

    def __init__(self, tool_calls: bool = True) -> None:
        self.mode = "start"  # start -> think -> text -> tool
        self.held = ""
        self.tool_tag = "<tool_call>" if tool_calls else "\x00no tool calls\x00"  # a tag that never occurs

    def feed(self, delta: str) -> list[tuple[str, str]]:
        if self.mode == "text" and not self.held and "<" not in delta and "\x00" not in delta:
            return [("text", delta)]  # the hot path: plain text, nothing held back
        self.held += delta
        out: list[tuple[str, str]] = []
        while self.held and self.mode != "tool":
            if self.mode == "start":
                stripped = self.held.lstrip()
                if stripped.startswith("<think>"):
                    self.held, self.mode = stripped[len("<think>") :], "think"
                    continue
                if "<think>".startswith(stripped):
                    return out  # could still become <think>
                self.mode = "text"
            tag = "</think>" if self.mode == "think" else self.tool_tag
            kind = "reasoning" if self.mode == "think" else "text"
            idx = self.held.find(tag)
            if idx >= 0:
                if idx:
                    out.append((kind, self.held[:idx]))
                self.held = self.held[idx + len(tag) :]
                self.mode = "text" if self.mode == "think" else "tool"
                if self.mode == "text":
                    self.held = self.held.lstrip("\n")
                continue
            keep = _partial_tag_len(self.held, tag)
            if len(self.held) > keep:
                out.append((kind, self.held[: len(self.held) - keep]))
                self.held = self.held[len(self.held) - keep :]
            return out
        return out

    def flush(self) -> list[tuple[str, str]]:
        """At the end of a stream: release what was held back (a partial tag, text after a tool call)."""
        held, self.held = self.held, ""
        if self.mode == "think":
            return [("reasoning", held)] if held else []
        if self.mode == "tool":
            held = _TOOL_CALL.sub("", "<tool_call>" + held)
        return [("text", held)] if held else []


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
