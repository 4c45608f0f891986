"""gpt-oss (OpenAI Harmony): messages `<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>BODY`
ended by `<|end|>`, `<|call|>` or `<|return|>`; `analysis` is reasoning, `final` the answer, a message to
`functions.NAME` a tool call.

Parsed here from the decoded text rather than with the `openai-harmony` package: that package loads its
tokenizer's vocabulary file from the network on first use (no offline mode) and parses its own token ids, while the
proxy already holds the served model's tokenizer and the decoded text."""

from __future__ import annotations

import json
import re
from typing import Any

from hrl.runners.proxy.toolparsers.base import Block, ParsedReply, ToolParser, make_call

__all__ = ["GptOssParser"]

_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_TO = re.compile(r"to=([^\s<]+)")


def messages(text: str) -> list[tuple[str, str | None, str]] | None:
    """The Harmony messages in `text` as (channel, recipient, body); None when the text has no Harmony header."""
    if "<|message|>" not in text:
        return None
    out, pos = [], 0
    while True:
        idx = text.find("<|message|>", pos)
        if idx < 0:
            break
        header = text[pos:idx].removeprefix("<|start|>").removeprefix("assistant")
        body_at = idx + len("<|message|>")
        ends = [(j, e) for e in _ENDS if (j := text.find(e, body_at)) >= 0]
        nxt = text.find("<|start|>", body_at)
        if nxt >= 0:
            ends.append((nxt, ""))
        j, e = min(ends) if ends else (len(text), "")
        channel = _CHANNEL.search(header)
        to = _TO.search(header)
        out.append((channel.group(1) if channel else "final", to.group(1) if to else None, text[body_at:j]))
        pos = j + len(e)
    return out


class GptOssParser(ToolParser):
    name = "gpt-oss"
    starts = ("<|channel|>", "<|start|>")
    think = False
    framed = True

    def blocks(self, text: str, tools: list[dict[str, Any]] | None) -> list[Block]:
        return []  # not used: a Harmony reply is split into messages, see `parse`

    def parse(self, text: str, tool_calls: bool = True, tools: list[dict[str, Any]] | None = None) -> ParsedReply:
        msgs = messages(text)
        if msgs is None:
            return ParsedReply(content=text)
        reasoning, content, calls, error = [], [], [], None
        for channel, to, body in msgs:
            if to is not None and to.startswith("functions.") and tool_calls:
                try:
                    json.loads(body)
                    calls.append(make_call(to.removeprefix("functions."), body.strip()))
                    continue
                except ValueError as e:
                    error = error or f"gpt-oss: arguments of {to} are not JSON: {e}"
                content.append(body)
            elif channel == "analysis":
                reasoning.append(body)
            else:
                content.append(body)
        return ParsedReply("\n".join(content).strip(), "\n".join(reasoning).strip(), calls, error)

    def rest(self, region: str, tools: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
        r = self.parse(region, tools=tools)
        return [(k, t) for k, t in (("reasoning", r.reasoning), ("text", r.content)) if t]

    def stream_split(self, text: str, at_start: bool) -> tuple[int, int]:
        if at_start:
            return 0, 0  # a Harmony reply is headers from its first token: held and split at the end
        return super().stream_split(text, at_start)
