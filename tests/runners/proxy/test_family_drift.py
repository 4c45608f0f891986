"""Zero drift on every model family: multi-turn tool conversations through the real proxy (scripted engine playing
each family's syntax as real ids of its tiny model, OpenAI SDK), streaming and not, and by a harness that sends tool
arguments back re-serialised compactly with its whitespace stripped.

The conversation holds thinking (on the families that have it), tool calls with awkward arguments, a final answer,
then a new user turn: there GLM-4.5 drops earlier reasoning from the history, gpt-oss drops its analysis and turns
`<|return|>` into `<|end|>`, and Mistral moves its tool list before the new last user turn, so the history is no
longer append-only. Whatever the template does, each call must be trained on exactly the ids it sampled and the
prompt the engine saw (both read from the engine itself), no token the proxy tokenized from text may become a
target, and every shared prefix is stored once. `pytest -s` prints the retained-token ratio (tokens trained ÷ tokens
sampled) per family and harness; it must be 1.00.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from openai import OpenAI

from hrl.runners.engines.turns import render_family_turn
from hrl.runners.trace import all_prompt_ids
from hrl.train.samples import build_samples, retained_tokens
from hrl.train.tiny.families import FAMILIES
from tests.proxy_helpers import TOOLS, RunningProxy, running_proxy

THINKING = {"hermes", "glm45", "gpt-oss"}  # the families whose replies carry reasoning
NEW_CODE = (
    'def greet(name: str) -> str:  \n    """Say hi — 你好."""\n    return f"héllo, {name}! 👋"\n\n\tok = True   \n'
)
SCRIPT: list[str | dict[str, Any]] = [
    {
        "reasoning": "The file first — 先看看.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la src/"}}],
    },
    {
        "reasoning": "Now write the fix.",
        "tool_calls": [
            {
                "name": "write_file",
                "arguments": {
                    "path": "src/util.py",
                    "content": NEW_CODE,
                    "options": {"mode": 420, "note": 'q " \\ ok'},
                },
            }
        ],
    },
    "Done. The greeting is fixed — 完了しました ✓   \n",
    {"reasoning": "Run the tests.", "tool_calls": [{"name": "bash", "arguments": {"command": "python -m pytest -q"}}]},
    "All green ✅ — 完成！",
]
RESULTS = [["total 8\n-rw-r--r-- 1 dev dev 61 util.py   \n"], ['{"ok": true, "bytes": 97}'], None, ["1 passed\n"], None]
FOLLOWUP = "Now run the tests, please 🙏"
MODES = {"plain": (False, False), "stream": (True, False), "redump": (False, True)}


@dataclass
class Served:
    family: str
    proxy: RunningProxy
    seen: dict[str, list[int]] = field(default_factory=dict)  # call id -> the prompt ids the engine was given

    def client(self, session: str) -> OpenAI:
        return OpenAI(base_url=f"{self.proxy.url}/s/{session}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request: pytest.FixtureRequest, family_model: Any) -> Iterator[Served]:
    with running_proxy(family_model(request.param), engine_options={"turns": SCRIPT}) as p:
        s = Served(request.param, p)
        engine, generate = p.proxy.engine, p.proxy.engine.generate

        def spy(request_id: str, prompt_ids: list[int], *args: Any, **kwargs: Any) -> Any:
            s.seen[request_id] = list(prompt_ids)
            return generate(request_id, prompt_ids, *args, **kwargs)

        engine.generate = spy  # records what the real engine is given, then lets it generate
        yield s


def _ask(client: OpenAI, messages: list[dict[str, Any]], stream: bool, redump: bool) -> dict[str, Any]:
    """One agent step: the assistant message as the agent appends it to its history (reasoning replayed)."""
    if not stream:
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        msg = reply.choices[0].message.model_dump(exclude_none=True)
    else:
        chunks = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        msg = {"role": "assistant", "content": "".join(d.content or "" for d in deltas) or None}
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        if reasoning:
            msg["reasoning_content"] = reasoning
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        if calls:
            msg["tool_calls"] = [{"id": tc.id, "type": "function",
                                  "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                                 for tc in calls]  # fmt: skip
    if redump:  # arguments re-serialised compactly, whitespace around the text stripped
        for tc in msg.get("tool_calls") or []:
            tc["function"]["arguments"] = json.dumps(json.loads(tc["function"]["arguments"]), separators=(",", ":"))
        if msg.get("content"):
            msg["content"] = msg["content"].strip()
    return msg


def _run_agent(client: OpenAI, stream: bool, redump: bool) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent. 🚀"},
                                  {"role": "user", "content": "Fix the greeting in src/util.py 🙂"}]  # fmt: skip
    for step, results in enumerate(RESULTS):
        msg = _ask(client, copy.deepcopy(msgs), stream, redump)
        msgs.append(msg)
        calls = msg.get("tool_calls") or []
        assert len(calls) == len(results or []), f"step {step}: {msg}"
        msgs += [
            {"role": "tool", "tool_call_id": tc["id"], "content": r} for tc, r in zip(calls, results or [], strict=True)
        ]
        if not calls and step + 1 < len(RESULTS):
            msgs.append({"role": "user", "content": FOLLOWUP})
    return msgs


def _check_replies(family: str, msgs: list[dict[str, Any]]) -> None:
    """The agent got every scripted turn back: text, tool calls and their arguments, and reasoning."""
    replies = [m for m in msgs if m["role"] == "assistant"]
    assert len(replies) == len(SCRIPT)
    for reply, turn in zip(replies, SCRIPT, strict=True):
        text = turn if isinstance(turn, str) else turn.get("text", "")
        assert (reply.get("content") or "").strip() == text.strip()
        expected = [] if isinstance(turn, str) else turn["tool_calls"]
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.get("tool_calls") or []]
        assert got == [(c["name"], c["arguments"]) for c in expected]
        reasoning = turn.get("reasoning", "") if isinstance(turn, dict) and family in THINKING else ""
        assert (reply.get("reasoning_content") or "").strip() == reasoning


def _trie_size(seqs: list[list[int]]) -> int:
    """Distinct tokens of a set of sequences once shared prefixes are merged."""
    root: dict[int, Any] = {}
    n = 0
    for seq in seqs:
        node = root
        for tok in seq:
            if tok not in node:
                node[tok], n = {}, n + 1
            node = node[tok]
    return n


RATIOS: dict[tuple[str, str], float] = {}


@pytest.mark.parametrize("mode", list(MODES))
def test_every_call_trains_on_exactly_what_it_sampled_and_saw(served: Served, mode: str) -> None:
    stream, redump = MODES[mode]
    session = f"family-{served.family}-{mode}"
    msgs = _run_agent(served.client(session), stream, redump)
    _check_replies(served.family, msgs)
    trace = served.proxy.end(session, reward=1.0)
    calls = trace["calls"]
    assert len(calls) == len(SCRIPT) and all(c["stream"] is stream and not c["side"] for c in calls)
    tok = served.proxy.proxy.template.tokenizer
    prompts = all_prompt_ids(trace)
    before = 0
    for k, call in enumerate(calls):
        # the engine sampled the family's own syntax, as real ids; the trace holds the very prompt it was given
        expect = render_family_turn(served.family, SCRIPT[k], before)
        assert tok.decode(call["response_ids"]) == expect
        before += len(SCRIPT[k].get("tool_calls", [])) if isinstance(SCRIPT[k], dict) else 0
        assert prompts[k] == served.seen[call["call_id"]], f"call {k}: the trace's prompt is not the engine's"
        if "parent" in call:  # an extended call: its parent's prompt + sampled ids, verbatim, then new text
            parent = next(i for i, c in enumerate(calls) if c["call_id"] == call["parent"])
            assert prompts[k][: len(prompts[parent]) + len(calls[parent]["response_ids"])] == (
                prompts[parent] + calls[parent]["response_ids"]
            )

    samples = build_samples(trace)
    index = {c["call_id"]: i for i, c in enumerate(calls)}
    for s in samples:
        masked = [j for j, m in enumerate(s.loss_mask) if m]
        targets: list[int] = []
        for call_id in s.branch:
            i = index[call_id]
            full = prompts[i] + calls[i]["response_ids"]
            assert s.input_ids[: len(full)] == full  # trained on the prompt the engine saw, then its own ids
            targets += range(len(prompts[i]), len(full))
        assert masked == targets  # every target is a sampled id at its own offset: nothing re-tokenized into one
    trained, sampled = retained_tokens(trace, samples)
    assert sampled == sum(len(c["response_ids"]) for c in calls)
    assert trained == sampled, f"{served.family}/{mode}: {trained}/{sampled} sampled tokens trained"

    # shared prefixes stored once: what the trace stores is the token trie of all the calls, nothing more
    stored = sum(len(c.get("prompt_ids") or c.get("prompt_suffix_ids") or []) + len(c["response_ids"]) for c in calls)
    assert stored == _trie_size([prompts[i] + c["response_ids"] for i, c in enumerate(calls)])
    roots = sum("parent" not in c for c in calls)
    RATIOS[served.family, mode] = trained / sampled
    naive = sum(len(p) for p in prompts) + sum(len(c["response_ids"]) for c in calls)
    print(
        f"\n[family-drift] {served.family:<12} {mode:<6} calls={len(calls)} branches={len(samples)} roots={roots} "
        f"retained={trained}/{sampled} = {trained / sampled:.2f} | stored {stored} tokens of {naive} unshared"
    )


def test_non_append_only_templates_start_a_new_branch_there(served: Served) -> None:
    """Where the history stops being append-only, at the new user turn, the proxy forks instead of drifting, and
    only there (the calls before it extend each other)."""
    session = f"fork-{served.family}"
    _run_agent(served.client(session), stream=False, redump=False)
    calls = served.proxy.end(session, reward=1.0)["calls"]
    parents = [c.get("parent") for c in calls]
    assert parents[1:3] == [calls[0]["call_id"], calls[1]["call_id"]]  # the tool loop extends
    assert parents[4] == calls[3]["call_id"]
    rewritten = served.family in {"glm45", "gpt-oss", "mistral"}  # reasoning dropped; tools moved
    assert (parents[3] is None) is rewritten, f"{served.family}: call 3 parent {parents[3]}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_answer_to_a_request_without_tools_is_the_same_streamed_or_not(family: str, family_model: Any) -> None:
    """No tools offered (aider): the family's framing (Harmony's channel headers, GLM's empty think) never reaches
    the agent as text, streamed or not."""
    answer = "Done — 完了 ✓"
    with running_proxy(family_model(family), engine_options={"turns": [answer]}) as p:
        client = OpenAI(base_url=f"{p.url}/s/no-tools/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "Say done."}]
        plain = client.chat.completions.create(model="m", messages=msgs).choices[0].message.content
        chunks = client.chat.completions.create(model="m", messages=msgs, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert plain == streamed == answer
