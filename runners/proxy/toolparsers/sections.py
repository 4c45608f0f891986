"""Tool calls inside a section of special tokens, one call per inner pair: DeepSeek-V3 and Kimi-K2."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from hrl.runners.proxy.toolparsers.base import Block, ToolParser

__all__ = ["DeepSeekV3Parser", "KimiK2Parser"]


class _SectionParser(ToolParser):
    section: tuple[str, str] = ("", "")
    call: tuple[str, str] = ("", "")

    def one(self, body: str) -> tuple[str, str]:
        """(name, arguments JSON) of one call's text between the call markers; ValueError if it is not one."""
        raise NotImplementedError

    def blocks(self, text: str, tools: list[dict[str, Any]] | None) -> list[Block]:
        begin, end = self.section
        at = text.find(begin)
        if at < 0:
            return []
        close = text.find(end, at)
        stop = len(text) if close < 0 else close + len(end)
        inner = re.escape(self.call[0]) + "(.*?)" + re.escape(self.call[1])
        out: list[Block] = []
        for m in re.finditer(inner, text[at:stop], re.S):
            b = Block(at + m.start(), at + m.end())
            try:
                b.name, b.arguments = self.one(m.group(1))
            except ValueError as e:
                b.error = f"{self.name}: {e}"
            out.append(b)
        if close < 0 or not out:
            why = "section not closed" if close < 0 else "section without a call"
            return [Block(at, stop, error=f"{self.name}: {why}")]
        out[0].start, out[-1].end = at, stop  # the section markers, and what separates the calls, go with them
        for b, nxt in itertools.pairwise(out):
            b.end = nxt.start
        return out


def _json_args(raw: str) -> str:
    raw = raw.strip()
    json.loads(raw)  # ValueError if it is not JSON
    return raw


class DeepSeekV3Parser(_SectionParser):
    """`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>` (full-width bars, ▁ for spaces); also V3.1's `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}`."""

    name = "deepseek-v3"
    section = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    call = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
    starts = (section[0],)

    def one(self, body: str) -> tuple[str, str]:
        kind, sep, rest = body.partition("<｜tool▁sep｜>")
        if not sep:
            raise ValueError("tool call without <｜tool▁sep｜>")
        m = re.match(r"([^\n]+)\n```(?:json)?\n(.*)\n```\s*$", rest, re.S)
        if m:
            return m.group(1).strip(), _json_args(m.group(2))
        if not kind.strip():
            raise ValueError("tool call without a function name")
        return kind.strip(), _json_args(rest)  # V3.1: NAME<｜tool▁sep｜>{…}


class KimiK2Parser(_SectionParser):
    """`<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}
    <|tool_call_end|><|tool_calls_section_end|>`."""

    name = "kimi-k2"
    section = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
    call = ("<|tool_call_begin|>", "<|tool_call_end|>")
    starts = (section[0],)

    def one(self, body: str) -> tuple[str, str]:
        ref, sep, args = body.partition("<|tool_call_argument_begin|>")
        if not sep:
            raise ValueError("tool call without <|tool_call_argument_begin|>")
        name = re.sub(r":\d+$", "", ref.strip())
        name = name.removeprefix("functions.")
        if not name:
            raise ValueError("tool call without a function name")
        return name, _json_args(args)
