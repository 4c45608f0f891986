"""`hrl regrade RUN|TRACES`: grade each finished episode's archived final state again and say whether the
verifier agrees with the rewards the run recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.errors import EXIT_FAILURE, EXIT_INFRA
from hrl.cli.output import emit, say

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
    from hrl.runners.tasks.regrade import regradable, regrade

    if sandbox:
        from hrl.sandboxes import get_backend

        get_backend(sandbox)  # an unknown name fails here, listing the valid ones
    episodes, hide = regradable(source)
    todo = sum(not e.apart for e in episodes)
    say(f"regrading {todo} of {len(episodes)} episodes from {source}")
    done: list[Any] = []

    def on_done(ep: Any) -> None:
        done.append(ep)
        mark = "agrees" if ep.agrees else ("regrade failed" if ep.regraded is None else "DISAGREES")
        say(f"[{len(done)}/{todo}] {ep.episode}: recorded {ep.recorded:g}, regraded "
            f"{'-' if ep.regraded is None else format(ep.regraded, 'g')}  {mark}")  # fmt: skip

    result = asyncio.run(regrade(episodes, sandbox=sandbox, concurrency=concurrency, hide_paths=hide, on_done=on_done))
    summary = {"source": str(source), **result.summary()}
    emit(summary, as_json=as_json, human=result.text())
    if result.disagreements:
        raise typer.Exit(EXIT_FAILURE)
    if result.errors:
        raise typer.Exit(EXIT_INFRA)
