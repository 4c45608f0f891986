"""`hrl regrade RUN|TRACES`: grade each finished episode's archived final state again and say whether the
verifier agrees with the rewards the run recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.errors import EXIT_FAILURE, EXIT_INFRA
from hrl.cli.output import emit, err
from hrl.runners.errors import HrlError, UsageError

__all__ = ["EPILOG", "regrade"]

EPILOG = """Examples:

  hrl regrade runs/demo                          # every episode of a training run (traces/ and eval/)

  hrl regrade traces.jsonl --concurrency 8       # the episodes of `hrl rollout --out traces.jsonl`

  hrl regrade runs/demo --sandbox docker         # grade again in another backend than the run's

  hrl regrade runs/demo --json | jq '.disagreements[] | {episode, recorded, regraded, why}'

What is graded again: the agent's archived diff (test-graded tasks), a Harbor task's kept final container, or a
MiniWoB++ page's recorded inputs replayed on a fresh page of the same seed.

Counted apart, not as disagreements: episodes whose grading failed when they ran (verifier_error), episodes
never graded, and those that cannot be regraded (a Harbor final image removed, a page whose inputs were not
recorded).

Exit codes: 0 every regraded episode agrees; 1 a disagreement; 3 regrading failed for some episode (and none
disagreed).
"""


def regrade(
    source: Annotated[Path, typer.Argument(help="A run directory (`hrl train --run-dir`) or a trace file.")],
    sandbox: Annotated[str, typer.Option(help="docker | local; default: the sandbox each episode ran in.")] = "",
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes graded at once.")] = 4,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON document: counts and every episode listed.")
    ] = False,
) -> None:
    """Re-run the verifier on each episode's archived diff and task (a Harbor episode: its kept final image); report
    agreement with the recorded rewards."""
    from hrl.runners.tasks.regrade import archive_dir, collect, regrade, trace_files

    if sandbox:
        from hrl.sandboxes import get_backend

        get_backend(sandbox)  # an unknown name fails here, listing the valid ones
    files = trace_files(source)
    episodes = collect(source)
    if not episodes:  # an empty file: nothing disagrees, and nothing agrees either
        raise UsageError(
            f"{source} holds no trace: nothing to regrade",
            hint="give a trace file with traces (the --out of `hrl rollout`) or a run directory that has run",
        )
    todo = sum(not e.apart for e in episodes)
    if not todo:
        raise HrlError(f"no episode of {source} can be regraded ({_apart_line(episodes)})",
                       hint="regrading needs episodes graded by the tests, harbor or miniwob verifier, written by this hrl")  # fmt: skip
    err.print(f"regrading {todo} of {len(episodes)} episodes from {source}", markup=False)
    done: list[Any] = []

    def on_done(ep: Any) -> None:
        done.append(ep)
        mark = "agrees" if ep.agrees else ("regrade failed" if ep.regraded is None else "DISAGREES")
        err.print(f"[{len(done)}/{todo}] {ep.episode}: recorded {ep.recorded:g}, regraded "
                  f"{'-' if ep.regraded is None else format(ep.regraded, 'g')}  {mark}", markup=False)  # fmt: skip

    hide = [str(p.resolve()) for f in files for p in (f, archive_dir(f))]  # hidden tests: no grading sandbox reads them
    if source.is_dir():
        hide.append(str(source.resolve()))
    result = asyncio.run(regrade(episodes, sandbox=sandbox, concurrency=concurrency, hide_paths=hide, on_done=on_done))
    summary = {"source": str(source), **result.summary()}
    emit(summary, as_json=as_json, human=_human(result))
    if result.disagreements:
        raise typer.Exit(EXIT_FAILURE)
    if result.errors:
        raise typer.Exit(EXIT_INFRA)


def _human(result: Any) -> str:
    summary = result.summary()
    rate = "-" if summary["agreement"] is None else f"{summary['agreement']:.2f}"
    lines = [f"agreement {rate} ({summary['agreed']}/{summary['regraded']})"]
    if result.disagreements:
        lines.append(f"{len(result.disagreements)} disagreements:")
        lines += [_row(e) for e in result.disagreements]
    if result.errors:
        lines.append(f"{len(result.errors)} could not be regraded (grading failed now):")
        lines += [_row(e) for e in result.errors]
    if apart := _apart_line(result.episodes):
        lines.append(f"counted apart: {apart}")
    return "\n".join(lines)


def _row(ep: Any) -> str:
    regraded = "-" if ep.regraded is None else f"{ep.regraded:g}"
    return f"  {ep.episode}  task {ep.task_id}  recorded {ep.recorded:g}  regraded {regraded}  {ep.why}"


def _apart_line(episodes: list[Any]) -> str:
    """How many were set apart, and why, on one line."""
    parts = []
    for kind, label in (("grading_failed", "grading failed when recorded"), ("not_graded", "never graded"),
                        ("not_regradable", "not regradable")):  # fmt: skip
        whys = sorted({e.why for e in episodes if e.apart == kind})
        if count := sum(e.apart == kind for e in episodes):
            parts.append(f"{count} {label} ({'; '.join(whys)})")
    return ", ".join(parts)
