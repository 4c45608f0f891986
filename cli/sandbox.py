"""`hrl sandbox`: images for sandboxes, and cleaning up after crashed runs."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from hrl.cli.output import emit, err
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
    import docker

    from hrl.runners.errors import PrerequisiteError
    from hrl.runners.tasks.image import ensure_browser_image, ensure_image

    base = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")
    try:
        docker.from_env().images.get(base)
    except docker.errors.ImageNotFound as e:
        raise PrerequisiteError(
            f"base image {base} is missing", hint="build it with `make setup` (debootstrap, no registry needed)"
        ) from e
    except docker.errors.DockerException as e:
        raise PrerequisiteError(f"no Docker daemon: {e}", hint="start dockerd (`make setup` does)") from e
    from concurrent.futures import ThreadPoolExecutor

    def said(ev: dict) -> None:
        err.print(f"  {ev}", markup=False)

    # The two builds share nothing but the base image, and each mostly waits on its downloads: side by side.
    with ThreadPoolExecutor(2) as pool:
        builds = [pool.submit(ensure_image, rebuild=rebuild, on_event=said)]
        if browser:
            builds.append(pool.submit(ensure_browser_image, rebuild=rebuild, on_event=said))
        for build in builds:
            tag = build.result()  # a failed build raises here, as it would have alone
            emit({"image": tag}, as_json=False, human=tag)


@app.command("ls", epilog="Examples:\n\n  hrl sandbox ls\n\n  hrl sandbox ls --json")
def ls(as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False) -> None:
    """List hrl's sandboxes with their run and episode: local ones (temp folders with a marker; `orphaned` when the
    process that made them is gone) and docker ones (containers labelled hrl=1). Without a Docker daemon the local
    ones are listed, then the error (exit 4)."""
    import docker

    from hrl.runners.errors import PrerequisiteError
    from hrl.sandboxes.local import list_sandboxes

    rows = [{"backend": "local", **r} for r in list_sandboxes()]
    try:
        found = docker.from_env().containers.list(all=True, filters={"label": "hrl=1"})
    except docker.errors.DockerException as e:
        if rows:  # what could be listed, as `ls` lists a path that exists before the error for one that does not
            _show(rows, as_json)
        raise PrerequisiteError(
            f"no Docker daemon: {e}", hint="start dockerd (`make setup` does); `hrl doctor` checks"
        ) from e
    rows += [{"backend": "docker", "id": c.short_id, "status": c.status, "run": c.labels.get("hrl.run"),
              "episode": c.labels.get("hrl.episode")} for c in found]  # fmt: skip
    _show(rows, as_json)


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

    from hrl.runners.scratch import sweep_scratch
    from hrl.sandboxes import get_backend

    if not run and not all_runs:
        raise UsageError("give --run RUN_ID or --all", hint="`hrl sandbox ls` lists the sandboxes with their run ids")

    async def go() -> dict[str, int]:
        out = {}
        for name in ("docker", "local"):
            try:
                out[name] = await get_backend(name).prune(run or None)
            except Exception as e:  # docker may be absent: say so, prune what can be pruned
                err.print(f"{name}: {e}", markup=False)
                out[name] = 0
        if all_runs:
            out["scratch"] = await asyncio.to_thread(sweep_scratch)
        if final_images:
            from hrl.runners.tasks.harbor_verifier import FINAL_LABEL

            out["final_images"] = await get_backend("docker").prune_images(f"{FINAL_LABEL}=1", run or None)
        return out

    counts = asyncio.run(go())
    human = f"removed {counts['docker']} containers, {counts['local']} local sandboxes"
    human += f", {counts['scratch']} scratch dirs" if all_runs else ""
    emit(counts, as_json=as_json, human=human + (f", {counts['final_images']} final images" if final_images else ""))
