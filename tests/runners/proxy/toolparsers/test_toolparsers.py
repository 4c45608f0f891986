"""Every tool-call family: one call, several calls, text before the call, malformed markup (text + a parse error),
and the streaming hold-back on every prefix of a tool-call reply."""

from __future__ import annotations

import json

import pytest

from hrl.runners.proxy.template import StreamSplitter
from hrl.runners.proxy.toolparsers import TOOL_PARSERS, get_tool_parser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            },
        },
    }
]
A = ("bash", {"command": "ls -la", "timeout": 5})
B = ("read", {"path": "/x.py"})


def hermes(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def qwen3_coder(name: str, args: dict) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def glm45(name: str, args: dict) -> str:
    pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items())
    return f"<tool_call>{name}\n{pairs}</tool_call>"


def deepseek(name: str, args: dict) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json.dumps(args)}\n```<｜tool▁call▁end｜>"


def kimi(name: str, args: dict, i: int = 0) -> str:
    return f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|>"


def harmony(name: str, args: dict) -> str:
    return f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{json.dumps(args)}<|call|>"


# family -> (calls text for [A] and [A, B], a malformed call)
def render(family: str, calls: list[tuple[str, dict]]) -> str:
    if family == "hermes":
        return "\n".join(hermes(*c) for c in calls)
    if family == "qwen3-coder":
        return "\n".join(qwen3_coder(*c) for c in calls)
    if family == "glm45":
        return "\n".join(glm45(*c) for c in calls)
    if family == "llama3":
        return "<|python_tag|>" + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    if family == "mistral":
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    if family == "deepseek-v3":
        return "<｜tool▁calls▁begin｜>" + "\n".join(deepseek(*c) for c in calls) + "<｜tool▁calls▁end｜>"
    if family == "kimi-k2":
        inner = "".join(kimi(n, a, i) for i, (n, a) in enumerate(calls))
        return f"<|tool_calls_section_begin|>{inner}<|tool_calls_section_end|>"
    assert family == "gpt-oss"
    return "".join(harmony(*c) for c in calls)


MALFORMED = {
    "hermes": '<tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>',
    "qwen3-coder": "<tool_call>\n<parameter=command>\nls\n</parameter>\n</tool_call>",
    "glm45": "<tool_call>bash\n<arg_key>command</arg_key>\n</tool_call>",
    "llama3": '<|python_tag|>{"name": "bash", "parameters": {"command": ',
    "mistral": '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}',
    "deepseek-v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{oops}\n```"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "kimi-k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{bad"
    "<|tool_call_end|><|tool_calls_section_end|>",
    "gpt-oss": "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{not json<|call|>",
}
FAMILIES = sorted(TOOL_PARSERS)


def names_args(reply) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls]


def test_every_registered_family_is_covered() -> None:
    assert set(MALFORMED) == set(TOOL_PARSERS)
    for name in TOOL_PARSERS:
        assert get_tool_parser(name).name == name


@pytest.mark.parametrize("family", FAMILIES)
def test_one_and_several_calls(family: str) -> None:
    parser = get_tool_parser(family)
    one = parser.parse(render(family, [A]), tools=TOOLS)
    assert names_args(one) == [A] and one.parse_error is None and one.content == ""
    two = parser.parse(render(family, [A, B]), tools=TOOLS)
    assert names_args(two) == [A, B] and two.parse_error is None
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in two.tool_calls)
    assert len({c["id"] for c in two.tool_calls}) == 2


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("llama3", "gpt-oss")])
def test_content_before_the_call(family: str) -> None:
    reply = get_tool_parser(family).parse("I will list the files.\n\n" + render(family, [A]), tools=TOOLS)
    assert reply.content == "I will list the files." and names_args(reply) == [A]


def test_content_and_reasoning_in_harmony_channels() -> None:
    text = "<|channel|>analysis<|message|>List them first.<|end|>" + harmony(*A)
    reply = get_tool_parser("gpt-oss").parse(text)
    assert reply.reasoning == "List them first." and names_args(reply) == [A] and reply.content == ""
    final = get_tool_parser("gpt-oss").parse("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
                                             "<|channel|>final<|message|>It is 4.")  # fmt: skip
    assert (final.reasoning, final.content, final.tool_calls) == ("Easy.", "It is 4.", [])


