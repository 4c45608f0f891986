"""Tool-call parsers, one per model family, by name (`proxy.tool_parser`; `auto` picks one from the model).

Each turns the sampled text into content, reasoning and tool calls (`ToolParser.parse`) and tells the streamer
where a tool call may begin (`ToolParser.stream_split`), so it is held back instead of sent as text."""

from __future__ import annotations

from hrl.registry import lookup, require
from hrl.runners.models import detect, detect_model
from hrl.runners.proxy.toolparsers.base import ParsedReply, ToolParser

__all__ = ["TOOL_PARSERS", "ParsedReply", "ToolParser", "check_name", "detect", "detect_model", "get_tool_parser"]

TOOL_PARSERS: dict[str, str] = {
    "hermes": "hrl.runners.proxy.toolparsers.hermes:HermesParser",
    "qwen3-coder": "hrl.runners.proxy.toolparsers.xmlish:Qwen3CoderParser",
    "glm45": "hrl.runners.proxy.toolparsers.xmlish:Glm45Parser",
    "llama3": "hrl.runners.proxy.toolparsers.jsonish:Llama3Parser",
    "mistral": "hrl.runners.proxy.toolparsers.jsonish:MistralParser",
    "deepseek-v3": "hrl.runners.proxy.toolparsers.sections:DeepSeekV3Parser",
    "kimi-k2": "hrl.runners.proxy.toolparsers.sections:KimiK2Parser",
    "gpt-oss": "hrl.runners.proxy.toolparsers.harmony:GptOssParser",
}
_cache: dict[str, ToolParser] = {}


def check_name(name: str) -> str:
    """`name` if it is `auto` or a registered parser; UnknownNameError (with the nearest name) otherwise."""
    if name != "auto":
        require(TOOL_PARSERS, "tool parser", name, also="auto")
    return name


def get_tool_parser(name: str) -> ToolParser:
    """The parser instance for a registry name (one per name); unknown names raise UnknownNameError."""
    if name not in _cache:
        _cache[name] = lookup(TOOL_PARSERS, "tool parser", name, also="auto")()
    return _cache[name]
