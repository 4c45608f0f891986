"""Tool calls written as JSON after a marker: Llama 3 and Mistral."""

from __future__ import annotations

import json
import re
from typing import Any

from hrl.runners.proxy.toolparsers.base import Block, ToolParser, arguments_json

__all__ = ["Llama3Parser", "MistralParser"]

_DECODER = json.JSONDecoder()
PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS = "[TOOL_CALLS]"


def _skip(text: str, i: int, chars: str = " \t\r\n") -> int:
    while i < len(text) and text[i] in chars:
        i += 1
    return i


def _call(obj: Any, args_key: tuple[str, ...]) -> tuple[str, str] | None:
    """(name, arguments JSON) of a {"name": …, "arguments"/"parameters": …} object, None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in args_key if k in obj), {})
    return obj["name"], arguments_json(args)


class Llama3Parser(ToolParser):
    """JSON `{"name": …, "parameters": …}` (several separated by `;`), at the start of the reply or after
    `<|python_tag|>`."""

    name = "llama3"
    starts = (PYTHON_TAG,)
    think = False

    def blocks(self, text: str, tools: list[dict[str, Any]] | None) -> list[Block]:
        tag = text.find(PYTHON_TAG)
        start = tag if tag >= 0 else _skip(text, 0)
        i = start + len(PYTHON_TAG) if tag >= 0 else start
        if tag < 0 and text[i : i + 1] != "{":
            return []
        out: list[Block] = []
        while True:
            i = _skip(text, i)
            if i >= len(text):
                break
            try:
                obj, end = _DECODER.raw_decode(text, i)
            except ValueError as e:
                if tag >= 0 or out:
                    out.append(Block(i, len(text), error=f"llama3: tool call is not JSON: {e}"))
                return out
            call = _call(obj, ("parameters", "arguments"))
            if call is None:
                if tag >= 0 or out:
                    out.append(Block(i, end, error="llama3: tool call is not a JSON object with a name"))
                return out
            i = _skip(text, end, " \t\r\n;")  # the separator goes with the call before it
            out.append(Block(start if not out else out[-1].end, i, *call))
        return out

    def stream_split(self, text: str, at_start: bool) -> tuple[int, int]:
        if at_start:
            j = _skip(text, 0)
            if j == len(text):
                return -1, len(text)  # only whitespace yet: it may be followed by a JSON call
            if text[j] == "{":
                return j, 0
        return super().stream_split(text, at_start)


class MistralParser(ToolParser):
    """`[TOOL_CALLS]` then a JSON list of {"name", "arguments"}, or (newer tokenizers) `[TOOL_CALLS]NAME[ARGS]{…}`
    for each call (an optional `[CALL_ID]id` after the name)."""

    name = "mistral"
    starts = (TOOL_CALLS,)
    think = False

    def blocks(self, text: str, tools: list[dict[str, Any]] | None) -> list[Block]:
        out: list[Block] = []
        at = text.find(TOOL_CALLS)
        while at >= 0:
            i = _skip(text, at + len(TOOL_CALLS))
            try:
                if text[i : i + 1] == "[":
                    objs, end = _DECODER.raw_decode(text, i)
                    calls = [_call(o, ("arguments", "parameters")) for o in objs] if isinstance(objs, list) else [None]
                    if not calls or None in calls:
                        raise ValueError("not a list of objects with a name")
                    for n, call in enumerate(calls):
                        out.append(Block(at if n == 0 else end, end, *call))  # type: ignore[misc]
                else:
                    args_at = text.find("[ARGS]", i)
                    if args_at < 0:
                        raise ValueError("no [ARGS] after the name")
                    name = re.sub(r"\[CALL_ID\].*$", "", text[i:args_at], flags=re.S).strip()
                    if not name or "[" in name:
                        raise ValueError(f"bad function name {name!r}")
                    args, end = _DECODER.raw_decode(text, _skip(text, args_at + len("[ARGS]")))
                    out.append(Block(at, end, name, arguments_json(args)))
            except ValueError as e:
                out.append(Block(at, len(text), error=f"mistral: {e}"))
                return out
            at = text.find(TOOL_CALLS, end)
        return out
