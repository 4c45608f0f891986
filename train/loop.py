"""The synchronous loop: roll out a batch (tasks × group size) → verify → samples → update → publish → repeat.

Readable top to bottom: `train()` is the whole algorithm; rollouts are whatever implements `Rollouts` (agent
CLIs in sandboxes for real runs). Every iteration commits its state only after the new weights are saved and
published, so `--resume` after a crash re-runs only the episodes whose traces are missing and publishes the
same next version.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from hrl.runners.engines.base import Engine
from hrl.runners.trace import read_traces
from hrl.train.advantages import AdvantageKind, group_advantages
from hrl.train.rundir import RunDir
from hrl.train.samples import build_samples
from hrl.train.trainer import Trainer, TrainerConfig

__all__ = ["Episode", "LoopConfig", "Rollouts", "run_episodes", "train", "update_from_traces"]

Event = Callable[[str, dict[str, Any]], None]


class LoopConfig(BaseModel):
    iterations: int = Field(10, description="Training steps (one batch of rollouts each).")
    tasks_per_iteration: int = Field(4, description="Distinct tasks per batch.")
    group_size: int = Field(4, description="Episodes per task per batch (the GRPO group).")
    concurrency: int = Field(4, description="Episodes running at once.")
    advantage: AdvantageKind = "grpo"
    drop_zero_variance: bool = Field(False, description="Skip groups whose rewards all agree.")
    include_side_calls: bool = Field(False, description="Train on side calls (title generation, …) too.")
    seed: int = 0
    trainer: TrainerConfig


@dataclass(frozen=True)
class Episode:
    task: dict[str, Any]
    index: int  # k within the group
    iteration: int

    @property
    def task_id(self) -> str:
        return str(self.task.get("instance_id") or self.task.get("task_id") or self.task.get("id"))

    @property
    def group_id(self) -> str:
        return f"it{self.iteration}:{self.task_id}"

    @property
    def key(self) -> str:
        return f"{self.group_id}#{self.index}"


class Rollouts(Protocol):
    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        """Run one episode to exactly one trace (appended to trace_file when it ends) and return that trace.
        Failures are data (the trace's failure_reason); only cancellation propagates."""
        ...


async def run_episodes(rollouts: Rollouts, episodes: list[Episode], trace_file: Path, concurrency: int) -> list[Any]:
    """Run episodes with at most `concurrency` at once."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(ep: Episode) -> dict[str, Any]:
        async with sem:
            return await rollouts.episode(ep, trace_file)

    return list(await asyncio.gather(*[one(ep) for ep in episodes]))


def _batch(tasks: list[dict[str, Any]], cfg: LoopConfig, iteration: int) -> list[Episode]:
    rng = random.Random(cfg.seed * 100_003 + iteration)
    picked = rng.sample(tasks, min(cfg.tasks_per_iteration, len(tasks)))
    return [Episode(t, k, iteration) for t in picked for k in range(cfg.group_size)]


def _done(trace_file: Path) -> list[dict[str, Any]]:
    return list(read_traces(trace_file)) if trace_file.is_file() else []


async def train(
    tasks: list[dict[str, Any]],
    cfg: LoopConfig,
    run: RunDir,
    engine: Engine,
    rollouts: Rollouts,
    on_event: Event = lambda kind, data: None,
) -> list[dict[str, Any]]:
    """Run (or resume) the loop; returns the metrics of the steps this call ran."""
    state = run.state()
    trainer = await asyncio.to_thread(Trainer, cfg.trainer)
    kind = cfg.trainer.mode
    if state["checkpoint"]:  # resume: same weights in trainer and engine, same version numbering
        await asyncio.to_thread(trainer.load, state["checkpoint"])
        await engine.publish(state["checkpoint"], kind, version=state["version"])
        on_event("resumed", state)
    version, history = state["version"], []
    for it in range(state["iteration"], cfg.iterations):
        t0 = time.monotonic()
        episodes = _batch(tasks, cfg, it)
        trace_file = run.trace_file(it)
        done = {t.get("metadata", {}).get("episode") for t in _done(trace_file)}
        todo = [e for e in episodes if e.key not in done]
        on_event("rollout", {"iteration": it, "episodes": len(episodes), "resumed": len(episodes) - len(todo)})
        await run_episodes(rollouts, todo, trace_file, cfg.concurrency)
        traces = [t for t in _done(trace_file) if t.get("metadata", {}).get("episode") in {e.key for e in episodes}]
        t1 = time.monotonic()
        metrics = await asyncio.to_thread(update_from_traces, trainer, traces, cfg)
        t2 = time.monotonic()
        path = str(await asyncio.to_thread(trainer.save, run.checkpoint(version + 1)))
        version = await engine.publish(path, kind, version=version + 1)
        run.save_state(it + 1, version, path)
        metrics.update(
            {
                "step": it,
                "version": version,
                "time/rollout_s": t1 - t0,
                "time/train_s": t2 - t1,
                "time/publish_s": time.monotonic() - t2,
            }
        )
        run.log_metrics(metrics)
        history.append(metrics)
        on_event("step", metrics)
    return history


def update_from_traces(trainer: Trainer, traces: list[dict[str, Any]], cfg: LoopConfig) -> dict[str, Any]:
    rewards = {t["trace_id"]: float(t.get("reward") or 0.0) for t in traces}
    groups = {t["trace_id"]: str(t.get("group_id")) for t in traces}
    usable = {tid for tid, t in ((t["trace_id"], t) for t in traces) if t.get("failure_reason") in (None, "agent_exit")}
    adv, adv_metrics = group_advantages(
        {k: v for k, v in rewards.items() if k in usable},
        groups,
        cfg.advantage,
        drop_zero_variance=cfg.drop_zero_variance,
    )
    samples = []
    for t in traces:
        if t["trace_id"] in adv:
            for s in build_samples(t, cfg.include_side_calls):
                s.advantage = adv[t["trace_id"]]
                samples.append(s)
    metrics: dict[str, Any] = {
        "trace/count": len(traces),
        "trace/reward": sum(rewards.values()) / max(len(rewards), 1),
        **{f"trace/failures/{k}": v for k, v in Counter(t.get("failure_reason") or "none" for t in traces).items()},
        **adv_metrics,
    }
    metrics.update(trainer.step(samples))
    return metrics
