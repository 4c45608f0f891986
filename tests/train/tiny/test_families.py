"""`hrl models tiny --family NAME`: each family's special tokens are real special tokens, `tool_parser: auto` picks
the family's parser, and what the scripted engine samples for a turn is, token for token, what the family's template
writes for that turn in the history, and parses back into the same calls, text and reasoning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.engines.turns import render_family_turn
from hrl.runners.proxy.template import ChatTemplate
from hrl.runners.proxy.toolparsers import detect, detect_model
from hrl.train.tiny.families import FAMILIES, family_spec

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string", "description": "what to run"}},
    "required": ["command"]}}}]  # fmt: skip
THINKING = {"hermes", "glm45", "gpt-oss"}
CALL = {"reasoning": "Look first.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la 'src dir'"}}]}
ANSWER = "Fixed — 修好了 ✓"
HISTORY = [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "Fix it."}]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, family_model: Any) -> tuple[str, ChatTemplate]:
    return request.param, ChatTemplate(family_model(request.param))


def test_special_tokens_are_single_special_ids(family: tuple[str, ChatTemplate]) -> None:
    name, template = family
    tok = template.tokenizer
    for text in family_spec(name).special_tokens:
        (i,) = tok.encode(text, add_special_tokens=False)
        assert tok.added_tokens_decoder[i].special, text
        assert tok.decode([i]) == text
    assert template.stop_ids == tuple(sorted(tok.convert_tokens_to_ids(list(family_spec(name).stops))))


def test_auto_picks_the_family_parser_from_config_and_from_the_template(family: tuple[str, ChatTemplate]) -> None:
    name, template = family
    model = str(Path(template.tokenizer.name_or_path))
    assert json.loads((Path(model) / "config.json").read_text())["hrl_family"] == name
    assert detect_model(model) == name == template.tool_parser.name
    if name != "gpt-oss":  # its Harmony markers need <|constrain|>, which only replies carry; config.json decides
        assert detect(str(template.tokenizer.chat_template), {"model_type": "qwen2"}) == name


def _sampled_vs_template(name: str, template: ChatTemplate, history: list[dict[str, Any]], turn: Any,
                         message: dict[str, Any]) -> tuple[str, str]:  # fmt: skip
    before = template.render(history, TOOLS)
    upto = template.render([*history, message], TOOLS, add_generation_prompt=False)
    assert upto.startswith(before), "the generation prompt is not where the template writes the turn"
    sampled = render_family_turn(name, turn)
    written = upto[len(before) :].removesuffix("\n")  # ChatML writes a newline after the end token
    stop = template.decode([template.tokenizer.encode(sampled, add_special_tokens=False)[-1]])
    if not written.endswith(stop):  # GLM: the stop token opens the next message instead
        sampled = sampled.removesuffix(stop)
    return sampled, written


def test_sampled_turns_are_what_the_template_writes_and_parse_back(family: tuple[str, ChatTemplate]) -> None:
    name, template = family
    think = name in THINKING
    call_msg: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "functions.bash:0", "type": "function",
        "function": {"name": "bash", "arguments": json.dumps(CALL["tool_calls"][0]["arguments"])}}]}  # fmt: skip
    if think:
        call_msg["reasoning_content"] = CALL["reasoning"]
    sampled, written = _sampled_vs_template(name, template, HISTORY, CALL if think else {**CALL, "reasoning": ""},
                                            call_msg)  # fmt: skip
    assert sampled == written
    reply = template.tool_parser.parse(
        template.reply_text(template.encode(render_family_turn(name, CALL))), tools=TOOLS
    )
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls] == [
        ("bash", CALL["tool_calls"][0]["arguments"])
    ]
    assert reply.content == "" and reply.parse_error is None
    assert reply.reasoning == (CALL["reasoning"] if think else "")

    # an answer after the tool result (gpt-oss writes `<|return|>` only for the last message in training, and drops
    # the analysis before a final answer: the history here carries none)
    if name == "gpt-oss":
        call_msg.pop("reasoning_content")
    history = [*HISTORY, call_msg, {"role": "tool", "tool_call_id": "functions.bash:0", "content": "a.py"}]
    sampled, written = _sampled_vs_template(name, template, history, ANSWER, {"role": "assistant", "content": ANSWER})
    assert sampled == written
    reply = template.tool_parser.parse(template.reply_text(template.encode(render_family_turn(name, ANSWER))))
    assert (reply.content, reply.tool_calls, reply.parse_error) == (ANSWER, [], None)


def test_an_unknown_family_names_the_nearest() -> None:
    from hrl.runners.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="did you mean 'gpt-oss'"):
        family_spec("gpt-os")


# ---- each family's rendering of one canonical tool conversation, checked against the published format once -------
GOLDEN = Path(__file__).with_name("families_golden.json")
CANONICAL = [
    {"role": "system", "content": "You are careful."},
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "", "reasoning_content": "Look first.", "thinking": "Look first.", "tool_calls": [
        {"id": "functions.bash:0", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
    {"role": "tool", "tool_call_id": "functions.bash:0", "content": "a.txt\nb.txt"},
    {"role": "assistant", "content": "Two files: a.txt and b.txt."},
    {"role": "user", "content": "Thanks."},
]  # fmt: skip


def render_canonical(name: str) -> str:
    """The canonical conversation (system, user, a reasoned tool call, its result, an answer, a user turn) through
    family `name`'s template with a generation prompt, the date fixed where the family writes one."""
    from transformers.utils.chat_template_utils import render_jinja_template

    spec = family_spec(name)
    rendered, _ = render_jinja_template(
        [CANONICAL], tools=TOOLS, chat_template=spec.template, add_generation_prompt=True,
        bos_token=spec.bos or "", eos_token=spec.eos, date_string="26 Jul 2024",
    )  # fmt: skip
    return rendered[0]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_canonical_conversation_renders_as_the_family_published_format(name: str) -> None:
    """The goldens were compared, string for string, with each family's published template (gpt-oss: the Harmony
    format; its dated system line is masked); a template edit that moves a token shows up here."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    rendered = render_canonical(name)
    if name == "gpt-oss":
        head, _, tail = rendered.partition("Current date: ")
        rendered = head + "Current date: YYYY-MM-DD" + tail[len("YYYY-MM-DD") :]
    assert rendered == golden[name]
