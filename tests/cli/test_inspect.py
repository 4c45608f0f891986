"""`hrl inspect` and `hrl.runners.summary`: hand-made traces, hand-computed numbers, the command end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hrl.cli.tables import PIPE_WIDTH
from hrl.runners.summary import (
    TraceSelectionError,
    describe_branches,
    describe_calls,
    select_trace,
    summarize_file,
    summarize_trace,
)
from hrl.runners.trace import SCHEMA, TraceFormatError, call_prompt_ids, read_trace_file, read_traces, validate_trace


def call(cid: str, prompt: list[int] | None, resp: list[int], **kw: Any) -> dict[str, Any]:
    """A call: `prompt` whole, or `ref=(call_id, length)` + `suffix`; times `t=(start, first_token, end)`."""
    start, first, end = kw.pop("t", (0.0, 0.0, 0.0))
    c: dict[str, Any] = {"call_id": cid, "dialect": kw.pop("dialect", "chat"), "stream": True}
    c |= {"side": kw.pop("side", False), "started_at": start, "first_token_at": first, "ended_at": end}
    if "ref" in kw:
        ref_id, length = kw.pop("ref")
        c |= {"prompt_ref": {"call_id": ref_id, "length": length}, "prompt_suffix_ids": kw.pop("suffix")}
    else:
        c["prompt_ids"] = prompt
    c |= {"response_ids": resp, "response_logprobs": [-0.5] * len(resp)}
    c |= {"versions": kw.pop("versions", [[0, 8]]), "finish_reason": kw.pop("finish", "stop")}
    return c | kw  # parent=, error=


def trace(tid: str, calls: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    t = {"schema": SCHEMA, "trace_id": tid, "session": f"s-{tid}", "task_id": kw.pop("task", "task-1")}
    t |= {"status": "ok", "failure_reason": None, "reward": 1.0, "reward_info": {}, "started_at": 1000.0}
    return t | {"ended_at": 1005.0, "calls": calls, "tools": []} | kw


def tool(name: str, start: float, end: float) -> dict[str, Any]:
    return {"name": name, "started_at": start, "ended_at": end}


# c1 ─┬─ c2        (c2 extends c1; the version changes mid-response, 7 → 8)
#     └─ c6        (a second child of c1: a retry from the same point)
# c3 ─── c5        (c3 is a new root: compaction; c3 also uses another dialect)
# c4               (side call, its own root)
BRANCHING = trace(
    "a1b2c3d4e5f6",
    [
        call("c1", [1, 2, 3], [4, 5], t=(0.0, 0.1, 0.5), versions=[[0, 7]], finish="tool_calls"),
        call(
            "c2",
            None,
            [8, 9, 10],
            ref=("c1", 5),
            suffix=[6, 7],
            parent="c1",
            t=(1.5, 1.6, 2.0),
            versions=[[0, 7], [2, 8]],
        ),
        call("c3", [1, 20, 21, 22], [23, 24], t=(2.5, 2.6, 3.0), dialect="responses", finish="tool_calls"),
        call("c4", [30, 31], [32], side=True, t=(3.0, 3.1, 3.25)),
        call("c5", None, [26, 27], ref=("c3", 6), suffix=[25], parent="c3", t=(3.5, 3.6, 4.0)),
        call("c6", None, [41], ref=("c1", 5), suffix=[40], parent="c1", t=(4.0, 4.1, 4.5)),
    ],
    tools=[tool("bash", 0.5, 1.5), tool("bash", 2.0, 2.25), tool("read", 2.0, 2.5)],
    reward_info={"fail_to_pass": {"passed": 2, "total": 2}},
)
FAILED = trace(
    "a1ffee00",
    [call("c1", [1, 2], [3, 4, 5], t=(0.0, 1.0, 2.0), finish="length")],
    status="failed",
    failure_reason="agent_timeout",
    reward=0.0,
    ended_at=1010.0,
)
EMPTY = trace("c0ffee00", [], status="failed", failure_reason="no_llm_calls", reward=None, task="task-2")


def test_hand_made_traces_are_valid():
    for t in (BRANCHING, FAILED, EMPTY):
        validate_trace(t)


def test_summary_of_a_branching_trace():
    s = summarize_trace(BRANCHING)
    assert s["calls"] == 6
    assert s["side_calls"] == 1
    assert s["turns"] == 5
    assert s["branches"] == 4  # leaves c2, c4, c5, c6
    assert s["prompt_tokens"] == 3 + 7 + 4 + 2 + 7 + 6
    assert s["response_tokens"] == 2 + 3 + 2 + 1 + 2 + 1
    assert s["trained_tokens"] == 11 - 1  # the side call's token is not trained on
    # calls on their own: 5 + 10 + 6 + 3 + 9 + 7 = 40 tokens; merged branches: 10 + 3 + 9 + 7 = 29
    assert s["merge_ratio"] == pytest.approx(40 / 29, abs=1e-3)
    assert s["duration_s"] == 5.0
    assert s["llm_s"] == pytest.approx(0.5 + 0.5 + 0.5 + 0.25 + 0.5 + 0.5)
    assert s["tool_s"] == pytest.approx(1.0 + 0.25 + 0.5)
    assert s["versions"] == [7, 8]
    assert s["dialects"] == ["chat", "responses"]
    assert s["tools"] == {"bash": 2, "read": 1}
    assert (s["status"], s["failure_reason"], s["reward"]) == ("ok", None, 1.0)


def test_prompt_lengths_match_resolved_prompt_refs():
    rows = describe_calls(BRANCHING)
    assert [r["prompt_tokens"] for r in rows] == [len(call_prompt_ids(BRANCHING, i)) for i in range(6)]
    assert [r["parent"] for r in rows] == [None, "c1", None, None, "c3", "c1"]
    assert rows[1]["versions"] == [7, 8]
    assert rows[0]["first_token_s"] == pytest.approx(0.1)


def test_branches_are_root_to_leaf_paths():
    branches = describe_branches(BRANCHING)
    assert [b["calls"] for b in branches] == [["c1", "c2"], ["c4"], ["c3", "c5"], ["c1", "c6"]]
    assert [b["tokens"] for b in branches] == [10, 3, 9, 7]
    assert [b["loss_tokens"] for b in branches] == [5, 1, 4, 3]
    assert [(b["first_version"], b["last_version"]) for b in branches] == [(7, 8), (8, 8), (8, 8), (7, 8)]
    assert [b["side"] for b in branches] == [False, True, False, False]


def test_a_linear_trace_merges_into_one_branch():
    t = trace("lin", [call("c1", [1, 2], [3]), call("c2", None, [5], ref=("c1", 3), suffix=[4], parent="c1")])
    s = summarize_trace(t)
    assert s["branches"] == 1
    assert s["merge_ratio"] == pytest.approx((3 + 5) / 5)


def test_failed_and_empty_traces():
    f = summarize_trace(FAILED)
    assert (f["status"], f["failure_reason"], f["branches"], f["merge_ratio"]) == ("failed", "agent_timeout", 1, 1.0)
    e = summarize_trace(EMPTY)
    assert (e["calls"], e["branches"], e["merge_ratio"], e["versions"]) == (0, 0, None, [])


def test_file_summary():
    agg = summarize_file([BRANCHING, FAILED, EMPTY])
    assert agg["traces"] == 3
    assert agg["status"] == {"ok": 1, "failed": 2}
    assert agg["failures"] == {"agent_timeout": 1, "no_llm_calls": 1}
    assert (agg["reward_mean"], agg["rewarded"]) == (0.5, 2)  # the empty trace has no reward
    assert agg["tokens"] == {"prompt": 29 + 2, "response": 11 + 3, "trained": 10 + 3}
    assert agg["latency_s"]["duration"] == {"p50": 5.0, "p95": pytest.approx(9.5)}  # durations 5, 10, 5
    assert agg["latency_s"]["tool"]["p50"] == 0.0


def test_select_trace_by_prefix():
    traces = [BRANCHING, FAILED, EMPTY]
    assert select_trace(traces, "a1b")["trace_id"] == "a1b2c3d4e5f6"
    assert select_trace(traces, "c0ffee00") is EMPTY
    with pytest.raises(TraceSelectionError, match="matches 2 traces") as e:
        select_trace(traces, "a1")
    assert "a1ffee00" in str(e.value)
    with pytest.raises(TraceSelectionError, match="no trace with id 'zz'") as e:
        select_trace(traces, "zz")
    assert e.value.hint
    assert "c0ffee00" in e.value.hint


# ---- the command -------------------------------------------------------------------------------------------


def hrl_inspect(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("COLUMNS", None)
    cmd = [sys.executable, "-m", "hrl.cli", "inspect", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in (BRANCHING, FAILED, EMPTY)))
    assert len(list(read_traces(path))) == 3
    return path


def test_json_lists_every_trace(trace_file):
    out = hrl_inspect(str(trace_file), "--json", "--samples")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [d["trace_id"] for d in data] == ["a1b2c3d4e5f6", "a1ffee00", "c0ffee00"]
    assert data[0]["branches"] == 4
    assert len(data[0]["samples"]) == 4


def test_json_of_one_trace_has_its_calls(trace_file):
    out = hrl_inspect(str(trace_file), "--trace", "a1b", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["trace_id"] == "a1b2c3d4e5f6"
    assert "samples" not in data
    assert [c["call_id"] for c in data["call_details"]] == ["c1", "c2", "c3", "c4", "c5", "c6"]
    assert len(data["tool_events"]) == 3


def test_human_output(trace_file):
    out = hrl_inspect(str(trace_file))
    assert out.returncode == 0, out.stderr
    assert all(s in out.stdout for s in ("a1b2c3d4", "a1ffee00", "c0ffee00", "agent_timeout", "3 traces"))
    assert "\x1b[" not in out.stdout
    assert out.stderr == ""
    assert max(len(line) for line in out.stdout.splitlines()) <= PIPE_WIDTH  # a pipe without COLUMNS


def test_a_pipe_shows_each_row_whole(tmp_path: Path):
    """Piped (no terminal, no COLUMNS), a task id of 30 characters is shown whole, not cut at 100 columns to
    `pypi__jmespath-…` like all its neighbours; COLUMNS still sets the width."""
    tasks = [f"pypi__jmespath-1.1.0-{i:08x}" for i in (0x66DC5986, 0x577C6E2D)]
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(json.dumps({**FAILED, "trace_id": f"f{i}", "task_id": t}) + "\n" for i, t in enumerate(tasks))
    )
    out = hrl_inspect(str(path))
    assert out.returncode == 0, out.stderr
    assert all(t in out.stdout for t in tasks) and "…" not in out.stdout, out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= PIPE_WIDTH
    narrow = subprocess.run([sys.executable, "-m", "hrl.cli", "inspect", str(path)], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "100"})  # fmt: skip
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 100 and "pypi__jmespath-…" in narrow.stdout


def test_human_tree_of_one_trace(trace_file):
    out = hrl_inspect(str(trace_file), "-t", "a1b2", "--samples")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= PIPE_WIDTH
    order = [next(i for i, line in enumerate(lines) if needle in line) for needle in ("c1  @", "tool bash", "c2  @")]
    assert order == sorted(order)  # the tool event sits between the calls
    assert "new root" in out.stdout
    assert "fail_to_pass 2/2" in out.stdout
    assert "c1 → c2" in out.stdout
    assert "v7→v8" in out.stdout


# main: m1 ─── m3 ; its sub-agent helper: h1 (trainable) ; helper's critic: k1 (untrained)
AGENT_TREE = trace(
    "ab7ee000",
    [
        call("m1", [1, 2], [3], t=(0.0, 0.1, 0.2), finish="tool_calls"),
        call("h1", [7, 8], [9], t=(0.3, 0.4, 0.5), agent="helper"),
        call("k1", [10, 11], [12], t=(0.6, 0.7, 0.8), agent="critic", trainable=False),
        call("m3", None, [5], ref=("m1", 3), suffix=[4], parent="m1", t=(0.9, 1.0, 1.1)),
    ],
    agents=[
        {"name": "main", "parent": None, "trainable": True, "calls": 2},
        {"name": "helper", "parent": "main", "trainable": True, "calls": 1},
        {"name": "critic", "parent": "helper", "trainable": False, "calls": 1},
    ],
)


def test_human_tree_nests_calls_under_their_agents(tmp_path):
    path = tmp_path / "tree.jsonl"
    path.write_text(json.dumps(AGENT_TREE) + "\n")
    out = hrl_inspect(str(path), "-t", "ab7e")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()

    def at(needle: str) -> tuple[int, int]:  # (line, indentation) of the first line holding needle
        i = next(i for i, line in enumerate(lines) if needle in line)
        return i, lines[i].index(needle.split()[0])

    main, helper, critic = at("agent main"), at("agent helper"), at("agent critic")
    m1, h1, k1, m3 = at("m1  @"), at("h1  @"), at("k1  @"), at("m3  @")
    assert main[1] < helper[1] < critic[1]  # helper under main, critic under helper
    assert m1[1] == m3[1] == helper[1] and h1[1] == critic[1] and k1[1] > critic[1]
    assert "untrained" in lines[critic[0]] and "untrained" in lines[k1[0]]


def _assert_error(out: subprocess.CompletedProcess[str], *needles: str, code: int = 1) -> None:
    assert out.returncode == code, out
    assert "Traceback" not in out.stderr
    assert out.stdout == ""
    assert out.stderr.startswith("Error: "), out.stderr
    for needle in needles:
        assert needle in out.stderr


def test_bad_line_names_file_and_line(trace_file):
    trace_file.write_text(trace_file.read_text() + json.dumps({**FAILED, "schema": "hrl.trace/0"}) + "\n")
    _assert_error(hrl_inspect(str(trace_file)), f"{trace_file}:4", "unknown schema")


def _cut_last_line(path: Path, trace: dict[str, Any]) -> str:
    """Append `trace` cut short the way a writer killed mid-write leaves it: no newline, half its bytes."""
    line = json.dumps(trace)
    path.write_text(path.read_text() + line[: len(line) // 2])
    return line


def test_a_last_line_cut_by_a_crash_is_left_out_with_a_warning(trace_file):
    _cut_last_line(trace_file, AGENT_TREE)
    assert read_trace_file(trace_file).cut_line == 4 and len(read_trace_file(trace_file).traces) == 3
    with pytest.raises(TraceFormatError, match="line is cut short"):  # the strict reader (training) still refuses
        list(read_traces(trace_file))
    warning = f"Warning: {trace_file}:4: the last line is cut short"
    for args in ((), ("--json",)):
        out = hrl_inspect(str(trace_file), *args)
        assert out.returncode == 0, out.stderr
        assert out.stderr.startswith(warning), out.stderr
        assert "3 traces" in out.stdout if not args else len(json.loads(out.stdout)) == 3


def test_a_cut_line_in_the_middle_stays_an_error(trace_file):
    _cut_last_line(trace_file, AGENT_TREE)
    trace_file.write_text(trace_file.read_text() + "\n" + json.dumps(AGENT_TREE) + "\n")  # a later append
    with pytest.raises(TraceFormatError, match=r"\.jsonl:4: not a valid .* not JSON"):
        read_trace_file(trace_file)
    _assert_error(hrl_inspect(str(trace_file)), f"{trace_file}:4", "not JSON", "Hint: line 4 is damaged")


def test_missing_file(tmp_path):
    _assert_error(hrl_inspect(str(tmp_path / "nope.jsonl")), "nope.jsonl", code=2)  # a bad path is a usage error


def test_unknown_and_ambiguous_trace_ids(trace_file):
    _assert_error(hrl_inspect(str(trace_file), "--trace", "zz"), "'zz'", "Hint: known ids: a1b2c3d4e5f6", code=2)
    _assert_error(hrl_inspect(str(trace_file), "--trace", "a1", "--json"), "a1b2c3d4e5f6, a1ffee00", code=2)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_file_without_traces_is_an_error_not_an_empty_screen(tmp_path: Path, as_json: bool):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = hrl_inspect(str(empty), *(["--json"] if as_json else []))
    assert proc.returncode == 1 and proc.stderr.startswith(f"Error: no traces in {empty}"), proc.stderr
    assert proc.stdout == ""