def test_llama3_bare_json_and_plain_text() -> None:
    parser = get_tool_parser("llama3")
    bare = parser.parse(json.dumps({"name": "bash", "parameters": A[1]}))
    assert names_args(bare) == [A]
    text = parser.parse('The answer is {"a": 1}.')
    assert text.tool_calls == [] and text.parse_error is None and text.content == 'The answer is {"a": 1}.'
    assert parser.parse('{"a": 1}').parse_error is None  # JSON that is not a call is just text


def test_mistral_name_args_form() -> None:
    text = f"Sure.[TOOL_CALLS]bash[ARGS]{json.dumps(A[1])}[TOOL_CALLS]read[CALL_ID]a1b2c3d4e[ARGS]{json.dumps(B[1])}"
    reply = get_tool_parser("mistral").parse(text)
    assert names_args(reply) == [A, B] and reply.content == "Sure."


def test_deepseek_v31_form() -> None:
    text = f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{json.dumps(A[1])}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    assert names_args(get_tool_parser("deepseek-v3").parse(text)) == [A]


def test_tagged_values_follow_the_tool_schema() -> None:
    """qwen3-coder and glm45 write values bare: a string parameter stays a string even when it looks like JSON."""
    for family in ("qwen3-coder", "glm45"):
        reply = get_tool_parser(family).parse(render(family, [("bash", {"command": "123", "timeout": 7})]), tools=TOOLS)
        assert names_args(reply) == [("bash", {"command": "123", "timeout": 7})]


@pytest.mark.parametrize("family", FAMILIES)
def test_malformed_stays_text_and_is_flagged(family: str) -> None:
    reply = get_tool_parser(family).parse("Trying.\n" + MALFORMED[family], tools=TOOLS)
    assert reply.tool_calls == [] and reply.parse_error and family.split("-")[0] in reply.parse_error
    if family != "gpt-oss":
        assert reply.content == "Trying.\n" + MALFORMED[family]
    else:
        assert reply.content == "{not json"


@pytest.mark.parametrize("family", FAMILIES)
def test_no_tools_offered_keeps_markup_as_text(family: str) -> None:
    text = render(family, [A])
    reply = get_tool_parser(family).parse(text, tool_calls=False)
    assert reply.tool_calls == [] and reply.parse_error is None
    if family != "gpt-oss":
        assert reply.content == text


def stream(family: str, text: str, step: int = 1) -> tuple[list[tuple[str, str]], StreamSplitter]:
    split = StreamSplitter(parser=get_tool_parser(family), tools=TOOLS)
    out = []
    for i in range(0, len(text), step):
        out += split.feed(text[i : i + step])
    return out, split


@pytest.mark.parametrize("family", FAMILIES)
def test_streaming_holds_back_every_prefix_of_a_call(family: str) -> None:
    """No prefix of a tool-call reply is sent as text: fed a character at a time, all of it is held back."""
    text = render(family, [A, B])
    out, split = stream(family, text)
    assert [p for p in out if p[1]] == []
    assert "".join(t for _, t in split.flush()).strip() == ""  # nothing but the calls: no text left to send


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("step", [1, 7])
def test_streamed_text_matches_the_parse(family: str, step: int) -> None:
    """Text before a call streams out; what the stream sends in all is the parsed content (calls left out), and a
    malformed call comes out as text at the end."""
    parser = get_tool_parser(family)
    prefix = "" if family in ("llama3", "gpt-oss") else "Let me look.\n"
    for body in (render(family, [A, B]), MALFORMED[family]):
        text = prefix + body
        out, split = stream(family, text, step)
        out += split.flush()
        sent = "".join(t for k, t in out if k == "text")
        assert sent.strip() == parser.parse(text, tools=TOOLS).content.strip()


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt-oss"])
def test_streaming_plain_text_is_not_held(family: str) -> None:
    """Plain text (with characters that start markers) streams out before the end; a leading <think> is reasoning
    for the families that write one."""
    think = get_tool_parser(family).think
    words = "Plain words, with a < and a [ bracket, and more words after them."
    out, split = stream(family, ("<think>hmm</think>" if think else "") + words)
    assert "".join(t for k, t in out if k == "text").startswith("Plain words, with a ")  # sent before the end
    out += split.flush()
    joined = {k: "".join(t for kk, t in out if kk == k) for k in ("text", "reasoning")}
    assert joined == {"text": words, "reasoning": "hmm" if think else ""}


def test_streaming_harmony_splits_channels_at_the_end() -> None:
    text = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4."
    out, split = stream("gpt-oss", text)
    assert out == []
    assert split.flush() == [("reasoning", "Easy."), ("text", "It is 4.")]
