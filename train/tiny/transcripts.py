"""The CPU demo's SFT transcripts: `cat *.py`, `sed -i` the fix, submit.

The messages mini-swe-agent would send, rendered to token ids exactly as the proxy builds them (`render_ids` runs
the proxy's own `Session` prompt planning), with a loss mask on the sampled (assistant) tokens only. `Noise` makes
the warm-started model's fix often wrong in ways that sampling + reward can repair: a plausible but wrong
operator, or `sed` without `-i`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Literal

from hrl.runners.proxy.dialects.chat import ChatDialect
from hrl.runners.proxy.session import Session
from hrl.runners.proxy.template import ChatTemplate, parse_hermes
from hrl.train.tiny.profile import SUBMIT, HarnessProfile, bash_turn
from hrl.train.tiny.tasks import Bug, wrong_ops

__all__ = ["Noise", "episode_messages", "episode_requests", "render_ids", "render_ids_fast", "transcript"]


@dataclass(frozen=True)
class Noise:
    """How often the warm-start transcripts go wrong. right_op: the fix puts the mirror operator back (else a
    plausible wrong one); in_place: `sed` edits the file (else it only prints it)."""

    right_op: float = 0.5
    in_place: float = 0.2


def transcript(bug: Bug, rng: random.Random, noise: Noise) -> list[tuple[dict[str, Any], str]]:
    """The agent's turns and what each one prints: cat, sed, submit (the submit prints nothing back)."""
    wrong = wrong_ops(bug)
    op = bug.op if rng.random() < noise.right_op or not wrong else rng.choice(wrong)
    in_place = rng.random() < noise.in_place
    source = bug.source(bug.bug)
    printed = "" if in_place else source.replace(bug.expr(bug.bug), bug.expr(op), 1)
    return [
        (bash_turn("cat *.py"), source),
        (bash_turn(bug.sed(op, in_place)), printed),
        (bash_turn(SUBMIT), ""),
    ]


def _turn_text(turn: dict[str, Any]) -> str:
    from hrl.runners.engines.scripted import render_turn

    return render_turn(turn, "<|im_end|>")


Context = Literal["full", "brief", "bare"]


def episode_requests(
    profile: HarnessProfile,
    task: str,
    turns: list[tuple[dict[str, Any], str]],
    uname: str | None = None,
    context: Context = "full",
) -> tuple[list[dict[str, Any]], list[str]]:
    """The full message list mini-swe-agent would have sent after the last turn (its last request plus the final
    assistant reply), and the assistant turns as the model samples them (Hermes text + end of turn).

    `context` "full" is the harness's; the shorter ones are for a cheap curriculum: "brief" stops the instance
    prompt after the task, "bare" keeps only the task (no system prompt, no tool list)."""
    user = profile.user(task, uname) if context == "full" else profile.before + task
    messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
    if context != "bare":
        messages.insert(0, {"role": "system", "content": profile.system})
    replies = []
    for k, (turn, output) in enumerate(turns):
        text = _turn_text(turn)
        replies.append(text)
        reply = parse_hermes(text.removesuffix("<|im_end|>"))
        calls = [{"id": f"call_{k}", "type": "function", "function": tc["function"]} for tc in reply.tool_calls]
        messages.append({"role": "assistant", "content": reply.content or None, "tool_calls": calls})
        if k < len(turns) - 1:
            messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": profile.tool_result(output)})
    return messages, replies


def render_ids(
    template: ChatTemplate,
    profile: HarnessProfile,
    task: str,
    turns: list[tuple[dict[str, Any], str]],
    uname: str | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one episode, built call by call with the proxy's own prompt planning: each call's
    prompt is the previous call's prompt + sampled ids + the tokenized new messages, as at rollout time."""
    messages, replies = episode_requests(profile, task, turns, uname)
    session, dialect = Session("sft"), ChatDialect()
    ids: list[int] = []
    mask: list[int] = []
    k = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        req = dialect.parse({"model": "m", "messages": messages[:i], "tools": profile.tools}, None)
        plan = session.plan(req, template)
        call = session.open_call("chat", req, plan, f"sft-{k}").record
        call.response_ids = template.encode(replies[k])
        session.commit(call, parse_hermes(template.reply_text(call.response_ids)))
        mask = mask + [0] * (len(plan.prompt_ids) - len(ids)) + [1] * len(call.response_ids)
        ids, k = call.full_ids, k + 1
    return ids, mask


def render_ids_fast(
    template: ChatTemplate,
    profile: HarnessProfile,
    task: str,
    turns: list[tuple[dict[str, Any], str]],
    uname: str | None = None,
    context: Context = "full",
) -> tuple[list[int], list[int]]:
    """`render_ids` in one template render: the same ids, because every joint between a sampled reply and the text
    around it is a special token (checked against `render_ids` by the build and the tests)."""
    messages, _ = episode_requests(profile, task, turns, uname, context)
    tools = None if context == "bare" else profile.tools
    text = template.render(messages, tools, add_generation_prompt=False)
    ids = template.encode(text.removesuffix("\n"))
    head, end = template.encode("<|im_start|>assistant\n"), template.stop_ids
    mask, inside = [0] * len(ids), False
    for i in range(len(ids)):
        if inside:
            mask[i] = 1
            inside = ids[i] not in end
        elif ids[i - len(head) + 1 : i + 1] == head:
            inside = True
    return ids, mask


def episode_messages(profile: HarnessProfile, task: str, turns: list[tuple[dict[str, Any], str]]) -> list[str]:
    """Plain text of an episode's pieces (for the tokenizer's training corpus)."""
    out = [profile.system, profile.user(task), json.dumps(profile.tools)]
    for turn, output in turns:
        out += [_turn_text(turn), profile.tool_result(output)]
    return out
