"""What runs leave behind: their sandboxes (agent and grading; docker containers labelled hrl=1 and local temp
folders with a marker), the scratch folders of hrl processes that are gone, and the final images kept for
`hrl regrade`. Listed and removed for `hrl sandbox ls` and `hrl sandbox prune`, and for a resumed run, whose
interrupted process left its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hrl.runners.errors import PrerequisiteError

__all__ = ["prune", "remove_leftovers", "sandbox_rows"]

Say = Callable[[str], object]


def sandbox_rows() -> tuple[list[dict[str, Any]], PrerequisiteError | None]:
    """hrl's sandboxes with their run and episode, local ones first (`orphaned` when the process that made them is
    gone), then docker's; without a Docker daemon the local ones and the error to raise once they are shown."""
    import docker

    from hrl.sandboxes.local import list_sandboxes

    rows = [{"backend": "local", **r} for r in list_sandboxes()]
    try:  # a container gone between the listing and its inspection is left out, not an error
        found = docker.from_env().containers.list(all=True, filters={"label": "hrl=1"}, ignore_removed=True)
    except docker.errors.DockerException as e:
        error = PrerequisiteError(
            f"no Docker daemon: {e}", hint="start dockerd (`make setup` does); `hrl doctor` checks"
        )
        error.__cause__ = e
        return rows, error
    rows += [{"backend": "docker", "id": c.short_id, "status": c.status, "run": c.labels.get("hrl.run"),
              "episode": c.labels.get("hrl.episode")} for c in found]  # fmt: skip
    return rows, None


async def prune(run_id: str, all_runs: bool, final_images: bool, say: Say) -> dict[str, int]:
    """Remove the sandboxes of `run_id` (every run's with `all_runs`, which also sweeps the scratch folders of hrl
    processes that are gone) from both backends, and with `final_images` the run's (or every run's) kept final
    images: how many of each. A backend that cannot be reached (no Docker daemon) is said to `say` and counts 0."""
    from hrl.runners.scratch import sweep_scratch
    from hrl.sandboxes import get_backend

    out = {}
    for name in ("docker", "local"):
        try:
            out[name] = await get_backend(name).prune(run_id or None)
        except Exception as e:  # docker may be absent: say so, prune what can be pruned
            say(f"{name}: {e}")
            out[name] = 0
    if all_runs:
        out["scratch"] = await asyncio.to_thread(sweep_scratch)
    if final_images:
        from hrl.runners.tasks.harbor_verifier import FINAL_LABEL

        out["final_images"] = await get_backend("docker").prune_images(f"{FINAL_LABEL}=1", run_id or None)
    return out


def remove_leftovers(sandbox: str, run_id: str, say: Say) -> None:
    """Kill and delete the sandboxes (agent and grading) the interrupted process of run `run_id` left behind: after
    `kill -9` nobody closed them, so their agent CLIs may still run and their directories or containers remain.
    The run's lock guarantees that process is gone. Runs from before sandboxes carried the run's id are skipped."""
    from hrl.sandboxes import get_backend

    if not run_id:
        return
    removed = asyncio.run(get_backend(sandbox).prune(run_id))
    if removed:
        say(f"removed {removed} sandboxes left by the interrupted process")
