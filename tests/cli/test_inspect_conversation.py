"""`hrl inspect --trace`: a golden trace (tests/golden, recorded through the real proxy with the tiny model's
tokenizer) shown as the conversation the agent lived, decoded with that tokenizer and parsed by the proxy's own
parsers; `hrl.runners.conversation` underneath."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.cli.tables import PIPE_WIDTH
from hrl.runners.conversation import MORE, conversation, cut
from hrl.runners.trace import read_traces

GOLDEN = Path(__file__).parents[1] / "golden" / "chat-json.jsonl"
(TRACE,) = list(read_traces(GOLDEN))
# the script tests/golden/make.py drove: call 1 asks for `ls -la`, gets "ok"; a fork of call 1 got "no such file"
CALLS = ["c1-9bdaea", "c2-d6e871", "c3-da8b4c", "c4-ee0583"]


def hrl_inspect(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("COLUMNS", None)
    cmd = [sys.executable, "-m", "hrl.cli", "inspect", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_the_conversation_shows_tool_calls_their_results_and_the_reward(tiny_model: str):
    out = hrl_inspect(str(GOLDEN), "--trace", "chat-json", "--model", tiny_model)  # the session token
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # decoded: no note
    text = out.stdout
    first = text.index("c1-9bdaea  @")
    call = text.index('tool call bash {"command": "ls -la"}')
    fork = text.index("c4-ee0583  @")
    result = text.index("no such file")  # the tool result the forked call was shown
    assert first < call < fork < result
    assert "says\n" in text and "Looking." in text[first:call]
    assert text.index("reward 0 · success no") > result
    assert max(len(line) for line in text.splitlines()) <= PIPE_WIDTH  # a pipe without COLUMNS


def test_json_has_the_calls_in_order_with_parsed_tool_calls(tiny_model: str):
    out = hrl_inspect(str(GOLDEN), "--trace", "cd3d", "--model", tiny_model, "--json")
    assert out.returncode == 0, out.stderr
    conv = json.loads(out.stdout)["conversation"]
    assert conv["decoded"] is True and conv["note"] is None
    calls = conv["calls"]
    assert [c["call_id"] for c in calls] == CALLS
    assert [c["started_at"] for c in calls] == sorted(c["started_at"] for c in calls)
    assert calls[0]["reply"] == {"reasoning": None, "text": "Looking.",
                                 "tool_calls": [{"name": "bash", "arguments": '{"command": "ls -la"}'}]}  # fmt: skip
    assert calls[1]["reply"]["tool_calls"] == [{"name": "bash", "arguments": '{"command": "python -m pytest -q"}'}]
    assert calls[2]["reply"]["tool_calls"] == [] and calls[2]["reply"]["text"].startswith("All tests pass now.")
    assert calls[0]["input"]["since"] is None and "fix the tests" in calls[0]["input"]["text"]
    assert (calls[3]["input"]["since"], calls[3]["input"]["tokens"]) == ("c1-9bdaea", 24)
    assert "<tool_response>\nno such file\n</tool_response>" in calls[3]["input"]["text"]
    assert [len(c["tools"]) for c in calls] == [1, 1, 0, 0]  # each tool event under the call that asked for it
    assert conv["outcome"]["reward"] == 0.0 and conv["outcome"]["info"] == {"golden": True}


def test_without_a_tokenizer_it_says_so_once_and_shows_counts(tmp_path: Path):
    out = hrl_inspect(str(GOLDEN), "--trace", "cd3d")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("Note: ") == 1 and "no model" in out.stderr
    assert "c4-ee0583  @" in out.stdout and "tool call" not in out.stdout
    bad = hrl_inspect(str(GOLDEN), "--trace", "cd3d", "--model", str(tmp_path / "nope"))
    assert bad.returncode == 2 and bad.stderr.startswith("Error: cannot decode with --model") and "Hint:" in bad.stderr


def test_long_texts_are_cut_with_a_marker_and_full_shows_all(tiny_model: str):
    from hrl.runners.conversation import load_template

    template, _ = load_template(tiny_model)
    whole = conversation(TRACE, template, max_lines=None)["calls"][0]["input"]["text"]
    short = conversation(TRACE, template, max_lines=5)["calls"][0]["input"]["text"]
    lines = whole.splitlines()
    assert len(lines) > 5  # the first prompt: system prompt, tool schema, task
    assert short.splitlines() == [*lines[:5], MORE.format(n=len(lines) - 5)]
    full = hrl_inspect(str(GOLDEN), "--trace", "cd3d", "--model", tiny_model, "--json", "--full")
    assert json.loads(full.stdout)["conversation"]["calls"][0]["input"]["text"] == whole


def test_cut_counts_lines_and_very_long_lines():
    text = "\n".join(f"line {i}" for i in range(10))
    assert cut(text, None) == text and cut(text, 10) == text
    assert cut(text, 3) == "line 0\nline 1\nline 2\n… 7 more lines"
    one = "x" * 10_000  # one line of 10,000 characters: 3 lines' worth is 3 × 400 characters
    assert cut(one, 3) == "x" * 1200 + "…"


def test_sessions_and_prefixes_select_a_trace(tmp_path: Path):
    other = {**TRACE, "trace_id": "cd3d0000", "session": "other"}
    path = tmp_path / "two.jsonl"
    path.write_text(GOLDEN.read_text() + json.dumps(other) + "\n")
    assert json.loads(hrl_inspect(str(path), "-t", "other", "--json").stdout)["trace_id"] == "cd3d0000"
    many = hrl_inspect(str(path), "-t", "cd3d")
    assert many.returncode == 2 and "matches 2 traces" in many.stderr and "Hint: give a longer prefix" in many.stderr
    none = hrl_inspect(str(path), "-t", "zz")
    assert none.returncode == 2 and "no trace with id 'zz'" in none.stderr and "Hint: known ids" in none.stderr


@pytest.mark.parametrize("name", ["anthropic-sse", "responses-json", "gemini-sse"])
def test_every_dialect_decodes_to_the_scripted_tool_calls(tiny_model: str, name: str):
    from hrl.runners.conversation import load_template

    (trace,) = list(read_traces(GOLDEN.with_name(f"{name}.jsonl")))
    template, note = load_template(tiny_model)
    assert note is None
    calls = conversation(trace, template)["calls"]
    asked = [tc["arguments"] for c in calls for tc in c["reply"]["tool_calls"]]
    assert asked[:2] == ['{"command": "ls -la"}', '{"command": "python -m pytest -q"}']
