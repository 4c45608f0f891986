"""Tool-call parsers, one per model family, by name (`proxy.tool_parser`; `auto` picks one from the model).

Each turns the sampled text into content, reasoning and tool calls (`ToolParser.parse`) and tells the streamer
where a tool call may begin (`ToolParser.stream_split`), so it is held back instead of sent as text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hrl.runners.proxy.toolparsers.base import ParsedReply, ToolParser
from hrl.sandboxes.registry import lookup, require

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
# what in a chat template gives its family away, most specific first (several templates also mention <tool_call>)
_TEMPLATE_MARKERS: list[tuple[str, tuple[str, ...]]] = [
    ("kimi-k2", ("<|tool_calls_section_begin|>",)),
    ("deepseek-v3", ("tool▁calls▁begin",)),
    ("gpt-oss", ("<|channel|>", "<|constrain|>")),
    ("glm45", ("<arg_key>",)),
    ("qwen3-coder", ("<function=", "<parameter=")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("hermes", ("<tool_call>",)),
    ("llama3", ("<|python_tag|>",)),
]
_MODEL_TYPES = {
    "kimi_k2": "kimi-k2",
    "deepseek_v3": "deepseek-v3",
    "deepseek_v32": "deepseek-v3",
    "gpt_oss": "gpt-oss",
    "glm4_moe": "glm45",
    "mistral": "mistral",
    "mistral3": "mistral",
    "mixtral": "mistral",
    "llama": "llama3",
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


def detect(template: str, config: dict[str, Any] | None = None) -> str:
    """The family of a model from config.json's `hrl_family` (what `hrl models tiny --family` records), its chat
    template text (markers) and config.json's model_type and architectures; `hermes` when nothing gives it away."""
    if (config or {}).get("hrl_family") in TOOL_PARSERS:
        return str(config["hrl_family"])  # type: ignore[index]
    for name, markers in _TEMPLATE_MARKERS:
        if all(m in template for m in markers):
            return name
    config = config or {}
    kinds = [str(config.get("model_type", ""))]
    kinds += [str(a).lower().removesuffix("forcausallm").removesuffix("forconditionalgeneration") for a in
              config.get("architectures") or []]  # fmt: skip
    for kind in kinds:
        kind = kind.lower()
        if kind in _MODEL_TYPES:
            return _MODEL_TYPES[kind]
    arch = " ".join(kinds).replace("_", "")
    for key, name in (("kimi", "kimi-k2"), ("deepseekv3", "deepseek-v3"), ("gptoss", "gpt-oss"), ("glm4moe", "glm45")):
        if key in arch:
            return name
    return "hermes"


def detect_model(model_path: str, template: Any = None) -> str:
    """`detect` for a local model directory: its tokenizer's chat template (given, or read from
    tokenizer_config.json / chat_template.jinja) and its config.json."""
    root = Path(model_path)
    text = template if isinstance(template, str) else ""
    if template is not None and not isinstance(template, str):
        text = json.dumps(template, ensure_ascii=False)  # a list of named templates
    if not text:
        for name in ("chat_template.jinja", "tokenizer_config.json"):
            f = root / name
            if f.is_file():
                raw = f.read_text(errors="replace")
                text = raw if name.endswith(".jinja") else str(_json(raw).get("chat_template") or "")
                if text:
                    break
    config = _json((root / "config.json").read_text(errors="replace")) if (root / "config.json").is_file() else {}
    return detect(text, config)


def _json(raw: str) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
