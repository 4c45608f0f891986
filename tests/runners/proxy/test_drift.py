"""The proxy's drift guarantee on three tokenizers: the tiny BPE, Qwen's real vocabulary, Mistral's real vocabulary.

On an append-only multi-turn conversation with tool calls, call k's prompt ids must begin with call k-1's prompt ids
+ its sampled ids, exactly (the proxy reuses sampled ids and tokenizes only new text); a rewritten history starts a
new branch. Each tokenizer serves one real proxy over HTTP with the scripted engine (assistant turns played back as
real ids of that tokenizer), driven by the official `openai` SDK through awkward text: emoji and CJK, code with
indentation and trailing spaces, JSON arguments with nested quotes and newlines, an empty tool result, a turn with
text and two tool calls; by a plain agent, a streaming one, and one that sends tool arguments back re-serialized.
`pytest -s` prints, per tokenizer and agent, what naive re-tokenization of the final conversation would have
drifted: the figure the proxy's id reuse saves. The scripted engine samples the canonical tokenization of each turn
and writes tool calls exactly as the template renders them, so these counts are a floor: a real model also samples
non-canonical splits and compact JSON.
"""

from __future__ import annotations

import copy
import json
import os
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from hrl.runners.engines.scripted import render_turn
from hrl.runners.trace import call_prompt_ids, read_traces
from tests.proxy_helpers import TOOLS, RunningProxy, running_proxy
from tests.tokenizers import MissingTokenizerData, build_mistral_model, build_qwen_model, reference_encoder

SYSTEM = "You are a careful coding agent.\nRéponds brièvement — 简洁回答. 🚀"
USER = "Fix the greeting in src/util.py 🙂 (ユーティリティ)\n\n```\n$ python -c 'import util'  \n```"
NEW_CODE = (
    'def greet(name: str) -> str:  \n    """Say hi — 你好."""\n    return f"héllo, {name}! 👋"\n\n\n'
    "\tindented_with_a_tab = True   \n"
)
SCRIPT: list[str | dict[str, Any]] = [
    {  # text (ending in spaces) + two tool calls
        "text": "Let me look around first — 先看看文件 🔍  ",
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "ls -la src/ && cat src/util.py"}},
            {"name": "bash", "arguments": {"command": 'grep -rn "TODO\\|FIXME" src/ || echo "none"'}},
        ],
    },
    {  # JSON arguments with nested quotes, backslashes, newlines, a JSON document inside a string
        "tool_calls": [
            {
                "name": "write_file",
                "arguments": {
                    "path": "src/util.py",
                    "content": NEW_CODE,
                    "options": {"note": 'quote " backslash \\ newline \n end', "json": json.dumps({"a": [1, "x\ny"]})},
                },
            }
        ],
    },
    # text only: code with indentation and trailing spaces, CJK, and trailing whitespace the client never sees back
    'Done. The new function:\n\n```python\ndef greet(name: str) -> str:  \n    return f"héllo, {name}! 👋"\n```\n\n'
    "日本語: 完了しました。Ünïcödé ✓   \n",
    {"tool_calls": [{"name": "bash", "arguments": {"command": "python -m pytest -q tests/ 2>&1 | tail -n 1"}}]},
    "All green ✅ — 完成！ 🎉",
]
TOOL_RESULTS = [
    ["total 8\n-rw-r--r-- 1 dev dev 61 util.py   \ndef greet(name):\n\treturn 'hi ' + name  \n", ""],  # "" = empty
    ['{"ok": true, "bytes": 97, "path": "src/util.py"}'],
    None,  # a text turn: the user answers
    ["1 passed in 0.01s\n"],
    None,
]
USER_FOLLOWUP = "Now run the tests, please 🙏\n\tand show the summary line only."
FINISH = ["tool_calls", "tool_calls", "stop", "tool_calls", "stop"]

