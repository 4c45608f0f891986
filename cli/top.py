"""`hrl top`: a live view of a running `hrl train` or `hrl eval`, read from its run directory alone, or of an
`hrl rollout`, read from its trace file (`--out`) and the live status beside it (so a run on another machine shows
over a shared filesystem): episodes in flight, policy version and staleness, latencies, tokens/s, reward and
failures per step (a training run's), the latest traces."""

from __future__ import annotations

import io
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.output import emit, err
from hrl.runners.errors import UsageError

__all__ = ["EPILOG", "snapshot", "top"]

EPILOG = """Examples:

  hrl top runs/demo                       # a live view, refreshed every 2 s (Ctrl-C leaves)

  hrl top runs/demo --interval 5          # refreshed every 5 s

  hrl top runs/demo --once                # one snapshot, for a log or a non-terminal

  hrl top runs/demo --once --json | jq '.in_flight | length'   # the snapshot as JSON, for scripts

  hrl top traces.jsonl                    # an `hrl rollout --out traces.jsonl` while it runs

  hrl top runs/eval-aider --once          # an `hrl eval` run
"""

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


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def render(snap: dict[str, Any]) -> Any:
    """The snapshot as rich tables (one renderable, for `Live` and for `--once`)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    of = f" of {snap['iterations']}" if snap.get("iterations") else ""
    where = f"{snap['traces']} traces" if snap.get("kind") == "rollout" else f"step {snap['step']}{of}"
    head = Text(f"{snap['run']}: {snap['status_line']}\n{where}   policy v{_fmt(snap['version'])}")
    states = ", ".join(f"{n} {s}" for s, n in sorted(snap["by_state"].items())) or "none"
    flight = Table(title=f"episodes in flight: {len(snap['in_flight'])} ({states})", title_justify="left")
    for col in ("episode", "task", "state", "version", "stale", "age s"):
        flight.add_column(col)
    for e in sorted(snap["in_flight"], key=lambda e: e["started_at"]):
        flight.add_row(e["episode"], str(e["task"]), e["state"], _fmt(e["version"]), _fmt(e["staleness"]),
                       f"{e['age_s']:.0f}")  # fmt: skip
    steps = Table(title="steps", title_justify="left")
    for col in ("step", "v", "traces", "reward", "success", "call p50/p95 s", "tool s", "tokens/s", "stale max"):
        steps.add_column(col)
    for s in snap["steps"]:
        steps.add_row(_fmt(s["step"]), _fmt(s["version"]), _fmt(s["traces"], ".0f"), _fmt(s["reward"]),
                      _fmt(s["success"]), f"{_fmt(s['call_p50_s'], '.2f')}/{_fmt(s['call_p95_s'], '.2f')}",
                      _fmt(s["tool_s"], ".2f"), _fmt(s["tokens_per_s"], ".1f"), _fmt(s["staleness_max"], ".0f"))  # fmt: skip
    failures = ", ".join(f"{r} {n}" for r, n in sorted(snap["failures"].items(), key=lambda x: -x[1])) or "-"
    fails = Text(f"failures (last {snap['recent_traces']} traces): {failures}")
    latest = Table(title="latest traces", title_justify="left")
    for col in ("episode", "task", "reward", "failure", "calls", "versions", "s"):
        latest.add_column(col)
    for t in snap["latest"]:
        latest.add_row(str(t["episode"]), str(t["task"]), _fmt(t["reward"]), t["failure"] or "-", str(t["calls"]),
                       ",".join(map(str, t["versions"])) or "-", _fmt(t["seconds"], ".1f"))  # fmt: skip
    return Group(head, flight, *([steps] if snap["steps"] else []), fails, latest)


def _text(snap: dict[str, Any]) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=140, no_color=True, highlight=False).print(render(snap))
    return out.getvalue().rstrip()


def top(
    run_dir: Annotated[
        Path,
        typer.Argument(
            metavar="RUN",
            help="The --run-dir of an `hrl train` or `hrl eval` run, or an `hrl rollout`'s --out trace file.",
        ),
    ],
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit (for a non-terminal).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --once: the snapshot as one JSON document.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between refreshes of the live view.")
    ] = 2.0,
    latest: Annotated[int, typer.Option("--latest", min=0, help="Latest traces shown.")] = 8,
) -> None:
    """Watch a training run (sync or async) or an evaluation from its run directory, or a rollout from its trace
    file: the episodes in flight by state (sandbox, agent, grading) with the policy version each started on and its
    staleness; for a training run reward, success, call and tool latency and tokens/s per step; failures by reason,
    the latest traces. A run whose process is gone reads `not running (last update Ns ago)`, never as live."""
    if as_json and not once:
        raise UsageError("--json prints one snapshot: it needs --once", hint=f"hrl top {run_dir} --once --json")
    snap = snapshot(run_dir, latest)
    if once:
        emit(snap, as_json=as_json, human=_text(snap))
        return
    if not sys.stdout.isatty():
        raise UsageError(
            "the live view of `hrl top` needs a terminal", hint=f"hrl top {run_dir} --once (one snapshot), in a loop"
        )
    _watch(run_dir, snap, interval, latest)


def _watch(run_dir: Path, snap: dict[str, Any], interval: float, latest: int) -> None:
    """Redraw every `interval` seconds until Ctrl-C (a normal way out: exit 0)."""
    from rich.console import Console
    from rich.live import Live

    try:
        with Live(render(snap), console=Console(), auto_refresh=False, screen=False) as view:
            while True:
                time.sleep(interval)
                view.update(render(snapshot(run_dir, latest)), refresh=True)
    except KeyboardInterrupt:
        err.print("")
