"""What `hrl top` shows, read from a run directory alone (a training or an evaluation run) or from an `hrl rollout`'s
trace file and the live status beside it: episodes in flight, policy version and staleness, latencies, tokens/s,
reward and failures per step, the latest traces. A run whose process is gone is said not running, never live."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from hrl.runners.errors import UsageError

__all__ = ["STEPS_SHOWN", "snapshot"]

STEPS_SHOWN = 5  # the last steps in the per-step table


def _run_state(live: dict[str, Any] | None) -> str:
    """One line on whether the run is live: never stale data shown as live."""
    if live is None:
        return "no live status (the run has not started, or predates `hrl top`)"
    age = f"{live['age_s']:.0f}s ago"
    if live["state"] == "running":
        return f"running (pid {live.get('pid')} on {live.get('host')}, updated {age})"
    if live["state"] == "stale":
        return f"not running (last update {age}; the process ended without closing the run)"
    return f"{live['state']} (ended {age})"


def _step_row(row: dict[str, Any]) -> dict[str, Any]:
    """What the view shows of one metrics.jsonl step. tokens/s: the step's sampled tokens (mean per trace × traces)
    over its rollout time (sync) or its whole step (async)."""
    traces = row.get("trace/count") or 0
    seconds = row.get("time/rollout_s") or row.get("time/step_s") or 0
    tokens = (row.get("trace/response_tokens") or 0) * traces
    return {
        "step": row.get("step"),
        "version": row.get("version"),
        "traces": traces,
        "reward": row.get("trace/reward"),
        "success": row.get("trace/success"),
        "call_p50_s": row.get("call/latency_s/p50"),
        "call_p95_s": row.get("call/latency_s/p95"),
        "tool_s": row.get("trace/tool_latency_s"),
        "staleness_max": row.get("trace/staleness/max"),
        "tokens_per_s": tokens / seconds if seconds else None,
        "step_s": row.get("time/step_s") or sum(row.get(f"time/{k}_s") or 0 for k in ("rollout", "train", "publish")),
    }


def _recent_traces(files: list[Path], limit: int) -> list[dict[str, Any]]:
    """The traces of `files` (a run's latest two steps', or a rollout's one), oldest first, read as they are being
    appended (a last line cut short by the writer is skipped)."""
    from hrl.runners.trace import read_traces

    traces = [t for f in files if f.is_file() for t in read_traces(f, on_cut=lambda _line: None)]
    return traces[-limit:] if limit else traces


def _in_flight(live: dict[str, Any] | None, version: int | None, now: float) -> list[dict[str, Any]]:
    """The episodes a live writer says are running, each with its staleness and age; none from a stale file."""
    out = []
    for e in (live or {}).get("episodes", []) if live and live["live"] else []:
        staleness = None if e.get("version") is None or version is None else version - e["version"]
        out.append({**e, "staleness": staleness, "age_s": round(now - float(e["started_at"]), 1)})
    return out


def _common(where: Path, live: dict[str, Any] | None, version: int | None, recent: list[dict[str, Any]],
            latest: int) -> dict[str, Any]:  # fmt: skip
    """What every snapshot holds, a run's or a trace file's."""
    in_flight = _in_flight(live, version, time.time())
    return {
        "run": str(where),
        "status": (live or {}).get("state", "unknown"),
        "live": bool(live and live["live"]),
        "status_line": _run_state(live),
        "updated_s_ago": live["age_s"] if live else None,
        "version": version,
        "in_flight": in_flight,
        "by_state": dict(Counter(e["state"] for e in in_flight)),
        "failures": dict(Counter(t.get("failure_reason") or "none" for t in recent)),
        "recent_traces": len(recent),
        "latest": [_trace_row(t) for t in recent[-latest:]][::-1],
    }


def _trace_file_snapshot(path: Path, latest: int) -> dict[str, Any]:
    """An `hrl rollout --out FILE`: its traces and `FILE.live.json`; no steps (nothing is trained)."""
    from hrl.runners.live import read_live, traces_live_file

    live = read_live(traces_live_file(path))
    recent = _recent_traces([path], 0)
    version = live["version"] if live and live["live"] and live.get("version") is not None else None
    return {**_common(path, live, version, recent[-200:], latest), "kind": "rollout", "step": None,
            "iterations": None, "steps": [], "traces": len(recent)}  # fmt: skip


def _trace_row(t: dict[str, Any]) -> dict[str, Any]:
    versions = [v for c in t.get("calls") or [] for _, v in c.get("versions", [])]
    return {
        "episode": (t.get("metadata") or {}).get("episode"),
        "task": t.get("task_id"),
        "reward": t.get("reward"),
        "failure": t.get("failure_reason"),
        "calls": len(t.get("calls") or []),
        "versions": sorted(set(versions)),
        "seconds": round(float(t.get("ended_at") or 0) - float(t.get("started_at") or 0), 1),
    }


def snapshot(path: Path, latest: int = 8) -> dict[str, Any]:
    """Everything the view shows, from the run directory (or a rollout's trace file) alone. Episodes in flight only
    while the run is live."""
    from hrl.runners.live import read_live, traces_live_file
    from hrl.runners.rundir import RunDir, is_run_dir

    if path.is_file() or (not path.exists() and traces_live_file(path).exists()):
        return _trace_file_snapshot(path, latest)
    if path.exists() and not is_run_dir(path):
        raise UsageError(f"{path} is not a run directory (no traces/, metrics.jsonl or state.json) nor a trace file",
                         hint="pass the --run-dir of an `hrl train` or `hrl eval` run, or an `hrl rollout`'s --out")  # fmt: skip
    run = RunDir.existing(path)
    live = read_live(run.path)
    state, steps = run.state(), run.metric_rows()
    version = live["version"] if live and live["live"] and live.get("version") is not None else state["version"]
    recent = _recent_traces([f for _, f in sorted(run.trace_files().items())[-2:]], 200)
    return {
        **_common(run.path, live, version, recent, latest),
        "kind": "run",
        "step": state["iteration"],
        "iterations": (run.config().get("train") or {}).get("iterations"),
        "steps": [_step_row(r) for _, r in sorted(steps.items())[-STEPS_SHOWN:]],
    }
