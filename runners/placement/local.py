"""A run stood up in this process: the engine, the recording proxy in front of it (`runners.serving.stack.serving`) and
the rollouts over them. `hrl rollout`, `hrl train` and `hrl eval` stand runs up here, and so does each Ray node
agent (its engine is a `replicas` set over the cluster's engine servers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from hrl.config import RunConfig
from hrl.runners.rollouts.episodes import Episode, Rollouts, run_episodes
from hrl.runners.rollouts.rollout import RolloutConfig, make_rollouts
from hrl.runners.serving.stack import Stack, serving
from hrl.runners.trace import Export

__all__ = ["LocalPlacement", "local_placement", "run_serving"]

Event = Callable[[str, dict[str, Any]], None]
Say = Callable[[str], object]


def _quiet(kind: str, data: dict[str, Any]) -> None:
    return None


def _silent(line: str) -> None:
    return None


class LocalPlacement:
    """Engine and proxy in this process; `rollouts` are the run's own (after `prepare`), `rollouts_for` makes more
    over the same stack (`hrl eval`: one per harness). The proxy is the publisher: it pauses, publishes, resumes."""

    def __init__(
        self, stack: Stack, settings: RunConfig, say: Say, verbose: bool, export: Export | None = None
    ) -> None:
        self.stack, self.settings, self.say, self.verbose = stack, settings, say, verbose
        self.export = export  # each trace the rollouts write also goes there (the run's OTLP export)
        self.rollouts: Rollouts | None = None
        self.made: list[Rollouts] = []  # every rollouts made here, closed with the placement (their sandbox pools)

    @property
    def publisher(self) -> Any:
        return self.stack.proxy

    async def prepare(self, on_event: Event = _quiet, rollout: RolloutConfig | None = None) -> Rollouts:
        """The run's rollouts (its `rollout:` section unless `rollout` is given), agents installed."""
        self.rollouts = await self.rollouts_for(rollout or self.settings.rollout, on_event)
        return self.rollouts

    async def rollouts_for(self, rollout: RolloutConfig, on_event: Event = _quiet) -> Rollouts:
        """Rollouts of `rollout`'s harnesses over this stack, each agent CLI installed (once; cached after)."""
        from hrl.runners.agents.install import installed
        from hrl.runners.whitebox.harness import is_python_agent

        settings = self.settings
        made = make_rollouts(
            self.stack, rollout, on_event, settings.verifier or None, settings.recipe_dir or None, self.export
        )
        self.made.append(made)
        target = "docker" if rollout.sandbox == "docker" else "local"
        for name in (a for a in rollout.harnesses if not is_python_agent(a)):
            cached = installed(name, target)
            if cached is None:  # a cached agent is ready at once: nothing to say, unless asked
                self.say(f"installing {name} for {target} (once; cached after) …")
            elif self.verbose:
                self.say(f"{cached.name} {cached.version} for {target}: cached in {cached.host_dir}")
        await asyncio.to_thread(made.prepare)
        return made

    async def run(self, episodes: list[Episode], trace_file: Path, concurrency: int) -> list[dict[str, Any]]:
        """The run's episodes, at most `concurrency` at once, each trace appended to `trace_file` as it ends."""
        assert self.rollouts is not None, "prepare() first"
        return await run_episodes(self.rollouts, episodes, trace_file, concurrency)


@contextlib.asynccontextmanager
async def local_placement(
    settings: RunConfig,
    model: str,
    engine: str,
    *,
    harnesses: list[str] | None = None,
    engine_options: dict[str, Any] | None = None,
    say: Say = _silent,
    verbose: bool = False,
    online: dict[str, Any] | None = None,
    export: Export | None = None,
) -> AsyncIterator[LocalPlacement]:
    """Start the engine and proxy for `settings` (its engine_options, proxy, rollout and verifier) with `model` and
    `engine` (the run's, or one of several: `hrl eval` serves each model in turn); on exit end every open session and stop them. The HTTP control routes stay closed (no
    control token): hrl drives the proxy in process, and a white-box agent opens its sub-agents with its own
    session's agent key. `harnesses` is accepted for the placements' common signature. `online`: an online run
    (`hrl train --serve`): {host, port, control_token, clients}, the proxy on that address with its control routes
    open to the control token and its client routes to the run's client keys (`hrl.runners.online`). `export`: where
    each trace the rollouts write also goes (the run's OTLP exporter's `export_written`)."""
    options = settings.engine_options if engine_options is None else engine_options
    async with serving(
        model, engine, engine_options=options, proxy_options=settings.proxy_options(),
        say=say, **(online or {}),
    ) as stack:  # fmt: skip
        placement = LocalPlacement(stack, settings, say, verbose, export)
        try:
            yield placement
        finally:  # the rollouts' sandbox pools: what they still hold is closed before the stack goes
            for made in placement.made:
                await made.close()


def run_serving(main: Any) -> Any:
    """Run a serving coroutine to its end on the proxy's event loop (uvloop where enabled)."""
    from hrl.runners.serving.loop import run

    return run(main)
