"""`hrl top`: a live view of a running `hrl train` or `hrl eval`, read from its run directory alone, or of an
`hrl rollout`, read from its trace file (`--out`) and the live status beside it (so a run on another machine shows
over a shared filesystem): episodes in flight, policy version and staleness, latencies, tokens/s, reward and
failures per step (a training run's), the latest traces, and where a Ray run's pieces run (its placement.json)."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.output import emit, err
from hrl.runners.errors import UsageError

__all__ = ["EPILOG", "top"]

EPILOG = """Examples:

  hrl top runs/demo                       # a live view, refreshed every 2 s (Ctrl-C leaves)

  hrl top runs/demo --interval 5          # refreshed every 5 s

  hrl top runs/demo --once                # one snapshot, for a log or a non-terminal

  hrl top runs/demo --once --json | jq '.in_flight | length'   # the snapshot as JSON, for scripts

  hrl top traces.jsonl                    # an `hrl rollout --out traces.jsonl` while it runs

  hrl top runs/eval-aider --once          # an `hrl eval` run
"""


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


PLACEMENT_FILE = "placement.json"  # written by a Ray run: which node each piece of it runs on


def read_placement(run: Path) -> dict[str, Any] | None:
    """`<run>/placement.json` as its writer left it, or None where there is none (a local run, a rollout's trace
    file) or it cannot be read whole yet: the view goes on without the panel rather than fail on it."""
    import json

    try:
        found = json.loads((run / PLACEMENT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _placement_table(placed: dict[str, Any]) -> Any:
    """Where each piece ran, one row each: the driver, every trainer rank, every engine replica; node ids cut to 12
    characters (Ray's are 56), enough to tell the nodes apart and to find one in `ray status`. The title names
    where the trainer ran and how weights reached the replicas, where the file says."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def row(piece: str, where: dict[str, Any]) -> tuple[str, ...]:
        devices = ",".join(map(str, where.get("devices") or [])) or "-"
        return piece, str(where.get("node_id") or "-")[:12], str(where.get("node_ip") or "-"), devices

    ranks, replicas = placed.get("trainer_ranks") or [], placed.get("replicas") or []
    rows = [row("driver", placed["driver"])] if isinstance(placed.get("driver"), dict) else []
    rows += [row(f"rank {r.get('rank')}", r) for r in sorted(ranks, key=lambda r: r.get("rank", 0))]
    rows += [row(f"replica {r.get('replica')}", r) for r in replicas]
    nodes = len({r[1] for r in rows})
    how = ", ".join(f"{k} {placed[k]}" for k in ("trainer", "weights") if isinstance(placed.get(k), str))
    title = f"placement: {len(ranks)} trainer ranks, {len(replicas)} replicas on {nodes} nodes" + (
        f" ({how})" if how else "")  # fmt: skip
    table = Table()
    for col in ("piece", "node", "ip", "devices"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    return Group(Text(title), table)  # the title on its own line: a table's would wrap to the table's width


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
    placed = [_placement_table(snap["placement"])] if snap.get("placement") else []
    return Group(head, *placed, flight, *([steps] if snap["steps"] else []), fails, latest)


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
    the latest traces; for a Ray run, the node, IP and devices of the driver, each trainer rank and each engine
    replica (its placement.json). A run whose process is gone reads `not running (last update Ns ago)`, never as
    live."""
    if as_json and not once:
        raise UsageError("--json prints one snapshot: it needs --once", hint=f"hrl top {run_dir} --once --json")
    snap = _snapshot(run_dir, latest)
    if once:
        emit(snap, as_json=as_json, human=_text(snap))
        return
    if not sys.stdout.isatty():
        raise UsageError(
            "the live view of `hrl top` needs a terminal", hint=f"hrl top {run_dir} --once (one snapshot), in a loop"
        )
    _watch(run_dir, snap, interval, latest)


def _snapshot(run_dir: Path, latest: int) -> dict[str, Any]:
    """The run's snapshot (`runners.report.top`) with `placement`: its placement.json, None where it has none."""
    from hrl.runners.report.top import snapshot

    snap = snapshot(run_dir, latest)
    snap["placement"] = read_placement(Path(snap["run"])) if snap.get("kind") == "run" else None
    return snap


def _watch(run_dir: Path, snap: dict[str, Any], interval: float, latest: int) -> None:
    """Redraw every `interval` seconds until Ctrl-C (a normal way out: exit 0)."""
    from rich.console import Console
    from rich.live import Live

    try:
        with Live(render(snap), console=Console(), auto_refresh=False, screen=False) as view:
            while True:
                time.sleep(interval)
                view.update(render(_snapshot(run_dir, latest)), refresh=True)
    except KeyboardInterrupt:
        err.print("")
