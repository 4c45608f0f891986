"""The cross-harness evaluation table: one row per harness (success rate, mean reward, mean turns, tokens,
failures by reason), and with a baseline model its numbers before and after and the deltas.

`hrl eval` writes a run directory (`hrl.runners.rundir`) with one trace file per (model, harness) cell and an
`eval.json` plan naming each cell; `hrl eval` and `hrl report` both build the table here, from the traces.

    eval.json  {"schema": "hrl.eval/1", "model": M, "baseline": M0 | null, "agents": [A, …], "tasks": F, "n": K,
                "cells": [{"iteration": i, "agent": A, "model": M, "role": "model" | "baseline"}, …]}
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from html import escape
from pathlib import Path
from typing import Any

from hrl.runners.durable import write_atomically
from hrl.runners.report.run import Run
from hrl.runners.report.stats import agreement, pass_at_k, succeeded, wilson
from hrl.runners.rundir import RunDir
from hrl.runners.summary import summarize_trace
from hrl.runners.trace import is_infra_failure

__all__ = ["EVAL_FILE", "SCHEMA", "before_after", "eval_plan", "eval_rows", "eval_table_html", "eval_table_text",
           "harness_numbers", "open_eval_run", "read_plan", "solved_tasks", "write_plan"]  # fmt: skip

EVAL_FILE = "eval.json"
SCHEMA = "hrl.eval/1"
Trace = dict[str, Any]


def eval_plan(names: list[str], model: str, baseline: str, paths: list[str], task_file: str, n: int) -> dict[str, Any]:
    """The plan of `hrl eval`: the cells, baseline first: (iteration, agent, model, role); models as named and as
    resolved (`paths`: the baseline's first, the model's last)."""
    roles = [("baseline", baseline, paths[0])] if baseline else []
    roles.append(("model", model, paths[-1]))
    cells = [
        {"iteration": i, "agent": agent, "model": named, "model_path": path, "role": role}
        for i, (role, named, path, agent) in enumerate((r, m, p, a) for r, m, p in roles for a in names)
    ]
    return {"model": model, "baseline": baseline or None, "agents": names, "tasks": task_file, "n": n, "cells": cells}


def open_eval_run(config: dict[str, Any], plan: dict[str, Any], run_dir: Path) -> RunDir:
    """The evaluation's run directory, created with the run's `config` (its model the plan's, the plan but its
    cells under `eval`) and the plan."""
    run = RunDir(run_dir)
    run.create({**config, "model": plan["model"], "eval": {k: v for k, v in plan.items() if k != "cells"}})
    write_plan(run.path, plan)
    return run


def write_plan(run_dir: str | Path, plan: dict[str, Any]) -> None:
    write_atomically(Path(run_dir) / EVAL_FILE, json.dumps({"schema": SCHEMA, **plan}, indent=2))


def read_plan(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's eval plan, or None for a run that is no evaluation."""
    path = Path(run_dir) / EVAL_FILE
    if not path.is_file():
        return None
    plan: dict[str, Any] = json.loads(path.read_text())
    return plan if plan.get("schema") == SCHEMA else None


def harness_numbers(traces: list[Trace], k: int = 1) -> dict[str, Any]:
    """One cell's numbers. Success: the trace's `success` (else reward ≥ 1: `stats.succeeded`) over the episodes the
    infrastructure did not fail (`trace.INFRA_FAILURES`: counted in `infra`, left out of every rate, as they say
    nothing of the policy), with its Wilson 95 % interval; a policy failure (timeout, crash) is no success. pass@k
    for k = 1 and `k` (episodes per task) averages the unbiased estimate over the tasks with ≥ k graded episodes.
    Turns and tokens are means per episode (tokens: prompt + response of every call)."""
    n = len(traces)
    graded = [t for t in traces if not is_infra_failure(t)]
    wins = sum(succeeded(t) for t in graded)
    summaries = [summarize_trace(t) for t in traces]
    rewards = [float(t["reward"]) for t in graded if t.get("reward") is not None]
    return {
        "episodes": n,
        "graded": len(graded),
        "infra": n - len(graded),
        "success": wins,
        "success_rate": wins / len(graded) if graded else None,
        "success_ci": wilson(wins, len(graded)),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "pass_at_k": _pass_at(graded, k),
        "mean_turns": sum(s["turns"] for s in summaries) / n if n else None,
        "tokens": sum(s["prompt_tokens"] + s["response_tokens"] for s in summaries) / n if n else None,
        "failures": dict(sorted(Counter(str(t["failure_reason"]) for t in traces if t.get("failure_reason")).items())),
    }