# Ids the real vocabularies give (Qwen2/2.5/3's tokenizer; Mistral's Tekken with its 1000 control slots), pinned.
KNOWN_IDS = {
    "qwen": {
        "Hello world": [9707, 1879],
        "<|endoftext|>": [151643],
        "<|im_start|>": [151644],
        "<|im_end|>": [151645],
        "<tool_call>": [151657],
        "</tool_call>": [151658],
        "<think>": [151667],
    },
    "mistral": {"Hello world": [22177, 4304], "<s>": [1], "</s>": [2], "[INST]": [3]},
}
# How the agent talks: plain or streamed replies; "redump" agents keep parsed tool arguments and send them back
# re-serialized compactly (`{"command":"ls"}`), as many agents do, so the history's text is not what was sampled.
MODES = {"plain": (False, False), "stream": (True, False), "redump": (False, True)}
CHECK_TEXTS = [
    "Hello world",
    "HelloWorld camelCaseName XMLHttpRequest getHTTPResponseCode",
    NEW_CODE,
    USER,
    SYSTEM,
    "日本語のテキスト 🎉👍🏽 naïve café e\u0301 ﬁ Ångström",
    'arguments: {"a": "b \\"q\\"\\n", "c": [1, 2.5e-3, null]}',
    "    \n\n\t  x  \n   ",
    "1234567890 3.14159 0x1F 1,000,000",
    "Привет, мир! مرحبا 안녕하세요 שלום \u200b\u00a0ok",
    "diff --git a/m.py b/m.py\n@@ -1 +1 @@\n-    return a - b\n+    return a + b\n",
]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _build(builder: Any, factory: pytest.TempPathFactory, name: str) -> str:
    try:
        return str(builder(factory.mktemp("drift-models") / name))
    except MissingTokenizerData as e:
        if _in_ci():
            pytest.fail(f"[{name} tokenizer] {e}", pytrace=False)
        pytest.skip(f"[{name} tokenizer] {e}")


@pytest.fixture(scope="session")
def qwen_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _build(build_qwen_model, tmp_path_factory, "qwen")


@pytest.fixture(scope="session")
def mistral_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _build(build_mistral_model, tmp_path_factory, "mistral")


