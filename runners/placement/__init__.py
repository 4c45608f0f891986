"""Where a run stands: `placed` starts what a run needs (engine, proxy, rollouts, the control token) from the
resolved recipe, in this process (`local`) or on a Ray cluster (`ray`: engine replicas, a node agent with a
proxy shard per node). `hrl rollout`, `hrl train` and `hrl eval` stand runs up only through here.

Either placement yields an object with `rollouts` (the `Rollouts` protocol) and `publisher` (pause, publish,
resume: the proxy here, a `ShardedPublisher` on Ray). Ray is imported only under `placement.ray*`, and only there.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from hrl.config import PlacementConfig, RunConfig
from hrl.runners.placement.local import LocalPlacement, local_placement, run_serving
from hrl.runners.proxy.server import check_port_free
from hrl.runners.rollouts.episodes import Episode
from hrl.runners.serving.standalone import (
    default_control_token_file,
    default_engine,
    serve,
    serve_alone,
    serve_workers,
    write_control_token,
)
from hrl.runners.telemetry.otlp import exporting

__all__ = [
    "Episode",
    "LocalPlacement",
    "PlacementConfig",
    "RunConfig",
    "check_port_free",
    "default_control_token_file",
    "default_engine",
    "engine_version",
    "local_placement",
    "placed",
    "run_serving",
    "serve",
    "serve_alone",
    "serve_workers",
    "write_control_token",
]  # fmt: skip


def engine_version(here: Any) -> int:
    """The policy version the placement's engine serves now, for live status."""
    return here.publisher.engine.version  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def placed(
    settings: RunConfig,
    model: str,
    engine: str,
    concurrency: int,
    *,
    on_event: Callable[[str, dict[str, Any]], None] = lambda kind, data: None,
    say: Callable[[str], object] = lambda _: None,
    verbose: bool = False,
) -> AsyncIterator[Any]:
    """`run` stood up where its `placement:` section says, its rollouts prepared; stopped on exit. `model` and
    `engine` are the run's after the flags (`model` resolved to a path). With a `telemetry:` endpoint every trace
    the rollouts write is also sent over OTLP (runners/telemetry/otlp.py), flushed when the run stops."""
    provider = "openai-compatible" if "://" in engine else engine  # gen_ai.provider.name: what served the calls
    with exporting(settings.telemetry, run_id=settings.rollout.run_id, provider=provider, say=say) as exporter:
        export = exporter.export_written if exporter is not None else None
        if settings.placement.kind == "ray":
            from hrl.runners.placement.ray import ray_placement

            async with ray_placement(settings, model, engine, concurrency, on_event, say, export) as on_ray:
                yield on_ray
            return
        async with local_placement(settings, model, engine, say=say, verbose=verbose, export=export) as here:
            await here.prepare(on_event)
            yield here
