"""`hrl rollout`'s and `hrl eval`'s episodes, run where the placement stands them: planned from the tasks, the
engine stood up (one model after the other for an evaluation), each trace written as its episode ends, and the run
watched live (`hrl top`). What is said on the way goes to the caller's `say`; its progress to its handlers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hrl.config import RunConfig
from hrl.runners.placement import Episode, engine_version, local_placement, placed

__all__ = ["evaluate", "rollout_episodes", "rollout_plan"]

Event = Callable[[str, dict[str, Any]], None]
Say = Callable[[str], object]


def rollout_plan(settings: RunConfig, tasks: list[Any], n: int) -> tuple[list[Episode], list[str]]:
    """`n` episodes of each task under each of the run's harnesses, and the harnesses' names (`[""]`: the run's
    one harness)."""
    several = list(settings.rollout.agents)
    names = several if len(several) > 1 else [""]
    return [Episode(t, k, 0, name) for t in tasks for name in names for k in range(n)], names


async def rollout_episodes(
    settings: RunConfig, model: str, engine: str, episodes: list[Episode], out: Path, concurrency: int, *,
    on_event: Event, say: Say, verbose: bool,
) -> list[dict[str, Any]] | None:  # fmt: skip
    """`episodes`, at most `concurrency` at once, each trace appended to `out` as it ends (images' bytes beside it,
    in media/) and watched by `hrl top OUT`; their traces, or None when cancelled (said to `say`)."""
    from hrl.runners.live import live_status, traces_live_file

    # a recipe's pool sized for training: no more than this run uses (the node agents' pools under Ray too, which
    # `expect` does not reach)
    settings.rollout.warm_sandboxes = min(settings.rollout.warm_sandboxes, len(episodes))
    async with placed(settings, model, engine, concurrency, on_event=on_event, say=say, verbose=verbose) as here:
        # images' bytes beside the traces, where report, inspect and training read them
        here.publisher.keep_media(out.parent / "media")
        if here.rollouts is not None:
            here.rollouts.expect(len(episodes))  # and none made past the last episode
        try:
            with live_status(traces_live_file(out), lambda: engine_version(here)):  # `hrl top OUT` watches it
                return await here.run(episodes, out, concurrency)
        except asyncio.CancelledError:
            say(f"interrupted: traces of finished and cancelled episodes are in {out}")
            return None


async def evaluate(
    settings: RunConfig, plan: dict[str, Any], engine: str, tasks: list[Any], run: Any, concurrency: int, *,
    shown: contextlib.AbstractContextManager[Any], on_cell: Callable[[dict[str, Any]], Event],
    cell_done: Callable[[dict[str, Any]], object], say: Say,
) -> list[dict[str, Any]] | None:  # fmt: skip
    """`hrl eval`'s cells (`plan["cells"]`): each model served in turn, every harness of it run on `tasks` (`n`
    episodes each) into its trace file of `run`; `shown` (the progress display) is open meanwhile, `on_cell(cell)`
    is the handler of a cell's episode events and `cell_done(cell)` is called at its end. The traces, or None when
    cancelled (said to `say`; the live status ends as interrupted)."""
    from hrl.runners.live import live_status
    from hrl.runners.telemetry.otlp import exporting

    provider = "openai-compatible" if "://" in engine else engine
    serving: list[Any] = []  # the placement serving now (one model after the other), for the live status's version
    traces: list[dict[str, Any]] = []
    with (
        exporting(settings.telemetry, run_id=settings.rollout.run_id, provider=provider, phase="eval", say=say) as otlp,
        shown,
        live_status(run.path, lambda: engine_version(serving[-1]) if serving else None) as live,  # `hrl top RUN`
    ):
        export = otlp.export_written if otlp is not None else None  # each trace written, over OTLP too
        for path in dict.fromkeys(c["model_path"] for c in plan["cells"]):
            cells = [c for c in plan["cells"] if c["model_path"] == path]
            harnesses = [c["agent"] for c in cells]
            async with local_placement(settings, path, engine, harnesses=harnesses, export=export) as here:
                serving.append(here)
                for cell in cells:
                    episodes = [Episode(t, k, cell["iteration"]) for t in tasks for k in range(plan["n"])]
                    roll = settings.rollout.model_copy(update={"agent": cell["agent"], "agents": []})
                    rollouts = await here.prepare(on_cell(cell), roll)
                    # a recipe's pool sized for training (the demo's 16, each starting mini-swe-agent's imports)
                    # makes no more than the cell runs, and the cell's pool ends with it: its sandboxes made ahead
                    # would otherwise import beside the next cells' episodes until the model's placement ends
                    rollouts.expect(len(episodes))
                    try:
                        traces += await here.run(episodes, run.trace_file(cell["iteration"]), concurrency)
                    except asyncio.CancelledError:
                        say(f"interrupted: the traces so far are in {run.path}")
                        live.end_as = "interrupted"
                        return None
                    finally:
                        await rollouts.close()
                    cell_done(cell)
    return traces
