"""Hermes (Qwen2.5/Qwen3, NousResearch, the tiny test models): `<tool_call>{"name": …, "arguments": …}</tool_call>`."""

from __future__ import annotations

import json
import re
from typing import Any

from hrl.runners.proxy.toolparsers.base import Block, ToolParser, arguments_json

__all__ = ["HermesParser"]

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class HermesParser(ToolParser):
    name = "hermes"
    starts = ("<tool_call>",)

    def blocks(self, text: str, tools: list[dict[str, Any]] | None) -> list[Block]:
        out = []
        for m in _BLOCK.finditer(text):
            b = Block(m.start(), m.end())
            try:
                obj = json.loads(m.group(1))
                b.name, b.arguments = str(obj["name"]), arguments_json(obj.get("arguments", {}))
            except (ValueError, KeyError, TypeError) as e:
                b.error = f"hermes: tool call is not a JSON object with a name: {e}"
            out.append(b)
        if not out and "<tool_call>" in text:
            out.append(Block(text.find("<tool_call>"), len(text), error="hermes: <tool_call> without </tool_call>"))
        return out
