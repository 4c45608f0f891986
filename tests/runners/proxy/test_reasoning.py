"""Reasoning parsers: a whole reply and the same reply streamed in any chunks split alike; `auto` picks the format
from the chat template; nothing crashes on any text."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hrl.runners.errors import UnknownNameError
from hrl.runners.proxy.reasoning import REASONING_PARSERS, check_reasoning_name, detect_reasoning
from hrl.runners.proxy.template import ChatTemplate, StreamSplitter, parse_reply
from hrl.runners.proxy.toolparsers import get_tool_parser

HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need the files.<|end|><|start|>assistant<|channel|>commentary to=functions.bash "
    '<|constrain|>json<|message|>{"command": "ls"}<|call|>'
)
CASES = [
    ("think", "<think>\nI should list.\n</think>\n\nAnswer here", "I should list.", "Answer here"),
    ("think", "Plain answer", "", "Plain answer"),
    ("think", "  <thi is not a tag", "", "  <thi is not a tag"),
    ("think", "<think>cut short while thinking", "cut short while thinking", ""),
    ("think-open", "I reason\n</think>\n\nDone.", "I reason", "Done."),
    ("think-open", "<think>x</think>y", "x", "y"),
    ("think-open", "never closed \n", "never closed", ""),
    ("mistral", "[THINK]hmm[/THINK]ok", "hmm", "ok"),
    ("harmony", HARMONY_CALL, "Need the files.", HARMONY_CALL[HARMONY_CALL.index("<|start|>") :]),
    (
        "harmony",
        "<|channel|>analysis<|message|>a\n<|end|><|start|>assistant<|channel|>analysis<|message|> b<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hi",
        "a\nb",
        "<|start|>assistant<|channel|>final<|message|>Hi",
    ),
    ("harmony", "just text", "", "just text"),
]


def streamed(name: str, text: str, cuts: list[int]) -> tuple[str, str]:
    s, out, at = REASONING_PARSERS[name].stream(), [], 0
    for cut in [*sorted(set(cuts)), len(text)]:
        out += s.feed(text[at:cut])
        at = max(at, cut)
    out += s.flush()
    assert all(t for _, t in out), "no empty pieces"
    return "".join(t for k, t in out if k == "reasoning"), "".join(t for k, t in out if k == "text")


@pytest.mark.parametrize(("name", "text", "reasoning", "rest"), CASES)
def test_whole_and_streamed_split_alike(name, text, reasoning, rest):
    assert REASONING_PARSERS[name].split(text) == (reasoning, rest)
    for step in (1, 2, 3, 5, 8):
        assert streamed(name, text, list(range(step, len(text), step))) == (reasoning, rest), step


PIECES = ["<think>", "</think>", "<th", "</thi", "[THINK]", "[/THINK]", "<|channel|>", "analysis", "final",
          "<|message|>", "<|end|>", "<|start|>", "assistant", " to=functions.x", "<|call|>", " ", "\n", "a", "é",
          "{", "}"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(REASONING_PARSERS)),
    st.lists(st.sampled_from(PIECES), max_size=14),
    st.lists(st.integers(0, 80), max_size=6),
)
@example("think-open", ["<think>"], [0])  # an empty first delta does not open the reasoning before its tag
def test_any_text_in_any_chunks_never_crashes_and_splits_alike(name, pieces, cuts):
    text = "".join(pieces)
    whole = REASONING_PARSERS[name].split(text)
    assert streamed(name, text, [c for c in cuts if c <= len(text)]) == whole
    reasoning, rest = whole
    assert len(reasoning) + len(rest) <= len(text)


def test_the_stream_splitter_sends_what_the_whole_reply_parses_to():
    """Reasoning first, then text and a tool call held back whole: the same split as the finished call's."""
    text = 'Looking at it\n</think>\n\nLet me look.\n<tool_call>\n{"name": "bash", "arguments": {"c": 1}}\n</tool_call>'
    split = StreamSplitter(True, get_tool_parser("hermes"), None, REASONING_PARSERS["think-open"])
    pieces = [p for ch in text for p in split.feed(ch)] + split.flush()
    assert "".join(t for k, t in pieces if k == "reasoning") == "Looking at it"
    assert "".join(t for k, t in pieces if k == "text").strip() == "Let me look."

    class Tmpl:
        tool_parser, reasoning_parser = get_tool_parser("hermes"), REASONING_PARSERS["think-open"]

    reply = parse_reply(Tmpl(), text, tool_calls=True, tools=None)
    assert (reply.reasoning, reply.content) == ("Looking at it", "Let me look.")
    assert [c["function"]["name"] for c in reply.tool_calls] == ["bash"]


def test_gpt_oss_reasoning_and_tool_call():
    class Tmpl:
        tool_parser, reasoning_parser = get_tool_parser("gpt-oss"), REASONING_PARSERS["harmony"]

    reply = parse_reply(Tmpl(), HARMONY_CALL, tool_calls=True, tools=None)
    assert reply.reasoning == "Need the files." and reply.content == ""
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in reply.tool_calls] == [
        ("bash", '{"command": "ls"}')
    ]


def test_detect():
    assert detect_reasoning("{{ '<|im_start|>assistant\\n' }}", "<|im_start|>assistant\n") == "think"
    assert detect_reasoning("…", "<|im_start|>assistant\n<think>\n") == "think-open"
    assert detect_reasoning("…", "<|im_start|>assistant\n<think>\n\n</think>\n\n") == "think"  # thinking off
    assert detect_reasoning("<|channel|>final", "<|start|>assistant") == "harmony"
    assert detect_reasoning("…", "", tool_parser="gpt-oss") == "harmony"
    assert detect_reasoning("[THINK]{{ m.thinking }}[/THINK]", "[INST]hi[/INST]") == "mistral"


def think_open_model(tiny_model: str, out: Path) -> str:
    """The tiny model with a template whose generation prompt opens <think> (the reply starts inside it)."""
    import shutil

    shutil.copytree(tiny_model, out)
    jinja = out / "chat_template.jinja"
    text = jinja.read_text()
    assert "'<|im_start|>assistant\\n' -}}{%- endif -%}" in text
    jinja.write_text(
        text.replace(
            "'<|im_start|>assistant\\n' -}}{%- endif -%}", "'<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
        )
    )
    return str(out)


def test_auto_detects_a_template_that_opens_think(tiny_model, tmp_path):
    assert ChatTemplate(tiny_model).reasoning_parser.name == "think"
    assert ChatTemplate(think_open_model(tiny_model, tmp_path / "m")).reasoning_parser.name == "think-open"
    assert ChatTemplate(tiny_model, reasoning_parser="harmony").reasoning_parser.name == "harmony"


def test_names_are_checked():
    assert check_reasoning_name("auto") == "auto"
    with pytest.raises(UnknownNameError, match="think-open"):  # before a run starts (runners.preflight.check_run)
        check_reasoning_name("think-opn")