def _by_task(graded: list[Trace]) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = defaultdict(list)
    for t in graded:
        out[str(t.get("task_id"))].append(succeeded(t))
    return out


def _pass_at(graded: list[Trace], k: int) -> dict[str, float | None]:
    """{"1": pass@1, "k": pass@k} (one key when k = 1), each None when no task has k graded episodes."""
    tasks = _by_task(graded).values()
    out: dict[str, float | None] = {}
    for j in sorted({1, k}):
        est = [pass_at_k(len(w), sum(w), j) for w in tasks if len(w) >= j]
        out[str(j)] = sum(est) / len(est) if est else None
    return out


def solved_tasks(traces: list[Trace]) -> dict[str, bool]:
    """{task: solved?} of one cell: more than half its graded episodes succeeded (with one episode: that one)."""
    return {task: 2 * sum(w) > len(w) for task, w in _by_task([t for t in traces if not is_infra_failure(t)]).items()}


def _agreement(cells: dict[str, list[Trace]]) -> list[dict[str, Any]]:
    """Per pair of harnesses: the share of the tasks both graded on which they agree (solved or not), with its
    Wilson 95 % interval."""
    pairs = agreement({agent: solved_tasks(traces) for agent, traces in cells.items()})
    return [
        {"agents": [a, b], "agree": same, "tasks": n, "rate": same / n if n else None, "ci": wilson(same, n)}
        for (a, b), (same, n) in pairs.items()
    ]


def eval_rows(run: Run) -> list[dict[str, Any]] | None:
    """One row per harness, in the plan's order: {"agent", "model": numbers, "baseline": numbers | None,
    "delta": {key: after − before} | None}; None when the run is no evaluation. Cells still running count the
    episodes that have ended."""
    plan = read_plan(run.path) if run.path.is_dir() else None
    if plan is None:
        return None
    traces = {it.index: it.traces for it in run.iterations}
    k = int(plan.get("n", 1))
    mine = {c["agent"]: traces.get(c["iteration"], []) for c in plan["cells"] if c["role"] == "model"}
    pairs = _agreement(mine) if len(mine) > 1 else []
    rows = []
    for agent in plan["agents"]:
        cells = {
            c["role"]: harness_numbers(traces.get(c["iteration"], []), k) for c in plan["cells"] if c["agent"] == agent
        }
        after, before = cells.get("model"), cells.get("baseline")
        delta = None
        if after is not None and before is not None:
            keys = ("success_rate", "mean_reward", "mean_turns", "tokens")
            delta = {k: None if after[k] is None or before[k] is None else after[k] - before[k] for k in keys}
        agree = [p for p in pairs if agent == p["agents"][0]]  # each pair once, under its first harness
        rows.append({"agent": agent, "model": after, "baseline": before, "delta": delta, "agreement": agree})
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


def _rate(m: dict[str, Any]) -> str:
    """`40% (2/5) [12–77%]`: the rate, its counts and its Wilson 95 % interval."""
    ci = m.get("success_ci")
    band = f" [{100 * ci[0]:.0f}–{100 * ci[1]:.0f}%]" if ci else ""
    return f"{_pct(m['success_rate'])} ({m['success']}/{m['graded']}){band}"


def _failures(numbers: dict[str, Any] | None) -> str:
    if not numbers or not numbers["failures"]:
        return "none"
    return ", ".join(f"{k} {v}" for k, v in numbers["failures"].items())