@dataclass
class Served:
    kind: str
    proxy: RunningProxy
    traces: Path

    @property
    def template(self) -> Any:
        return self.proxy.proxy.template

    def client(self, session: str) -> OpenAI:
        return OpenAI(base_url=f"{self.proxy.url}/s/{session}/v1", api_key="unused", max_retries=0)

    def end(self, session: str) -> dict[str, Any]:
        r = httpx.post(f"{self.proxy.url}/s/{session}/end", json={"reward": 1.0}, headers=self.proxy.control)
        assert r.status_code == 200, r.text
        (trace,) = [t for t in read_traces(self.traces) if t["session"] == session]
        return trace

    def encode(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        """Naive: render the whole conversation as text and tokenize it in one go."""
        text = self.template.render(messages, TOOLS, add_generation_prompt=add_generation_prompt)
        return list(self.proxy.call(self.template.encode, text))


@pytest.fixture(scope="module", params=["tiny", "qwen", "mistral"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One proxy per tokenizer for the whole module (loading a 150k vocabulary takes seconds)."""
    model = request.getfixturevalue(f"{request.param}_model")
    traces = tmp_path_factory.mktemp(f"drift-{request.param}") / "traces.jsonl"
    with running_proxy(model, traces=str(traces), engine_options={"turns": SCRIPT}) as p:
        yield Served(request.param, p, traces)


def _ask(client: OpenAI, messages: list[dict[str, Any]], stream: bool, redump: bool = False) -> dict[str, Any]:
    """One agent step; returns the assistant message as the agent would append it to its history."""
    if not stream:
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        msg = reply.choices[0].message.model_dump(exclude_none=True)
        for tc in msg.get("tool_calls") or [] if redump else []:
            tc["function"]["arguments"] = json.dumps(json.loads(tc["function"]["arguments"]), separators=(",", ":"))
        return msg
    chunks = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in calls
        ]
    return msg


def _run_agent(
    client: OpenAI, stream: bool, steps: int = len(SCRIPT), redump: bool = False
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Play the scripted conversation like an agent; returns the final history and the messages of each call."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    sent = []
    for step in range(steps):
        sent.append(copy.deepcopy(msgs))
        msg = _ask(client, msgs, stream, redump)
        msgs.append(msg)
        results = TOOL_RESULTS[step]
        calls = msg.get("tool_calls") or []
        assert len(calls) == len(results or []), f"step {step}: {msg}"
        for tc, result in zip(calls, results or [], strict=True):
            msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
        if not calls and step + 1 < steps:
            msgs.append({"role": "user", "content": USER_FOLLOWUP})
    return msgs, sent


def _check_replies(msgs: list[dict[str, Any]]) -> None:
    """The agent got every scripted turn back intact: unicode, whitespace inside text, JSON arguments."""
    replies = [m for m in msgs if m["role"] == "assistant"]
    assert len(replies) == len(SCRIPT)
    for reply, turn in zip(replies, SCRIPT, strict=True):
        text = turn if isinstance(turn, str) else turn.get("text", "")
        assert (reply.get("content") or "").strip() == text.strip()
        expected = [] if isinstance(turn, str) else turn.get("tool_calls", [])
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.get("tool_calls") or []]
        assert got == [(c["name"], c["arguments"]) for c in expected]


def _first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("mode", list(MODES))
def test_append_only_conversation_reuses_sampled_ids_exactly(served: Served, mode: str) -> None:
    stream, redump = MODES[mode]
    session = f"drift-{served.kind}-{mode}"
    msgs, sent = _run_agent(served.client(session), stream, redump=redump)
    _check_replies(msgs)
    trace = served.end(session)
    calls = trace["calls"]
    assert len(calls) == len(SCRIPT)
    assert [c["finish_reason"] for c in calls] == FINISH
    assert all(c["stream"] is stream and not c["side"] for c in calls)
    tok = served.template.tokenizer

    assert call_prompt_ids(trace, 0) == served.encode(sent[0])  # a root is the whole conversation, tokenized
    for k, call in enumerate(calls):
        # the engine sampled the scripted turn as real ids of this tokenizer
        assert tok.decode(call["response_ids"]) == render_turn(SCRIPT[k], "<|im_end|>")
        if k == 0:
            assert "prompt_ref" not in call
            assert "parent" not in call
            continue
        prev = call_prompt_ids(trace, k - 1) + calls[k - 1]["response_ids"]
        ids = call_prompt_ids(trace, k)
        assert ids[: len(prev)] == prev, f"call {k} drifted at token {_first_divergence(ids, prev)}"
        assert call["prompt_ref"] == {"call_id": calls[k - 1]["call_id"], "length": len(prev)}
        assert call["parent"] == calls[k - 1]["call_id"]
        # only the new messages were tokenized: the end of the assistant turn, then the new turns, then the prompt
        suffix = tok.decode(call["prompt_suffix_ids"])
        assert suffix.startswith("\n<|im_start|>user\n")
        assert suffix.endswith("<|im_end|>\n<|im_start|>assistant\n")

    # Naive re-tokenization: render the final conversation as text and tokenize it whole, as a trainer without the
    # proxy's ids would. Count the calls whose prompt + sampled ids it does not reproduce (one drifted turn drifts
    # every later call), and the assistant turns whose re-rendered text tokenizes unlike the ids sampled for it.
    final = served.encode(msgs, add_generation_prompt=False)
    drifted = []
    for k, call in enumerate(calls):
        full = call_prompt_ids(trace, k) + call["response_ids"]
        if final[: len(full)] != full:
            drifted.append((k, _first_divergence(final, full)))
    newline = served.template.encode("\n")
    turns = 0
    for k, call in enumerate(calls):
        before = served.template.render(msgs[: len(sent[k])], TOOLS)
        upto = served.template.render(msgs[: len(sent[k]) + 1], TOOLS, add_generation_prompt=False)
        turns += served.template.encode(upto[len(before) :]) != call["response_ids"] + newline
    first = f" (from call {drifted[0][0]}, token {drifted[0][1]})" if drifted else ""
    print(
        f"\n[drift] {served.kind:<7} {mode:<6} vocab={len(tok)} calls={len(calls)} "
        f"final prompt={len(call_prompt_ids(trace, len(calls) - 1))} tokens | naive re-tokenization: {turns}/{len(calls)}"
        f" assistant turns tokenize unlike their sampled ids, {len(drifted)}/{len(calls)} calls drift{first}"
    )


def test_rewritten_history_starts_a_new_branch(served: Served) -> None:
    session = f"rewrite-{served.kind}"
    client = served.client(session)
    msgs, _ = _run_agent(client, stream=False, steps=2)  # [sys, user, a0, tool, tool, a1, tool]
    other_system = [{"role": "system", "content": "You are another agent — 别的代理."}, *msgs[1:]]
    dropped_turn = [*msgs[:2], *msgs[5:]]  # the first assistant turn and its two tool results are gone
    edited_result = copy.deepcopy(msgs)
    edited_result[4]["content"] = "(the empty result, edited later)"
    replies = [
        client.chat.completions.create(model="m", messages=rewritten, tools=TOOLS).choices[0].message
        for rewritten in (other_system, dropped_turn, edited_result)
    ]
    # an append-only continuation of the last rewrite extends that new branch again
    resumed = [*edited_result, replies[-1].model_dump(exclude_none=True)]
    for tc in resumed[-1].get("tool_calls") or []:
        resumed.append({"role": "tool", "tool_call_id": tc["id"], "content": "ok"})
    if not resumed[-1].get("tool_calls") and resumed[-1]["role"] == "assistant":
        resumed.append({"role": "user", "content": "go on"})
    client.chat.completions.create(model="m", messages=resumed, tools=TOOLS)
    trace = served.end(session)
    calls = trace["calls"]
    assert [c.get("parent") for c in calls[:2]] == [None, calls[0]["call_id"]]
    for k, messages in ((2, other_system), (3, dropped_turn)):
        assert "parent" not in calls[k], f"rewrite {k} reused the ids of {calls[k]['parent']}"
        assert call_prompt_ids(trace, k) == served.encode(messages)  # a new root: tokenized whole
    # an edited tool result keeps the history before it: the new branch forks from call 0 (its prompt + sampled
    # ids, exactly), not from call 1, whose prompt held the old result
    assert calls[4]["parent"] == calls[0]["call_id"]
    fork = call_prompt_ids(trace, 0) + calls[0]["response_ids"]
    assert call_prompt_ids(trace, 4)[: len(fork)] == fork
    assert len(calls) == 6
    assert calls[5]["parent"] == calls[4]["call_id"]
    prev = call_prompt_ids(trace, 4) + calls[4]["response_ids"]
    assert call_prompt_ids(trace, 5)[: len(prev)] == prev


@pytest.mark.parametrize("served", ["qwen", "mistral"], indirect=True)
def test_converted_vocabulary_encodes_like_the_original(served: Served) -> None:
    """The served tokenizer (as the proxy loaded it) = the original tiktoken encoder, and round-trips text."""
    pytest.importorskip("tiktoken")
    tok = served.template.tokenizer
    original = reference_encoder(served.kind)
    for text in CHECK_TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == original(text), f"{served.kind} encodes {text!r} unlike the original"
        expect = text if served.kind == "mistral" else unicodedata.normalize("NFC", text)  # Qwen normalizes
        assert tok.decode(ids) == expect
    for text, ids in KNOWN_IDS[served.kind].items():
        assert tok.encode(text, add_special_tokens=False) == ids, text
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert served.template.end_of_turn == "<|im_end|>"
    assert im_end in served.template.stop_ids
    print(f"\n[vocab] {served.kind:<7} {len(tok)} tokens ({type(tok).__name__}), <|im_end|>={im_end}")


# Replies whose streamed text must not be cut short: a tail that looks like the start of a tag, and text after a
# tool call. If the agent echoed truncated text, it would no longer match what was sampled and the next call
# would lose its parent.
TRUNCATED_IN_STREAM = {
    "ends-like-a-tag": "Compare them: a < b, and for lists use <",
    "text-after-tool-call": 'Intro\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\nOutro.',
}


@pytest.mark.parametrize("case", list(TRUNCATED_IN_STREAM))
def test_streamed_reply_text_is_complete_so_the_next_call_extends_it(tiny_model: str, case: str) -> None:
    script = [TRUNCATED_IN_STREAM[case], "ok"]
    with running_proxy(tiny_model, engine_options={"turns": script}) as p:
        contents, parents = {}, {}
        for stream in (False, True):
            session = f"{case}-{stream}"
            client = OpenAI(base_url=f"{p.url}/s/{session}/v1", api_key="unused", max_retries=0)
            msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
            msg = _ask(client, msgs, stream)
            msgs.append(msg)
            msgs += [{"role": "tool", "tool_call_id": tc["id"], "content": "out"} for tc in msg.get("tool_calls") or []]
            msgs += [] if msg.get("tool_calls") else [{"role": "user", "content": "next"}]
            client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
            contents[stream], parents[stream] = msg.get("content"), p.end(session)["calls"][1].get("parent")
    assert parents[False] is not None
    assert contents[True] == contents[False]
    assert parents[True] is not None
