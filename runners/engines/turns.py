"""What a model of each family samples for one scripted assistant turn, written in that family's syntax.

A turn is text, or {"text": …, "reasoning": …, "tool_calls": [{"name": …, "arguments": {…}}]}. The rendered text
is what follows the family's generation prompt, thinking included where the family has it, and ends with the token
the family stops at (which may differ between a tool call and an answer). `completed_turns` counts the assistant
turns a prompt already holds, in ids, so the scripted engine knows which turn to play next.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

__all__ = ["FAMILY_TURNS", "completed_turns", "hermes_turn", "markers", "render_family_turn"]

Turn = str | dict[str, Any]


def _parts(turn: Turn) -> tuple[str, str, list[dict[str, Any]]]:
    if isinstance(turn, str):
        return turn, "", []
    return turn.get("text") or "", turn.get("reasoning") or "", list(turn.get("tool_calls") or [])


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _plain(value: Any) -> str:
    """A parameter value as tagged-value families write it: strings bare, structures as JSON."""
    return value if isinstance(value, str) else _json(value) if isinstance(value, dict | list) else str(value)


def hermes_turn(turn: Turn, end_of_turn: str = "<|im_end|>") -> str:
    """Hermes: a `<think>` block when the turn has reasoning, the text, `<tool_call>` JSON blocks, the end token."""
    text, reasoning, calls = _parts(turn)
    parts = [text] if text else []
    parts += [f"<tool_call>\n{json.dumps({'name': c['name'], 'arguments': c.get('arguments', {})})}\n</tool_call>"
              for c in calls]  # fmt: skip
    think = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    return think + "\n".join(parts) + end_of_turn


def _hermes(turn: Turn, k: int) -> str:
    return hermes_turn(turn)


def _qwen3_coder(turn: Turn, k: int) -> str:
    text, _, calls = _parts(turn)
    if not calls:
        return text + "<|im_end|>"
    out = text.strip() + "\n" if text.strip() else ""
    for i, c in enumerate(calls):
        params = "".join(f"<parameter={p}>\n{_plain(v)}\n</parameter>\n" for p, v in c.get("arguments", {}).items())
        out += ("\n" if out or i else "") + f"<tool_call>\n<function={c['name']}>\n{params}</function>\n</tool_call>"
    return out + "<|im_end|>"


def _glm45(turn: Turn, k: int) -> str:
    text, reasoning, calls = _parts(turn)
    out = f"\n<think>{reasoning.strip()}</think>"
    out += "\n" + text.strip() if text.strip() else ""
    for c in calls:
        args = "".join(f"<arg_key>{p}</arg_key>\n<arg_value>{v if isinstance(v, str) else _json(v)}</arg_value>\n"
                       for p, v in c.get("arguments", {}).items())  # fmt: skip
        out += f"\n<tool_call>{c['name']}\n{args}</tool_call>"
    return out + ("<|observation|>" if calls else "<|user|>")


def _llama3(turn: Turn, k: int) -> str:
    text, _, calls = _parts(turn)
    if not calls:
        return text.strip() + "<|eot_id|>"
    # one call per turn, the text dropped: what Llama 3.1's JSON tool calling writes (and its template keeps)
    return f'{{"name": "{calls[0]["name"]}", "parameters": {_json(calls[0].get("arguments", {}))}}}<|eot_id|>'


def _mistral(turn: Turn, k: int) -> str:
    text, _, calls = _parts(turn)
    return text + "".join(f"[TOOL_CALLS]{c['name']}[ARGS]{_json(c.get('arguments', {}))}" for c in calls) + "</s>"


def _deepseek_v3(turn: Turn, k: int) -> str:
    text, _, calls = _parts(turn)
    if calls:
        text += "<｜tool▁calls▁begin｜>"
        text += "".join(f"<｜tool▁call▁begin｜>{c['name']}<｜tool▁sep｜>{_json(c.get('arguments', {}))}<｜tool▁call▁end｜>"
                        for c in calls)  # fmt: skip
        text += "<｜tool▁calls▁end｜>"
    return text + "<｜end▁of▁sentence｜>"


def _kimi_k2(turn: Turn, k: int) -> str:
    text, _, calls = _parts(turn)
    if calls:  # call ids count every call of the conversation: functions.NAME:INDEX
        text += "<|tool_calls_section_begin|>"
        text += "".join(f"<|tool_call_begin|>functions.{c['name']}:{k + i}<|tool_call_argument_begin|>"
                        f"{_json(c.get('arguments', {}))}<|tool_call_end|>" for i, c in enumerate(calls))  # fmt: skip
        text += "<|tool_calls_section_end|>"
    return text + "<|im_end|>"


def _gpt_oss(turn: Turn, k: int) -> str:
    text, reasoning, calls = _parts(turn)
    out = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant" if reasoning else ""
    if not calls:
        return out + f"<|channel|>final<|message|>{text}<|return|>"
    msgs = [f" to=functions.{c['name']}<|channel|>commentary json<|message|>{_json(c.get('arguments', {}))}<|call|>"
            for c in calls]  # fmt: skip
    return out + "<|start|>assistant".join(msgs)


FAMILY_TURNS: dict[str, Callable[[Turn, int], str]] = {
    "hermes": _hermes,
    "qwen3-coder": _qwen3_coder,
    "glm45": _glm45,
    "llama3": _llama3,
    "mistral": _mistral,
    "deepseek-v3": _deepseek_v3,
    "kimi-k2": _kimi_k2,
    "gpt-oss": _gpt_oss,
}
# How to count the assistant turns a prompt holds: (token texts whose occurrences count, what to add). Families
# whose generation prompt opens with a role marker count markers, less the open one; the others count turn ends.
_COUNTERS: dict[str, tuple[tuple[str, ...], int]] = {
    "hermes": (("<|im_start|>assistant",), -1),
    "qwen3-coder": (("<|im_start|>assistant",), -1),
    "glm45": (("<|assistant|>",), -1),
    "llama3": (("<|start_header_id|>assistant<|end_header_id|>",), -1),
    "mistral": (("</s>",), 0),
    "deepseek-v3": (("<｜end▁of▁sentence｜>",), 0),
    "kimi-k2": (("<|im_assistant|>",), -1),
    "gpt-oss": (("<|call|>", "<|channel|>final"), 0),
}


def render_family_turn(family: str, turn: Turn, calls_before: int = 0) -> str:
    """The text a model of `family` samples for `turn`, its stop token included; `calls_before`: tool calls earlier
    in the conversation (Kimi-K2 numbers its call ids across it)."""
    return FAMILY_TURNS.get(family, _hermes)(turn, calls_before)


def markers(family: str, encode: Callable[[str], list[int]]) -> tuple[list[list[int]], int]:
    """The id sequences `completed_turns` counts for `family`, and the offset to add."""
    texts, offset = _COUNTERS.get(family, _COUNTERS["hermes"])
    return [encode(t) for t in texts], offset


def completed_turns(prompt_ids: list[int], seqs: list[list[int]], offset: int) -> int:
    """How many assistant turns `prompt_ids` holds: occurrences of the `markers` sequences, plus `offset`."""
    n = 0
    for seq in seqs:
        i = 0
        with contextlib.suppress(ValueError):
            while True:  # list.index scans in C: this runs once per call over the whole prompt
                i = prompt_ids.index(seq[0], i)
                n += prompt_ids[i : i + len(seq)] == seq
                i += 1
    return max(0, n + offset)
