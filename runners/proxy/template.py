"""The served model's tokenizer and chat template: messages → prompt ids, sampled ids → text and tool calls."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatTemplate", "ParsedReply", "parse_hermes"]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


@dataclass
class ParsedReply:
    """What the model said, split into reasoning, visible text and tool calls (OpenAI `tool_calls` shape)."""

    content: str
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def parse_hermes(text: str) -> ParsedReply:
    """Parse Hermes-style `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks and a leading <think>."""
    reasoning = ""
    m = _THINK.match(text)
    if m:
        reasoning, text = m.group(1).strip(), text[m.end() :]
    calls = []
    for raw in _TOOL_CALL.findall(text):
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
        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.stop_ids: tuple[int, ...] = tuple(
            t for t in {self.tokenizer.eos_token_id, eos} if isinstance(t, int) and t != self.tokenizer.unk_token_id
        )

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=False
            )
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def reply_text(self, ids: list[int]) -> str:
        """Decode sampled ids for the user: the trailing stop token is not part of the message."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.decode(ids)
