"""The cross-harness evaluation table: one row per harness (success rate, mean reward, mean turns, tokens,
failures by reason), and with a baseline model its numbers before and after and the deltas.

`hrl eval` writes a run directory (`hrl.runners.rundir`) with one trace file per (model, harness) cell and an
`eval.json` plan naming each cell; `hrl eval` and `hrl report` both build the table here, from the traces.

    eval.json  {"schema": "hrl.eval/1", "model": M, "baseline": M0 | null, "agents": [A, …], "tasks": F, "n": K,
                "cells": [{"iteration": i, "agent": A, "model": M, "role": "model" | "baseline"}, …]}
"""

from __future__ import annotations

import json
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any

from hrl.runners.durable import write_atomically
from hrl.runners.report.run import Run
from hrl.runners.summary import summarize_trace

__all__ = ["EVAL_FILE", "SCHEMA", "eval_rows", "eval_table_html", "eval_table_text", "harness_numbers", "read_plan",
           "write_plan"]  # fmt: skip

EVAL_FILE = "eval.json"
SCHEMA = "hrl.eval/1"
Trace = dict[str, Any]


def write_plan(run_dir: str | Path, plan: dict[str, Any]) -> None:
    write_atomically(Path(run_dir) / EVAL_FILE, json.dumps({"schema": SCHEMA, **plan}, indent=2))


def read_plan(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's eval plan, or None for a run that is no evaluation."""
    path = Path(run_dir) / EVAL_FILE
    if not path.is_file():
        return None
    plan: dict[str, Any] = json.loads(path.read_text())
    return plan if plan.get("schema") == SCHEMA else None


def harness_numbers(traces: list[Trace]) -> dict[str, Any]:
    """One cell's numbers. Success: reward ≥ 1 (the task solved in full), over every episode, failed ones included;
    turns and tokens are means per episode (tokens: prompt + response of every call)."""
    n = len(traces)
    summaries = [summarize_trace(t) for t in traces]
    rewards = [float(t["reward"]) for t in traces if t.get("reward") is not None]
    return {
        "episodes": n,
        "success": sum(r >= 1.0 for r in rewards),
        "success_rate": sum(r >= 1.0 for r in rewards) / n if n else None,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "mean_turns": sum(s["turns"] for s in summaries) / n if n else None,
        "tokens": sum(s["prompt_tokens"] + s["response_tokens"] for s in summaries) / n if n else None,
        "failures": dict(sorted(Counter(str(t["failure_reason"]) for t in traces if t.get("failure_reason")).items())),
    }


def eval_rows(run: Run) -> list[dict[str, Any]] | None:
    """One row per harness, in the plan's order: {"agent", "model": numbers, "baseline": numbers | None,
    "delta": {key: after − before} | None}; None when the run is no evaluation. Cells still running count the
    episodes that have ended."""
    plan = read_plan(run.path) if run.path.is_dir() else None
    if plan is None:
        return None
    traces = {it.index: it.traces for it in run.iterations}
    rows = []
    for agent in plan["agents"]:
        cells = {
            c["role"]: harness_numbers(traces.get(c["iteration"], [])) for c in plan["cells"] if c["agent"] == agent
        }
        after, before = cells.get("model"), cells.get("baseline")
        delta = None
        if after is not None and before is not None:
            keys = ("success_rate", "mean_reward", "mean_turns", "tokens")
            delta = {k: None if after[k] is None or before[k] is None else after[k] - before[k] for k in keys}
        rows.append({"agent": agent, "model": after, "baseline": before, "delta": delta})
    return rows


# ---- rendering --------------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _tokens(x: float | None) -> str:
    return "–" if x is None else f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def _signed(x: float | None, fmt: str) -> str:
    if x is None:
        return "–"
    if fmt == "pp":
        return f"{100 * x:+.0f} pp"
    return f"{x / 1000:+.1f}k" if fmt == "k" and abs(x) >= 1000 else f"{x:+.0f}" if fmt == "k" else f"{x:+.2f}"


def _failures(numbers: dict[str, Any] | None) -> str:
    if not numbers or not numbers["failures"]:
        return "none"
    return ", ".join(f"{k} {v}" for k, v in numbers["failures"].items())


def _cells(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The header and the cells, the same for the terminal and the HTML report."""
    with_baseline = any(r["baseline"] is not None for r in rows)
    if not with_baseline:
        head = ["harness", "episodes", "success", "reward", "turns", "tokens/ep", "failures"]
        body = [
            [r["agent"], str(m["episodes"]), f"{_pct(m['success_rate'])} ({m['success']}/{m['episodes']})",
             _num(m["mean_reward"]), _num(m["mean_turns"], 1), _tokens(m["tokens"]), _failures(m)]
            for r in rows if (m := r["model"]) is not None
        ]  # fmt: skip
        return head, body
    head = ["harness", "episodes", "success before", "after", "Δ", "reward before", "after", "Δ",
            "turns before", "after", "tokens/ep before", "after", "failures before", "after"]  # fmt: skip
    body = []
    for r in rows:
        b, a, d = r["baseline"], r["model"], r["delta"] or {}
        body.append([
            r["agent"], str(a["episodes"]), _pct(b["success_rate"]), _pct(a["success_rate"]),
            _signed(d.get("success_rate"), "pp"), _num(b["mean_reward"]), _num(a["mean_reward"]),
            _signed(d.get("mean_reward"), ""), _num(b["mean_turns"], 1), _num(a["mean_turns"], 1),
            _tokens(b["tokens"]), _tokens(a["tokens"]), _failures(b), _failures(a),
        ])  # fmt: skip
    return head, body


def eval_table_text(rows: list[dict[str, Any]], plan: dict[str, Any] | None = None) -> str:
    """The table as aligned plain text (what `hrl eval` prints and `hrl report` repeats)."""
    head, body = _cells(rows)
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() for line in [head, *body]]
    if plan:
        models = f"{plan['baseline']} → {plan['model']}" if plan.get("baseline") else str(plan["model"])
        n, tasks = plan.get("n", 1), plan.get("task_count", "?")
        lines.insert(0, f"model {models}; {tasks} tasks × {n} episode{'s' * (n != 1)} per task and harness")
    return "\n".join(lines)


def eval_table_html(rows: list[dict[str, Any]]) -> str:
    head, body = _cells(rows)
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in line) + "</tr>" for line in body)
    table = f'<table id="eval"><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>'
    return f'<h2>Harnesses (one step per model × harness)</h2><div class="wrap">{table}</div>'
