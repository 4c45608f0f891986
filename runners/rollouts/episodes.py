"""Episodes: one agent run on one task, the unit rollouts are made of; and running many with a bound.

No episode is lost: `guarded_episode` turns an episode that raises (a bug, a broken sandbox the runner did not
expect) into a trace with `failure_reason: internal_error`, written like any other, so its group still completes
and the failure is counted, in the synchronous loop, the asynchronous one and `hrl rollout` alike.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hrl.runners.live import live_episode
from hrl.runners.trace import Export, write_trace

__all__ = ["Episode", "Rollouts", "failed_trace", "guarded_episode", "harness_for", "run_episodes"]


@dataclass(frozen=True)
class Episode:
    task: Any  # a task dict, or a runners.tasks.Task
    index: int  # k within the group
    iteration: int  # the batch (sync) or group number (async) it belongs to
    agent: str = ""  # the harness it runs under, in a run of several (rollout.agents); "" = the run's one harness
    version: int | None = None  # every token sampled by this policy version (a held-out evaluation); None = live

    @property
    def task_id(self) -> str:
        t = self.task if isinstance(self.task, dict) else self.task.model_dump()
        return str(t.get("instance_id") or t.get("task_id") or t.get("id"))

    @property
    def group_id(self) -> str:
        """One GRPO group: a task in a batch, under one harness when the run has several."""
        return f"it{self.iteration}:{self.task_id}" + (f"@{self.agent}" if self.agent else "")

    @property
    def key(self) -> str:
        return f"{self.group_id}#{self.index}"

    @classmethod
    def group(cls, task: Any, size: int, batch: int, harness: str = "") -> list[Episode]:
        """One GRPO group: `size` (train.group_size) episodes of `task` in `batch` (the sync loop's iteration, the
        async loop's group number), under `harness`. Both loops make their groups here, and only here."""
        return [cls(task, k, batch, harness) for k in range(size)]


class Rollouts(Protocol):
    """What the loops and `hrl rollout` run episodes with. Every implementation subclasses it: `harnesses`,
    `export` and `close` have defaults."""

    harnesses: Sequence[str] = ()  # a run of several (`HarnessMix`): its harnesses, in order; () for one
    export: Export | None = None  # each trace written also goes there (the run's OTLP export); None: nowhere

    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        """Run one episode to exactly one trace (appended to trace_file when it ends) and return that trace.
        Failures are data (the trace's failure_reason); only cancellation propagates."""
        ...

    async def close(self) -> None:
        """Release what the episodes held (sandbox pools, HTTP clients); nothing by default."""
        return

    def expect(self, episodes: int) -> None:
        """At most `episodes` more episodes will run here: a sandbox pool makes no more ahead (nothing by default)."""
        return


def harness_for(rollouts: Rollouts | None, group: int) -> str:
    """The harness of the run's `group`-th group: round-robin over the rollouts' harnesses when there are several
    (`HarnessMix`), so each harness gets every n-th group; "" when there is one."""
    harnesses = list(rollouts.harnesses) if rollouts is not None else []
    return harnesses[group % len(harnesses)] if len(harnesses) > 1 else ""


def failed_trace(ep: Episode, reason: str, error: str, started_at: float) -> dict[str, Any]:
    """The trace of an episode that ended without one of its own: no calls, no reward, the error kept. Built by
    the one trace builder (`Session.to_trace`), as the proxy builds every other."""
    from hrl.runners.proxy.session import Session

    meta = {"task_id": ep.task_id, "group_id": ep.group_id, "metadata": {"episode": ep.key}}
    if ep.agent:
        meta["agent"] = {"name": ep.agent}  # counted under its harness like the episodes that ran
    session = Session("", meta)
    session.started_at = started_at
    return session.to_trace(failure_reason=reason, extra={"error": error[-4000:]})


async def guarded_episode(rollouts: Rollouts, ep: Episode, trace_file: Path) -> dict[str, Any]:
    """`rollouts.episode`, except that raising is not an option: an exception becomes an `internal_error` trace
    (appended to trace_file). Cancellation still propagates (the runner writes its `cancelled` trace)."""
    started = time.time()
    with live_episode(ep.key, ep.task_id, ep.version):  # in <run>/live.json while it runs (`hrl top`)
        try:
            return await rollouts.episode(ep, trace_file)
        except Exception as e:
            detail = "".join(traceback.format_exception(e))
            trace = failed_trace(ep, "internal_error", f"{type(e).__name__}: {e}\n{detail}", started)
            await asyncio.to_thread(write_trace, trace_file, trace, rollouts.export)
            return trace


async def run_episodes(rollouts: Rollouts, episodes: list[Episode], trace_file: Path, concurrency: int) -> list[Any]:
    """Run episodes with at most `concurrency` at once.

    Cancelled (Ctrl-C), it returns only once every started episode has ended as its trace and closed its sandbox:
    a bare gather would give up at the first cancelled child (a queued one) and leave the rest to be torn down
    with the proxy and the event loop, losing their traces.
    """
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(ep: Episode) -> dict[str, Any]:
        async with sem:
            return await guarded_episode(rollouts, ep, trace_file)

    tasks = [asyncio.ensure_future(one(ep)) for ep in episodes]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # cancelled, or an episode raised: stop the others, each once (a second cancel would cut short the cleanup
        # a cancelled episode is already running), and wait until each has ended
        for task in tasks:
            if not task.done() and not task.cancelling():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