def _cells(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The header and the cells, the same for the terminal and the HTML report."""
    with_baseline = any(r["baseline"] is not None for r in rows)
    if not with_baseline:
        ks = sorted({int(j) for r in rows if r["model"] for j in r["model"]["pass_at_k"]} - {1})
        head = ["harness", "episodes", "success", "reward", *[f"pass@{j}" for j in ks], "turns", "tokens/ep",
                "infra", "failures"]  # fmt: skip
        body = [
            [r["agent"], str(m["episodes"]), _rate(m), _num(m["mean_reward"]),
             *[_pct(m["pass_at_k"].get(str(j))) for j in ks], _num(m["mean_turns"], 1), _tokens(m["tokens"]),
             str(m["infra"]), _failures(m)]
            for r in rows if (m := r["model"]) is not None
        ]  # fmt: skip
        return head, body
    head = ["harness", "episodes", "success before", "after", "Δ", "reward before", "after", "Δ",
            "turns before", "after", "tokens/ep before", "after", "failures before", "after"]  # fmt: skip
    body = []
    for r in rows:
        b, a, d = r["baseline"], r["model"], r["delta"] or {}
        body.append([
            r["agent"], str(a["episodes"]), _rate(b), _rate(a),
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
    lines.append(NOTE)
    lines += [
        f"agreement {a} ~ {b}: {_pct(p['rate'])} of {p['tasks']} tasks"
        + (f" [{100 * p['ci'][0]:.0f}–{100 * p['ci'][1]:.0f}%]" if p["ci"] else "")
        for r in rows for p in r.get("agreement") or [] for a, b in [p["agents"]]
    ]  # fmt: skip
    return "\n".join(lines)


NOTE = (
    "success: successes / episodes the infrastructure did not fail (infra: left out of every rate), "
    "[Wilson 95% interval]"
)


def eval_table_html(rows: list[dict[str, Any]]) -> str:
    head, body = _cells(rows)
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in line) + "</tr>" for line in body)
    table = f'<table id="eval"><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>'
    notes = "".join(f"<p>{escape(line)}</p>" for line in eval_table_text(rows).splitlines()[len(body) + 1 :])
    return f'<h2>Harnesses (one step per model × harness)</h2><div class="wrap">{table}</div>{notes}'


def before_after(rows: dict[int, dict[str, Any]]) -> str:
    """The held-out table of a training run (`hrl train`'s closing lines): its first and last evaluation (`eval/…`
    rows, `hrl.train.heldout`), side by side with the change."""
    whole = {k: r for k, r in sorted(rows.items()) if r.get("eval/success") is not None}
    if len(whole) < 2:
        return ""
    (s0, start), (s1, end) = next(iter(whole.items())), list(whole.items())[-1]
    lines = [f"held-out tasks        step {s0:<6} step {s1:<6} change"]
    rows = [("eval/success", "success"), ("eval/reward", "mean reward"), ("eval/turns", "turns")]
    for key in sorted(k for k in end if k.startswith(("eval/has/", "eval/success_given/"))):  # train.eval_markers
        kind, name = key.split("/")[1:]
        rows.append((key, f"{name}" if kind == "has" else f"success | {name}"))
    for key, label in rows:
        if start.get(key) is None or end.get(key) is None:
            continue
        a, b = float(start[key]), float(end[key])
        ratio = f"  ({b / a:.1f}×)" if key == "eval/success" and a > 0 else ""
        lines.append(f"  {label:<19} {a:<11.3f} {b:<11.3f} {b - a:+.3f}{ratio}")
    lines.append(f"  {'episodes':<19} {start['eval/episodes']:<11.0f} {end['eval/episodes']:<11.0f}")
    if start.get("eval/version") is not None and end.get("eval/version") is not None:  # every token sampled by it
        lines.append(f"  {'policy version':<19} {start['eval/version']:<11.0f} {end['eval/version']:<11.0f}")
    return "\n".join(lines)
