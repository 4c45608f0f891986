"""A resolved training run trained (`hrl train`): its tasks chosen, what it needs stood up where its placement says,
and the sync or the async loop run on it; an online run (`--serve`) is `hrl.train.online.train_online`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hrl.config import RunConfig
from hrl.runners.rundir import RunDir

__all__ = ["train_run"]


async def train_run(
    settings: RunConfig,
    run: RunDir,
    include_unchecked: bool,
    address: tuple[str, int],
    on_event: Callable[[str, dict[str, Any]], None],
    say: Callable[[str], object],
) -> list[dict[str, Any]]:
    """Train `run` (created, or resumed, by the caller) with `settings`: the loop's events to `on_event`, what the
    run has to say (the tasks left out, what is stood up) to `say`; `address` is an online run's. The step history."""
    if settings.serves_clients:
        from hrl.train.online import train_online

        return await train_online(settings, run, address, include_unchecked, on_event, say)
    from hrl.runners.live import live_status
    from hrl.runners.placement import placed
    from hrl.runners.tasks.task_checks import tasks_for_run
    from hrl.train.async_loop import train_async
    from hrl.train.loop import train as train_sync

    checked, held = tasks_for_run(settings.tasks, settings.eval_tasks, run.path, include_unchecked, say)
    tasks = [t.model_dump() for t in checked]
    heldout = [t.model_dump() for t in held] if held else None
    loop_cfg = settings.loop()
    batch = loop_cfg.tasks_per_iteration * loop_cfg.group_size * max(1, len(settings.rollout.harnesses))
    if settings.rollout.warm_sandboxes > batch:  # more than an iteration's episodes would never be leased in time
        settings.rollout.warm_sandboxes = batch
    async with placed(settings, settings.model, settings.engine, loop_cfg.concurrency, say=say) as here:
        rollouts, publisher = here.rollouts, here.publisher
        with live_status(run.path, lambda: publisher.engine.version):  # <run>/live.json, for `hrl top`
            if settings.async_.enabled:
                return await train_async(tasks, loop_cfg, settings.async_, run, publisher, rollouts,
                                         on_event, heldout)  # fmt: skip
            return await train_sync(tasks, loop_cfg, run, publisher, rollouts, on_event, heldout)
