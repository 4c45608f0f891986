"""`hrl report`: a run directory as one self-contained HTML file (plots + a searchable table of traces)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.options import DecodeModelOption
from hrl.cli.output import emit, say
from hrl.runners.errors import UsageError

__all__ = ["EPILOG", "report", "warn_cut_lines"]

EPILOG = """Examples:

  hrl report runs/demo                          # writes runs/demo/report.html

  hrl report traces.jsonl                       # what `hrl rollout --out` wrote: writes traces.html

  hrl report a.jsonl b.jsonl --out ab.html      # several trace files as one report

  hrl report traces.jsonl -m Qwen/Qwen3-8B      # conversations decoded with that model's tokenizer

  hrl report runs/demo --out /tmp/demo.html     # somewhere else

  hrl report runs/demo --json | jq -r .out      # the path, for scripts

  hrl report runs/eval-20261201-160000          # an `hrl eval` run: its harness table too
"""


def report(
    sources: Annotated[
        list[Path],
        typer.Argument(
            metavar="RUN_DIR|FILE...",
            help="A run directory (the --run-dir of `hrl train`), or trace files (the --out of `hrl rollout`).",
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Where to write the HTML (default: RUN_DIR/report.html, or FILE.html)."),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print {out, traces, steps, bytes} (an eval run's rows; cut_lines: files whose last line a crash cut "
            "short; dropped_media: traces whose requests lost media to proxy.media: drop) as JSON.",
        ),
    ] = False,
    model: DecodeModelOption = None,
) -> None:
    """Render a run, or trace files, as one HTML file that needs no network to view: reward, failures by reason,
    latency and token distributions, staleness and versions over training steps (trace files have none), and a
    table of traces that opens each trace's conversation, calls and tool events (link one with
    `report.html#trace=ID`)."""
    from hrl.runners.preflight import check_writable
    from hrl.runners.report.builder import report_summary, write_report
    from hrl.runners.report.evaluation import eval_table_text, read_plan
    from hrl.runners.report.run import load_source
    from hrl.runners.rundir import is_run_dir

    if out is not None:
        check_writable(out, "--out")
    run = load_source(sources)
    if not run.traces and not is_run_dir(run.path):  # a page of nothing says nothing: an empty file is a mistake
        raise UsageError(
            f"{', '.join(map(str, sources))} {'holds' if len(sources) == 1 else 'hold'} no trace: no report to write",
            hint="give a trace file with traces (the --out of `hrl rollout`) or a run directory",
        )
    warn_cut_lines(run)
    path = write_report(run, out, model)
    info = report_summary(run, path)
    if not as_json:
        if "eval" in info:  # an `hrl eval` run: its table, as `hrl eval` printed it
            say(eval_table_text(info["eval"], read_plan(run.path)))
        n = info["steps"]
        steps = f"{n} steps" if is_run_dir(run.path) else f"{n} trace file{'s' if n != 1 else ''}"
        flagged = f" ({info['dropped_media']} with dropped media)" if "dropped_media" in info else ""
        say(f"{steps}, {info['traces']} traces{flagged} → {path} ({info['bytes'] / 1024:.0f} KiB)")
    emit(info, as_json=as_json, human=str(path))


def warn_cut_lines(run: Any) -> None:
    """One warning line on stderr per trace file whose last line a crash cut short (what was read is shown)."""
    for cut in run.cut_lines:
        say(f"Warning: {cut['file']}:{cut['line']}: the last line is cut short (its writer stopped mid-write); "
            "showing the complete traces before it")  # fmt: skip
