"""What every tool-call parser does: sampled text → (content, reasoning, tool calls), and, while streaming, where
the text stops being plain text (a tool call starts there, or may start in what is held back)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Block", "ParsedReply", "ToolParser", "arguments_json", "make_call", "partial_len", "split_think"]

_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


@dataclass
class ParsedReply:
    """What the model said, split into reasoning, visible text and tool calls (OpenAI `tool_calls` shape).
    `parse_error`: why a tool-call block could not be parsed (it then stays in `content`); None when all did."""

    content: str
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    parse_error: str | None = None


@dataclass
class Block:
    """One tool-call block found in the text: where it is, and the call it holds (None: it did not parse)."""

    start: int
    end: int
    name: str | None = None
    arguments: str = "{}"
    error: str | None = None


def make_call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def arguments_json(args: Any) -> str:
    """Arguments as the JSON string the OpenAI shape carries (a string is taken as already encoded)."""
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def split_think(text: str) -> tuple[str, str]:
    """(reasoning of a leading <think>…</think>, the rest)."""
    m = _THINK.match(text)
    return (m.group(1).strip(), text[m.end() :]) if m else ("", text)


def partial_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def typed_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A parameter value written as bare text (qwen3-coder, glm45): a string when the tool's schema says so (or
    when it is not JSON), else its JSON value."""
    kind = (schema or {}).get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind and len(kind) == 1):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def param_schemas(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    """The JSON-schema `properties` of tool `name` among the request's tools (OpenAI shape), {} if unknown."""
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(fn, dict) and fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties")
            return props if isinstance(props, dict) else {}
    return {}


class ToolParser:
    """A model family's tool-call format. Subclasses set `name` and `starts` (the texts a tool-call region begins
    with) and implement `blocks`; the rest (think, content, errors, streaming hold-back) is shared."""

    name = ""
    starts: tuple[str, ...] = ()
    think = True  # a leading <think>…</think> is reasoning
    framed = False  # every reply is in the family's headers, tools or not: a stream is split even without tools

    def blocks(self, text: str, tools: list[dict[str, Any]] | None) -> list[Block]:
        """The tool-call blocks in `text` (reasoning already removed), in order."""
        raise NotImplementedError

    def parse(self, text: str, tool_calls: bool = True, tools: list[dict[str, Any]] | None = None) -> ParsedReply:
        """Split a whole reply. With `tool_calls` False (the request offered no tools) tool-call markup stays text.
        A block that does not parse stays in the content, and `parse_error` says why."""
        reasoning, text = split_think(text) if self.think else ("", text)
        if not tool_calls:
            return ParsedReply(content=text, reasoning=reasoning)
        found = self.blocks(text, tools)
        calls = [make_call(b.name, b.arguments) for b in found if b.name is not None and b.error is None]
        errors = [b.error for b in found if b.error is not None]
        if not calls:
            return ParsedReply(content=text, reasoning=reasoning, parse_error=errors[0] if errors else None)
        kept, at = [], 0
        for b in found:
            if b.error is None:
                kept.append(text[at : b.start])
                at = b.end
        kept.append(text[at:])
        content = "".join(kept).strip()
        return ParsedReply(
            content=content, reasoning=reasoning, tool_calls=calls, parse_error=errors[0] if errors else None
        )

    def rest(self, region: str, tools: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
        """What the streamer sends at the end for a held-back tool-call region: the text around its calls, and any
        block that did not parse, as ("text" | "reasoning", text) pieces."""
        kept, at = [], 0
        for b in self.blocks(region, tools):
            if b.error is None:
                kept.append(region[at : b.start])
                at = b.end
        text = "".join(kept) + region[at:]
        return [("text", text)] if text else []

    def stream_split(self, text: str, at_start: bool) -> tuple[int, int]:
        """For streamed text not sent yet: (i, keep). i ≥ 0: a tool-call region begins at i (hold it all back);
        else the last `keep` characters may still become one. `at_start`: no visible text was sent before."""
        found = [i for i in (text.find(s) for s in self.starts) if i >= 0]
        if found:
            return min(found), 0
        return -1, max((partial_len(text, s) for s in self.starts), default=0)
