"""The per-harness table of an `hrl eval` run, from its traces and eval.json: numbers against hand counts, the
baseline's before / after / delta, and the same table in the HTML report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hrl.runners.report.builder import render_report
from hrl.runners.report.evaluation import before_after, eval_rows, eval_table_text, harness_numbers, write_plan
from hrl.runners.report.run import load_run
from hrl.runners.rundir import RunDir


def _trace(i: int, reward: float | None, turns: int, failure: str | None = None) -> dict[str, Any]:
    calls = [
        {"call_id": f"c{k}", "dialect": "chat", "stream": False, "side": False, "started_at": 0.0, "ended_at": 0.1,
         "prompt_ids": [1] * 10, "response_ids": [2] * 5, "response_logprobs": [-0.1] * 5, "versions": [[0, 0]],
         "finish_reason": "stop"}
        for k in range(turns)
    ]  # fmt: skip
    return {
        "schema": "hrl.trace/1", "trace_id": f"t{i}-{reward}-{turns}", "session": "s", "task_id": f"task{i}",
        "status": "failed" if failure else "ok", "failure_reason": failure, "reward": reward,
        "started_at": 0.0, "ended_at": 1.0, "calls": calls,
    }  # fmt: skip


def test_numbers_of_one_harness():
    traces = [
        _trace(0, 1.0, 3),
        _trace(1, 0.0, 2, "agent_exit"),
        _trace(2, None, 0, "sandbox_error"),
        _trace(3, 1.0, 1),
    ]
    m = harness_numbers(traces)
    # the sandbox_error is the infrastructure's: out of the rate; the agent_exit is the policy's: in it, no success
    assert (m["episodes"], m["infra"], m["graded"], m["success"], m["success_rate"]) == (4, 1, 3, 2, 2 / 3)
    lo, hi = m["success_ci"]  # Wilson 2/3: centre (2/3 + z²/6) / (1 + z²/3), as stats.wilson; a real interval
    assert 0 < lo < 2 / 3 < hi < 1
    assert m["mean_reward"] == 2 / 3  # over the graded episodes that have a reward
    assert m["mean_turns"] == 6 / 4 and m["tokens"] == 6 * 15 / 4
    assert m["failures"] == {"agent_exit": 1, "sandbox_error": 1}
    assert harness_numbers([])["success_rate"] is None and harness_numbers([])["success_ci"] is None


def test_success_is_the_traces_key_beside_the_reward():
    shaped = [{**_trace(0, 1.0, 1), "success": False}, {**_trace(1, 0.4, 1), "success": True}, _trace(2, 1.0, 1)]
    m = harness_numbers(shaped)
    assert (m["success"], m["mean_reward"]) == (2, 2.4 / 3)  # the third has no key: reward 1.0 is its success


def test_pass_at_k_over_tasks():
    # task0: 1 of 2 solved (pass@1 1/2, pass@2 1); task1: 0 of 2 (0, 0); task2: one graded of two (pass@2: left out)
    traces = [_trace(0, 1.0, 1), _trace(0, 0.0, 1), _trace(1, 0.0, 1), _trace(1, 0.0, 1), _trace(2, 1.0, 1),
              _trace(2, None, 0, "verifier_error")]  # fmt: skip
    m = harness_numbers(traces, k=2)
    assert m["pass_at_k"] == {"1": (0.5 + 0 + 1) / 3, "2": (1 + 0) / 2}


def _eval_run(tmp_path: Path, baseline: bool) -> Path:
    run = RunDir(tmp_path / "run")
    run.create({"model": "after"})
    agents = ["mini-swe-agent", "codex"]
    roles = (["baseline"] if baseline else []) + ["model"]
    cells = [{"iteration": i, "agent": a, "model": r, "role": r} for i, (r, a) in
             enumerate((r, a) for r in roles for a in agents)]  # fmt: skip
    write_plan(run.path, {"model": "after", "baseline": "before" if baseline else None, "agents": agents,
                          "tasks": "t", "n": 1, "task_count": 2, "cells": cells})  # fmt: skip
    outcomes = {  # (role, agent) -> rewards of 2 episodes
        ("baseline", "mini-swe-agent"): [0.0, 0.0], ("baseline", "codex"): [0.0, 1.0],
        ("model", "mini-swe-agent"): [1.0, 1.0], ("model", "codex"): [0.0, 1.0],
    }  # fmt: skip
    for c in cells:
        with run.trace_file(c["iteration"]).open("w") as f:
            for i, r in enumerate(outcomes[(c["role"], c["agent"])]):
                f.write(json.dumps(_trace(i, r, 2 if r else 4, None if r else "agent_exit")) + "\n")
    return run.path


def test_one_row_per_harness(tmp_path: Path):
    run = load_run(_eval_run(tmp_path, baseline=False))
    rows = eval_rows(run)
    assert [r["agent"] for r in rows] == ["mini-swe-agent", "codex"]
    assert rows[0]["model"]["success_rate"] == 1.0 and rows[1]["model"]["success_rate"] == 0.5
    assert rows[0]["baseline"] is None and rows[0]["delta"] is None
    text = eval_table_text(rows).splitlines()
    assert text[0].split() == ["harness", "episodes", "success", "reward", "turns", "tokens/ep", "infra", "failures"]
    assert text[2].split()[:5] == ["codex", "2", "50%", "(1/2)", "[9–91%]"] and text[2].endswith("agent_exit 1")
    assert text[3].startswith("success: successes / episodes the infrastructure did not fail")
    # per task: mini-swe-agent solved both, codex task1 only: they agree on 1 task of 2
    assert rows[0]["agreement"] == [{"agents": ["mini-swe-agent", "codex"], "agree": 1, "tasks": 2, "rate": 0.5,
                                     "ci": rows[0]["agreement"][0]["ci"]}] and rows[1]["agreement"] == []  # fmt: skip
    assert text[4].startswith("agreement mini-swe-agent ~ codex: 50% of 2 tasks [")


def test_baseline_before_after_and_delta(tmp_path: Path):
    run = load_run(_eval_run(tmp_path, baseline=True))
    rows = eval_rows(run)
    mini = rows[0]
    assert mini["baseline"]["success_rate"] == 0.0 and mini["model"]["success_rate"] == 1.0
    assert mini["delta"]["success_rate"] == 1.0 and mini["delta"]["mean_turns"] == -2.0
    assert rows[1]["delta"]["success_rate"] == 0.0
    line = eval_table_text(rows).splitlines()[1]
    assert line.split()[:8] == ["mini-swe-agent", "2", "0%", "(0/2)", "[0–66%]", "100%", "(2/2)", "[34–100%]"]
    html = render_report(run)
    assert '<table id="eval">' in html and "success before" in html and "+100 pp" in html


def test_a_run_that_is_no_evaluation_has_no_table(tmp_path: Path):
    run = RunDir(tmp_path / "train")
    run.create({})
    run.trace_file(0).write_text(json.dumps(_trace(0, 1.0, 1)) + "\n")
    loaded = load_run(run.path)
    assert eval_rows(loaded) is None and '<table id="eval">' not in render_report(loaded)


def test_the_before_after_table_has_a_row_per_eval_marker():
    base = {"eval/reward": 0.1, "eval/turns": 3.0, "eval/episodes": 48.0}
    rows = {
        0: base | {"eval/success": 0.1, "eval/has/in_place": 0.25, "eval/success_given/in_place": 0.4},
        5: {"step": 5, "eval/success": None},  # a slice-less row with nothing in it is skipped
        10: base | {"eval/success": 0.3, "eval/has/in_place": 0.75, "eval/success_given/in_place": None},
    }
    lines = before_after(rows).splitlines()
    assert lines[0].split() == ["held-out", "tasks", "step", "0", "step", "10", "change"]
    assert [ln.split()[:4] for ln in lines[1:3]] == [["success", "0.100", "0.300", "+0.200"],
                                                     ["mean", "reward", "0.100", "0.100"]]  # fmt: skip
    assert "in_place            0.250       0.750       +0.500" in before_after(rows)
    assert not any("success | in_place" in ln for ln in lines)  # no success among none at the end: no row
    assert not any(ln.split()[:2] == ["policy", "version"] for ln in lines)  # rows without eval/version: no line
    versioned = {k: r | {"eval/version": float(k)} for k, r in rows.items() if k != 5}
    assert before_after(versioned).splitlines()[-1].split() == ["policy", "version", "0", "10"]  # the pinned one
