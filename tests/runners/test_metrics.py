"""`hrl.runners.metrics` on hand-made traces with hand-computed values, and `hrl.train.sinks.MetricsSink`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.metrics import (
    CALL_METRICS,
    CONTRACT,
    DISTRIBUTION_STATS,
    TRACE_METRICS,
    engine_busy_frac,
    failure_counts,
    step_metrics,
    tool_latency_s,
    trace_metrics,
)
from hrl.runners.trace import FAILURE_REASONS, SCHEMA, validate_trace


def call(cid: str, prompt: list[int] | None, resp: list[int], t: tuple[float, float, float], **kw: Any) -> dict:
    """A call: `prompt` whole, or `ref=(call_id, length)` + `suffix`; `t` = (start, first token, end)."""
    c: dict[str, Any] = {"call_id": cid, "dialect": kw.pop("dialect", "chat"), "stream": True}
    c |= {"side": kw.pop("side", False), "started_at": t[0], "first_token_at": t[1], "ended_at": t[2]}
    if "ref" in kw:
        ref_id, length = kw.pop("ref")
        c |= {"prompt_ref": {"call_id": ref_id, "length": length}, "prompt_suffix_ids": kw.pop("suffix")}
    else:
        c["prompt_ids"] = prompt
    c |= {"response_ids": resp, "response_logprobs": [-0.5] * len(resp)}
    return c | {"versions": kw.pop("versions"), "finish_reason": kw.pop("finish", "stop")} | kw


def trace(tid: str, calls: list[dict], start: float, end: float, **kw: Any) -> dict[str, Any]:
    t = {"schema": SCHEMA, "trace_id": tid, "session": f"s-{tid}", "task_id": kw.pop("task", "task-1")}
    t |= {"group_id": "g1", "agent": {"name": "opencode"}, "env": kw.pop("env", {}), "model": {"name": "tiny"}}
    t |= {"status": "ok", "failure_reason": None, "reward": 1.0, "reward_info": {}, "started_at": start}
    return t | {"ended_at": end, "calls": calls, "tools": kw.pop("tools", [])} | kw


# A sequential agent: c1 → c2 → c3 (one branch), a side call (title) running during c2's tools, and a
# response that crosses a weight update (c2: token 0 from v5, tokens 1-2 from v6).
SEQUENTIAL = trace(
    "seq00001",
    [
        call("c1", [1, 2, 3, 4], [5, 6], (1.0, 1.5, 2.0), versions=[[0, 5]], finish="tool_calls"),
        call(
            "c2",
            None,
            [9, 10, 11],
            (3.0, 3.2, 4.5),
            ref=("c1", 6),
            suffix=[7, 8],
            parent="c1",
            versions=[[0, 5], [1, 6]],
        ),
        call("s1", [50, 51], [52], (3.5, 3.6, 4.0), side=True, versions=[[0, 6]]),
        call("c3", None, [13, 14], (6.0, 6.1, 7.0), ref=("c2", 11), suffix=[12], parent="c2", versions=[[0, 6]]),
    ],
    1000.0,
    1012.0,
    env={"sandbox": "docker", "version": "3"},
    tools=[
        {"name": "bash", "tool_call_id": "t1", "started_at": 2.0, "ended_at": 3.0},
        {"name": "read", "tool_call_id": "t2", "started_at": 4.5, "ended_at": 6.0},
    ],
)
# A sub-agent (b1, its own root) overlaps the main agent's first call; the episode timed out.
OVERLAPPING = trace(
    "ovl00002",
    [
        call("a1", [1, 2], [3], (0.0, 0.5, 2.0), versions=[[0, 7]], finish="tool_calls"),
        call("b1", [9, 9, 9], [4, 4], (1.0, 1.2, 3.0), versions=[[0, 7]]),
        call("a2", None, [6], (5.0, 5.5, 6.0), ref=("a1", 3), suffix=[5], parent="a1", versions=[[0, 8]]),
    ],
    2000.0,
    2020.0,
    env={"version": "abc"},
    status="failed",
    failure_reason="agent_timeout",
    reward=0.0,
)
EMPTY = trace("emp00003", [], 3000.0, 3001.0, status="failed", failure_reason="no_llm_calls", reward=None)

ISSUE_NAMES = [
    "trace/latency_s",
    "trace/llm_latency_s",
    "trace/tool_latency_s",
    "trace/turns",
    "trace/reward",
    "trace/policy_version_min",
    "trace/policy_version_max",
    "trace/env_version",
    "trace/staleness",
    "trace/prompt_tokens",
    "trace/response_tokens",
    "trace/branches",
    "trace/merge_ratio",
    "train/mismatch_kl",
    "train/loss",
    "train/grad_norm",
    "proxy/pause_s",
    "proxy/queue_depth",
    "engine/busy_frac",
]


def test_hand_made_traces_are_valid():
    for t in (SEQUENTIAL, OVERLAPPING, EMPTY):
        validate_trace(t)


def test_contract_names_are_all_there():
    """Names are a contract: this list may grow, never lose or rename an entry."""
    assert set(ISSUE_NAMES) <= set(CONTRACT)
    assert {f"trace/failures/{r}" for r in FAILURE_REASONS} <= set(CONTRACT)
    assert DISTRIBUTION_STATS == ("min", "p50", "p95", "max")
    assert CALL_METRICS == ("call/latency_s", "call/first_token_s", "call/prompt_tokens", "call/response_tokens")


def test_sequential_trace():
    m = trace_metrics(SEQUENTIAL, trainer_version=7)
    assert m == {
        "trace/latency_s": 12.0,  # 1012 − 1000
        "trace/llm_latency_s": pytest.approx(1.0 + 1.5 + 0.5 + 1.0),  # every call, the side call too
        "trace/tool_latency_s": pytest.approx(1.0 + 1.5),  # 2.0→3.0 and 4.5→6.0; the side call does not count
        "trace/turns": 3.0,  # c1, c2, c3 (s1 is a side call)
        "trace/reward": 1.0,
        "trace/success": 1.0,  # no `success` key (an older trace): reward == 1.0
        "trace/policy_version_min": 5.0,
        "trace/policy_version_max": 6.0,
        "trace/env_version": 3.0,  # "3" is numeric
        "trace/staleness": 2.0,  # trainer 7 − oldest token v5
        "trace/prompt_tokens": 4 + 8 + 2 + 12,
        "trace/response_tokens": 2 + 3 + 1 + 2,
        "trace/branches": 2.0,  # c1→c2→c3 and s1
        # calls on their own: 6 + 11 + 3 + 14 = 34 tokens; merged branches: c3's 14 + s1's 3 = 17
        "trace/merge_ratio": pytest.approx(34 / 17),
    }


def test_overlapping_calls_count_tool_time_once():
    m = trace_metrics(OVERLAPPING, trainer_version=8)
    # a1 [0, 2] and b1 [1, 3] overlap: no gap until 3; then 3 → 5 before a2
    assert m["trace/tool_latency_s"] == pytest.approx(2.0)
    assert m["trace/llm_latency_s"] == pytest.approx(2.0 + 2.0 + 1.0)
    assert (m["trace/turns"], m["trace/branches"]) == (3.0, 2.0)
    assert (m["trace/prompt_tokens"], m["trace/response_tokens"]) == (2 + 3 + 4, 1 + 2 + 1)
    assert m["trace/merge_ratio"] == pytest.approx((3 + 5 + 5) / (5 + 5), abs=1e-3)
    assert (m["trace/policy_version_min"], m["trace/policy_version_max"], m["trace/staleness"]) == (7.0, 8.0, 1.0)
    assert m["trace/failures/agent_timeout"] == 1.0
    assert m["trace/reward"] == 0.0
    assert "trace/env_version" not in m  # "abc" is not a number


def test_missing_values_are_left_out_not_zeroed():
    m = trace_metrics(EMPTY, trainer_version=3)
    assert m == {
        "trace/latency_s": 1.0,
        "trace/llm_latency_s": 0.0,
        "trace/tool_latency_s": 0.0,
        "trace/turns": 0.0,
        "trace/prompt_tokens": 0.0,
        "trace/response_tokens": 0.0,
        "trace/branches": 0.0,
        "trace/failures/no_llm_calls": 1.0,
    }
    assert "trace/staleness" not in trace_metrics(SEQUENTIAL)  # no trainer version given


def test_tool_latency_is_the_gap_between_a_response_and_the_next_request():
    calls = [
        call("c1", [1], [2], (0.0, 0.1, 1.0), versions=[[0, 0]]),
        call("c2", [1], [3], (4.0, 4.1, 5.0), versions=[[0, 0]]),
    ]
    assert tool_latency_s(trace("x", calls, 0.0, 9.0)) == 3.0
    # out of order in the file, a call nested inside another: the union is [0, 5], gaps only 1 → 4
    nested = [*calls[::-1], call("c3", [1], [4], (0.2, 0.3, 0.5), versions=[[0, 0]])]
    assert tool_latency_s(trace("y", nested, 0.0, 9.0)) == 3.0


def test_step_metrics_aggregate_with_suffixes():
    m = step_metrics([SEQUENTIAL, OVERLAPPING, EMPTY], trainer_version=8)
    assert (m["trace/count"], m["train/version"]) == (3.0, 8.0)
    # latencies 12, 20, 1
    assert m["trace/latency_s"] == pytest.approx(11.0)
    assert (m["trace/latency_s/min"], m["trace/latency_s/p50"], m["trace/latency_s/max"]) == (1.0, 12.0, 20.0)
    assert m["trace/latency_s/p95"] == pytest.approx(12 + 0.9 * 8)  # position 1.9 of [1, 12, 20]
    # rewards 1.0, 0.0 (the empty trace has none)
    assert (m["trace/reward"], m["trace/reward/min"], m["trace/reward/max"]) == (0.5, 0.0, 1.0)
    # staleness: trainer 8 − v5 = 3, 8 − v7 = 1
    assert (m["trace/staleness"], m["trace/staleness/p50"], m["trace/staleness/max"]) == (2.0, 2.0, 3.0)
    assert m["trace/staleness/p95"] == pytest.approx(2.9)
    assert (m["trace/policy_version_min/min"], m["trace/policy_version_max/max"]) == (5.0, 8.0)
    assert m["trace/env_version"] == 3.0  # only the first trace has a numeric one
    assert m["trace/tool_latency_s"] == pytest.approx((2.5 + 2.0 + 0.0) / 3)
    assert m["trace/turns/max"] == 3.0
    # failures: every known reason present, zeros included
    assert m["trace/failures/agent_timeout"] == 1.0
    assert m["trace/failures/no_llm_calls"] == 1.0
    assert m["trace/failures/none"] == 1.0
    assert m["trace/failures/agent_crash"] == 0.0
    # per call: 7 calls, 4 + 5 seconds in all
    assert m["call/latency_s"] == pytest.approx(9 / 7)
    assert m["call/response_tokens/max"] == 3.0
    assert m["call/first_token_s/max"] == pytest.approx(0.5)
    for name in TRACE_METRICS:
        assert {name, *(f"{name}/{s}" for s in DISTRIBUTION_STATS)} <= m.keys(), name
    assert all(isinstance(v, float) for v in m.values())


def test_failure_counts_keep_unknown_future_reasons():
    counts = failure_counts([{"failure_reason": "oom_killed"}, {"failure_reason": None}])
    assert counts["trace/failures/oom_killed"] == 1.0
    assert counts["trace/failures/none"] == 1.0
    assert len(counts) == len(FAILURE_REASONS) + 2


def test_engine_busy_frac():
    # window 100 → 110; trace A's calls cover 100-102 and 104-105, trace B's 101-103 → busy 100-103, 104-105
    a = trace(
        "a",
        [
            call("c1", [1], [2], (0.0, 0.0, 2.0), versions=[[0, 0]]),
            call("c2", [1], [2], (4.0, 4.0, 5.0), versions=[[0, 0]]),
        ],
        100.0,
        106.0,
    )
    b = trace("b", [call("c1", [1], [2], (0.0, 0.0, 2.0), versions=[[0, 0]])], 101.0, 110.0)
    assert engine_busy_frac([a, b]) == pytest.approx(4 / 10)
    assert step_metrics([a, b])["engine/busy_frac"] == pytest.approx(0.4)
    assert engine_busy_frac([]) is None
    assert "train/version" not in step_metrics([a, b])


def test_step_of_no_traces():
    m = step_metrics([], trainer_version=1)
    assert m["trace/count"] == 0.0
    assert "trace/reward" not in m


# ---- the sink ------------------------------------------------------------------------------------------------


def test_sink_writes_jsonl_and_tensorboard(tmp_path: Path):
    from hrl.train.sinks import MetricsSink

    events: list[tuple[str, dict]] = []
    with MetricsSink(tmp_path, on_event=lambda kind, data: events.append((kind, data))) as sink:
        assert sink.backends == ["jsonl", "tensorboard"]
        sink.log({"step": 0, "trace/reward": 0.25, "trace/failures/none": 4.0, "note": "text"})
        sink.log({"trace/reward": float("nan"), "train/loss": 1.5}, step=1)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 0, "trace/reward": 0.25, "trace/failures/none": 4.0, "note": "text"},
        {"step": 1, "trace/reward": None, "train/loss": 1.5},  # NaN → null: every line is strict JSON
    ]
    assert events == []

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"trace/reward", "trace/failures/none", "train/loss"} <= set(acc.Tags()["scalars"])
    assert [(e.step, e.value) for e in acc.Scalars("trace/reward")] == [(0, 0.25)]  # NaN not sent
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.5)]


def test_sink_degrades_to_jsonl_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hrl.train.sinks import MetricsSink

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "wandb", None)
    events: list[tuple[str, dict]] = []
    sink = MetricsSink(tmp_path, wandb=True, on_event=lambda kind, data: events.append((kind, data)))
    sink.log({"step": 3, "trace/reward": 1.0})
    sink.log({"step": 4, "trace/reward": 0.0})
    sink.close()
    assert sink.backends == ["jsonl"]
    assert [k for k, _ in events] == ["warning", "warning"]  # once per backend, not per step
    assert "TensorBoard" in events[0][1]["message"]
    assert "wandb" in events[1][1]["message"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "tensorboard").exists()


def test_a_step_is_split_per_harness():
    """harness/<name>/… from each trace's agent.name: mean reward over the scored traces, mean turns, counts."""
    one = [call("c1", [1, 2], [3], (1.0, 1.1, 1.2), versions=[[0, 1]])]
    traces = [
        trace("a1", one, 0.0, 2.0, reward=1.0),
        trace("a2", [*one, call("c2", [1, 2, 3], [4], (1.3, 1.4, 1.5), versions=[[0, 1]])], 0.0, 2.0, reward=0.0),
        trace("b1", one, 0.0, 2.0, agent={"name": "codex"}, reward=None, failure_reason="sandbox_error"),
        trace("b2", one, 0.0, 2.0, agent={"name": "codex"}, reward=0.5),
    ]
    m = step_metrics(traces)
    assert m["harness/opencode/reward"] == 0.5 and m["harness/opencode/turns"] == 1.5
    assert m["harness/opencode/count"] == 2.0 and m["harness/opencode/failed"] == 0.0
    assert m["harness/codex/reward"] == 0.5 and m["harness/codex/count"] == 2.0 and m["harness/codex/failed"] == 1.0
    no_reward = step_metrics([trace("c1", one, 0.0, 1.0, agent={"name": "aider"}, reward=None)])
    assert "harness/aider/reward" not in no_reward and no_reward["harness/aider/count"] == 1.0
