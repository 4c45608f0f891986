"""Tool calls whose arguments are written as tagged values, not JSON: qwen3-coder and GLM-4.5."""

from __future__ import annotations

import json
import re
from typing import Any

from hrl.runners.proxy.toolparsers.base import Block, ToolParser, param_schemas, typed_value

__all__ = ["Glm45Parser", "Qwen3CoderParser"]

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _unclosed(text: str, family: str) -> list[Block]:
    i = text.find("<tool_call>")
    return [Block(i, len(text), error=f"{family}: <tool_call> without </tool_call>")] if i >= 0 else []


class Qwen3CoderParser(ToolParser):
    """`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`."""

    name = "qwen3-coder"
    starts = ("<tool_call>",)

    def blocks(self, text: str, tools: list[dict[str, Any]] | None) -> list[Block]:
        out = []
        for m in _BLOCK.finditer(text):
            b = Block(m.start(), m.end())
            fn = _FUNCTION.match(m.group(1))
            if fn is None:
                b.error = "qwen3-coder: <tool_call> without a <function=NAME>…</function>"
            else:
                b.name = fn.group(1).strip()
                schemas = param_schemas(tools, b.name)
                args = {k.strip(): typed_value(v, schemas.get(k.strip())) for k, v in _PARAM.findall(fn.group(2))}
                b.arguments = json.dumps(args, ensure_ascii=False)
            out.append(b)
        return out or _unclosed(text, self.name)


class Glm45Parser(ToolParser):
    """`<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>`."""

    name = "glm45"
    starts = ("<tool_call>",)

    def blocks(self, text: str, tools: list[dict[str, Any]] | None) -> list[Block]:
        out = []
        for m in _BLOCK.finditer(text):
            b = Block(m.start(), m.end())
            body = m.group(1)
            cut = body.find("<arg_key>")
            name = (body if cut < 0 else body[:cut]).strip()
            rest = "" if cut < 0 else body[cut:]
            leftover = _ARG.sub("", rest).strip()
            if not name or "\n" in name or "<" in name or leftover:
                b.error = "glm45: <tool_call> is not NAME then <arg_key>/<arg_value> pairs"
            else:
                schemas = param_schemas(tools, name)
                args = {k.strip(): typed_value(v, schemas.get(k.strip())) for k, v in _ARG.findall(rest)}
                b.name, b.arguments = name, json.dumps(args, ensure_ascii=False)
            out.append(b)
        return out or _unclosed(text, self.name)
