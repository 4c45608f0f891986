"""Reasoning parsers, one per way a model family writes its reasoning (`proxy.reasoning_parser`; `auto` picks one
from the model's chat template): sampled text → (reasoning, the rest), whole or while it streams.

- `think`: a leading `<think>…</think>` (Qwen3, DeepSeek-V3.1, GLM-4.5, Kimi-K2 thinking, Hermes-style models);
  a reply without one is all text.
- `think-open`: the template opens `<think>` in the generation prompt, so the reply starts inside the reasoning
  and only `</think>` is sampled (DeepSeek-R1, Qwen3 thinking-only models); a reply that never closes it is all
  reasoning (it was cut short while thinking).
- `mistral`: a leading `[THINK]…[/THINK]` (Magistral).
- `harmony`: gpt-oss's `analysis` channel: each `<|channel|>analysis<|message|>…<|end|>` message is reasoning;
  the other messages (final, commentary, tool calls), headers included, stay in the rest for the tool parser.

Streaming and whole replies go through the same state machine (`ReasoningStream`), so what a stream sends
concatenates to exactly what the whole-reply parse returns. Reasoning is sent without its surrounding
whitespace, and the text after the closing tag without its leading whitespace. Nothing here changes what the
trace records: it only splits the decoded text that the dialects answer with.
"""

from __future__ import annotations

from typing import Any

from hrl.registry import require
from hrl.runners.proxy.toolparsers.base import partial_len

__all__ = [
    "REASONING_PARSERS",
    "HarmonyReasoning",
    "ReasoningParser",
    "ReasoningStream",
    "TagReasoning",
    "check_reasoning_name",
    "detect_reasoning",
    "get_reasoning_parser",
]

Piece = tuple[str, str]  # ("reasoning" | "text", text)


def _held_back(text: str, tags: tuple[str, ...], ws: bool = True) -> int:
    """How many trailing characters to hold: the longest start of a tag, and (`ws`) the whitespace before it (a
    reasoning text is sent without the whitespace that precedes its closing tag)."""
    keep = max(partial_len(text, t) for t in tags)
    if ws:
        body = text[: len(text) - keep]
        keep += len(body) - len(body.rstrip())
    return keep


class ReasoningStream:
    """Text in (deltas), pieces out. `done`: no reasoning can follow, every later delta is text as it is."""

    done = False

    def feed(self, delta: str) -> list[Piece]:
        raise NotImplementedError

    def flush(self) -> list[Piece]:
        """At the end of the reply: release what was held back."""
        raise NotImplementedError


