"""`hrl sandbox`: images for sandboxes, and cleaning up after crashed runs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hrl.cli.output import emit, say
from hrl.runners.errors import UsageError

__all__ = ["app"]

app = typer.Typer(help="Sandbox images and leftovers.", no_args_is_help=True)


@app.command("build", epilog="Examples:\n\n  hrl sandbox build\n\n  hrl sandbox build --rebuild")
def build(
    rebuild: Annotated[bool, typer.Option(help="Build again even if the image exists.")] = False,
    browser: Annotated[
        bool, typer.Option(help="Also the browser image (hrl/browser:bookworm: Chromium, for browser tasks).")
    ] = False,
) -> None:
    """Build the grading/agent image (Python + pytest) on top of the base image, and with --browser the image the
    browser of a browser task's episode runs in (else built on first use)."""
    from hrl.runners.tasks.sandbox_images import build_images

    for tag in build_images(rebuild, browser, on_event=lambda ev: say(f"  {ev}")):
        emit({"image": tag}, as_json=False, human=tag)


@app.command("ls", epilog="Examples:\n\n  hrl sandbox ls\n\n  hrl sandbox ls --json")
def ls(as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False) -> None:
    """List hrl's sandboxes with their run and episode: local ones (temp folders with a marker; `orphaned` when the
    process that made them is gone) and docker ones (containers labelled hrl=1). Without a Docker daemon the local
    ones are listed, then the error (exit 4)."""
    from hrl.runners.leftovers import sandbox_rows

    rows, no_docker = sandbox_rows()
    if rows or no_docker is None:  # what could be listed, as `ls` lists a path that exists before the error
        _show(rows, as_json)
    if no_docker is not None:
        raise no_docker


def _show(rows: list[dict[str, Any]], as_json: bool) -> None:
    human = "\n".join(f"{r['backend']:<6} {r['id']} {r['status']:<8} {r['run']} {r['episode']}" for r in rows)
    emit(rows, as_json=as_json, human=human)


PRUNE_EXAMPLES = (
    "Examples:\n\n  hrl sandbox prune --run hrl-1a2b3c4d\n\n  hrl sandbox prune --all\n\n"
    "  hrl sandbox prune --run hrl-1a2b3c4d --final-images"
)


@app.command("prune", epilog=PRUNE_EXAMPLES)
def prune(
    run: Annotated[str, typer.Option(help="Remove the sandboxes of this run id.")] = "",
    all_runs: Annotated[bool, typer.Option("--all", help="Remove every hrl sandbox, of live runs too.")] = False,
    final_images: Annotated[
        bool,
        typer.Option(
            "--final-images",
            help="Also remove the final images kept for `hrl regrade` (Harbor episodes, hrl/harbor-final); those "
            "episodes can then no longer be regraded.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Remove sandboxes left behind by crashed runs (docker containers and local temp dirs); with --all, also the
    scratch dirs (proxy sockets, repo snapshots) of hrl processes that are gone; with --final-images, the run's
    (or every run's) kept final images too."""
    import asyncio

    from hrl.runners.leftovers import prune as prune_leftovers

    if not run and not all_runs:
        raise UsageError("give --run RUN_ID or --all", hint="`hrl sandbox ls` lists the sandboxes with their run ids")
    counts = asyncio.run(prune_leftovers(run, all_runs, final_images, say))
    human = f"removed {counts['docker']} containers, {counts['local']} local sandboxes"
    human += f", {counts['scratch']} scratch dirs" if all_runs else ""
    emit(counts, as_json=as_json, human=human + (f", {counts['final_images']} final images" if final_images else ""))
