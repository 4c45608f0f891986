"""`hrl inspect RUN_DIR`: a run directory as one row per iteration (reward, success, failures, latencies, tokens,
staleness) and one sparkline per metric over the iterations."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from hrl.cli.output import emit, err
from hrl.cli.tables import plain_table, short_count, short_secs, stdout_console

__all__ = ["inspect_run"]


def inspect_run(run: Any, *, as_json: bool) -> None:
    """The run's iterations as a table and trends (--json: one object per iteration)."""
    from hrl.runners.report.run import iteration_summaries

    rows = iteration_summaries(run)
    if as_json:
        emit(rows, as_json=True)
        return
    if not rows:
        err.print(f"no iterations in {run.path} yet", markup=False, highlight=False)
        return
    console = stdout_console()
    console.print(_run_table(rows))
    console.print()
    console.print(_trends(rows))
    state = run.state
    console.print(
        Text(
            f"{len(rows)} iterations, {len(run.traces)} traces · next iteration {state.get('iteration', '-')} · "
            f"policy version {state.get('version', '-')}",
            style="dim",
        )
    )


def _run_table(rows: list[dict[str, Any]]) -> Table:
    from hrl.runners.report.run import row_metric as _m

    table = plain_table()
    for name in ("iter", "n", "reward", "success"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("failures", max_width=20, overflow="fold")
    for name in ("time p50/p95", "llm", "tool", "tokens p/r", "stale avg/max"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        reward, success = _m(r, "trace/reward"), _m(r, "trace/success")
        fails = "\n".join(f"{k} {n}" for k, n in sorted(r["failures"].items()))  # one reason per line
        stale = _m(r, "trace/staleness")
        table.add_row(
            str(r["iteration"]),
            str(r["traces"]),
            "-" if reward is None else f"{reward:.3g}",
            "-" if success is None else f"{success:.3g}",  # the share of its graded traces that succeeded
            Text(fails or "-", style="red" if fails else ""),
            f"{short_secs(_m(r, 'trace/latency_s/p50'))}/{short_secs(_m(r, 'trace/latency_s/p95'))}",
            short_secs(_m(r, "trace/llm_latency_s/p50")),
            short_secs(_m(r, "trace/tool_latency_s/p50")),
            f"{short_count(_round(_m(r, 'trace/prompt_tokens')))}/"
            f"{short_count(_round(_m(r, 'trace/response_tokens')))}",
            "-" if stale is None else f"{stale:.2g}/{_m(r, 'trace/staleness/max') or 0:.0f}",
        )
    return table


def _value(v: float) -> str:
    return short_count(round(v)) if abs(v) >= 1000 else f"{v:.3g}"


def _round(v: float | None) -> int | None:
    return None if v is None else round(v)


def _trends(rows: list[dict[str, Any]]) -> Table:
    """One sparkline per metric over the iterations, with its first → last value (rows without data left out)."""
    from hrl.runners.report.run import sparkline, trends

    table = plain_table()
    table.add_column("trend")
    table.add_column("", no_wrap=True)
    table.add_column("first → last", justify="right", no_wrap=True)
    for label, values in trends(rows):
        known = [v for v in values if v is not None]
        table.add_row(label, Text(sparkline(values), style="cyan"), f"{_value(known[0])} → {_value(known[-1])}")
    return table