class ReasoningParser:
    """A model family's reasoning format: `stream()` for a reply as it arrives, `split` for a whole one."""

    name = ""

    def stream(self) -> ReasoningStream:
        raise NotImplementedError

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, the rest) of a whole reply: the pieces of one stream fed all of `text`, joined by kind."""
        s = self.stream()
        pieces = s.feed(text) + s.flush()
        return "".join(t for k, t in pieces if k == "reasoning"), "".join(t for k, t in pieces if k == "text")


class _TagStream(ReasoningStream):
    """start → think → lead (whitespace after the closing tag) → done."""

    def __init__(self, open_tag: str, close_tag: str, opened: bool) -> None:
        self.open_tag, self.close_tag, self.opened = open_tag, close_tag, opened
        self.mode = "start"
        self.held = ""
        self.began = False  # reasoning text was sent (its leading whitespace is dropped until then)

    def feed(self, delta: str) -> list[Piece]:
        if self.done:
            return [("text", delta)] if delta else []
        self.held += delta
        out: list[Piece] = []
        if self.mode == "start":
            head = self.held.lstrip()
            if head.startswith(self.open_tag):
                self.held, self.mode = head[len(self.open_tag) :], "think"
            elif not head or self.open_tag.startswith(head):
                return out  # only whitespace so far, or it may still become the opening tag (opened or not)
            else:
                self.mode = "think" if self.opened else "done"
        if self.mode == "think":
            idx = self.held.find(self.close_tag)
            if idx < 0:
                keep = _held_back(self.held, (self.close_tag,))
                self._reason(out, self.held[: len(self.held) - keep])
                self.held = self.held[len(self.held) - keep :]
                return out
            self._reason(out, self.held[:idx].rstrip())
            self.held, self.mode = self.held[idx + len(self.close_tag) :], "lead"
        if self.mode == "lead":
            self.held = self.held.lstrip()
            if not self.held:
                return out
        self.done, held, self.held = True, self.held, ""
        out.append(("text", held))
        return out

    def _reason(self, out: list[Piece], text: str) -> None:
        if not self.began:
            text = text.lstrip()
        if text:
            self.began = True
            out.append(("reasoning", text))

    def flush(self) -> list[Piece]:
        held, self.held = self.held, ""
        if self.done or not held:
            return []
        if self.mode == "think" or (self.mode == "start" and self.opened):
            text = held.lstrip() if not self.began else held
            text = text.strip() if self.mode == "start" else text.rstrip()
            return [("reasoning", text)] if text else []
        if self.mode == "lead":
            return []
        return [("text", held)]  # the start of a reply that turned out not to be the opening tag


class TagReasoning(ReasoningParser):
    """Reasoning between an opening and a closing tag at the start of the reply (`opened`: the generation
    prompt already holds the opening tag)."""

    def __init__(self, name: str, open_tag: str = "<think>", close_tag: str = "</think>", opened: bool = False):
        self.name, self.open_tag, self.close_tag, self.opened = name, open_tag, close_tag, opened

    def stream(self) -> ReasoningStream:
        return _TagStream(self.open_tag, self.close_tag, self.opened)


_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_HEADS = ("<|start|>", "<|channel|>")


class _HarmonyStream(ReasoningStream):
    """header → analysis body (reasoning) or other body (text, for the tool parser) → header → …"""

    def __init__(self) -> None:
        self.mode = "header"
        self.held = ""
        self.began = False  # reasoning was sent: a later analysis message is joined to it by a newline
        self.fresh = False  # an analysis message began and sent nothing yet

    def feed(self, delta: str) -> list[Piece]:
        self.held += delta
        out: list[Piece] = []
        while self.held:
            if self.mode == "header":
                idx = self.held.find("<|message|>")
                if idx < 0:
                    head = self.held.lstrip()
                    if len(head) < 256 and any(head.startswith(h) or h.startswith(head) for h in _HEADS):
                        return out  # a header still arriving
                    out.append(("text", self.held))  # not Harmony: text, up to the next message end
                    self.held, self.mode = "", "other"
                    return out
                header, end = self.held[:idx], idx + len("<|message|>")
                if "<|channel|>analysis" in header.replace(" ", "") and "to=" not in header:
                    self.held, self.mode, self.fresh = self.held[end:], "analysis", True
                    continue
                out.append(("text", self.held[:end]))
                self.held, self.mode = self.held[end:], "other"
                continue
            found = [(j, e) for e in _ENDS if (j := self.held.find(e)) >= 0]
            if not found:
                keep = _held_back(self.held, _ENDS, ws=self.mode == "analysis")
                self._piece(out, self.held[: len(self.held) - keep])
                self.held = self.held[len(self.held) - keep :]
                return out
            j, end = min(found)
            after = j if end == "<|start|>" else j + len(end)
            self._piece(out, self.held[:j].rstrip() if self.mode == "analysis" else self.held[:after])
            self.held, self.mode = self.held[after:], "header"
        return out

    def _piece(self, out: list[Piece], text: str) -> None:
        if self.mode != "analysis":
            if text:
                out.append(("text", text))
            return
        if self.fresh:
            text = text.lstrip()
        if text:
            out.append(("reasoning", "\n" + text if self.fresh and self.began else text))
            self.began, self.fresh = True, False

    def flush(self) -> list[Piece]:
        held, self.held = self.held, ""
        out: list[Piece] = []
        if self.mode == "analysis":
            self._piece(out, held.rstrip())
        elif held:
            out.append(("text", held))
        return out


class HarmonyReasoning(ReasoningParser):
    name = "harmony"

    def stream(self) -> ReasoningStream:
        return _HarmonyStream()


REASONING_PARSERS: dict[str, ReasoningParser] = {
    "think": TagReasoning("think"),
    "think-open": TagReasoning("think-open", opened=True),
    "mistral": TagReasoning("mistral", "[THINK]", "[/THINK]"),
    "harmony": HarmonyReasoning(),
}


def check_reasoning_name(name: str) -> str:
    """`name` if it is `auto` or a registered reasoning parser; UnknownNameError (with the nearest) otherwise."""
    if name != "auto":
        require(REASONING_PARSERS, "reasoning parser", name, also="auto")
    return name


def get_reasoning_parser(name: str) -> ReasoningParser:
    check_reasoning_name(name)
    return REASONING_PARSERS[name]


def detect_reasoning(template: str, generation_prompt: str = "", tool_parser: str = "") -> str:
    """The reasoning format of a model: `harmony` for gpt-oss (its tool parser, or channels in the template),
    `think-open` when the rendered generation prompt ends inside an opened `<think>`, `mistral` for a template
    that writes `[THINK]`, else `think`."""
    if tool_parser == "gpt-oss" or "<|channel|>" in template:
        return "harmony"
    if generation_prompt.rstrip().endswith("<think>"):
        return "think-open"
    if "[THINK]" in template:
        return "mistral"
    return "think"


def reasoning_of(template: Any) -> ReasoningParser:
    """The reasoning parser of a chat template (`think` for one that names none)."""
    parser = template.reasoning_parser
    return parser if isinstance(parser, ReasoningParser) else REASONING_PARSERS["think"]
