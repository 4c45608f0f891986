"""The synchronous loop: roll out a batch (tasks × group size) → verify → samples → update → publish → repeat.

Readable top to bottom: `train()` is the whole algorithm; rollouts are whatever implements `Rollouts` (agent
CLIs in sandboxes for real runs); update, save, publish and commit are `hrl.train.step`'s, shared with the async
loop. Every iteration commits its state only after the new weights are saved, published and its metrics logged,
so `--resume` after a crash (even `kill -9`) re-runs only the episodes whose traces are missing, logs each step
once and publishes the same next version.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from hrl.config import LoopConfig
from hrl.runners.rollouts.episodes import Episode, Rollouts, harness_for, run_episodes
from hrl.runners.rundir import RunDir
from hrl.train.distill import Teacher, start_teacher
from hrl.train.heldout import Evaluations
from hrl.train.offload import PhasePeaks
from hrl.train.sampler import Strata, TaskStats, entropy, task_id, weighted_sample
from hrl.train.sinks import MetricsSink
from hrl.train.step import (
    Event,
    Publisher,
    check_batch,
    commit,
    on_trainer_thread,
    publish_checkpoint,
    restore_dropped_weights,
    save_checkpoint,
    sleep,
    start_trainer,
    unpublished,
    update,
    wake,
)
from hrl.train.trainer import Trainer

__all__ = ["Episode", "LoopConfig", "Rollouts", "run_episodes", "train"]


def _batch(
    tasks: list[dict[str, Any]], cfg: LoopConfig, iteration: int, stats: TaskStats | None = None, rollouts: Any = None
) -> list[Episode]:
    """The iteration's episodes: distinct tasks drawn by (seed, iteration), × the group size. `signal` weighs them
    by `stats`, the counts of the steps before this one; `balanced` takes `sampler_key`'s strata in turn. With
    several harnesses, each group runs under one of them, in turn (`harness_for`)."""
    rng = random.Random(cfg.seed * 100_003 + iteration)
    n = min(cfg.tasks_per_iteration, len(tasks))
    first = iteration * n  # the run's number of the batch's first group
    if cfg.task_sampler == "signal":
        picked = weighted_sample(tasks, (stats or TaskStats()).weights(tasks, cfg.group_size), n, rng)
    elif cfg.task_sampler == "balanced":
        strata, picked = Strata(tasks, cfg.sampler_key), []
        for g in range(first, first + n):
            picked.append(strata.pick(cfg.seed, g, [task_id(t) for t in picked]))
    else:
        picked = rng.sample(tasks, n)
    return [
        ep
        for j, t in enumerate(picked)
        for ep in Episode.group(t, cfg.group_size, iteration, harness_for(rollouts, first + j))
    ]


def sampler_stats(cfg: LoopConfig, run: RunDir, upto: int, tasks: Sequence[Any]) -> TaskStats:
    """The success counts of the committed steps before `upto`, per `cfg.sampler_key` family (only `signal` reads
    them)."""
    stats = TaskStats(cfg.success_reward, tasks, cfg.sampler_key)
    if cfg.task_sampler == "signal":
        for it in range(upto):
            stats.observe(run.iteration_traces(it))
    return stats


def sampler_metrics(cfg: LoopConfig, tasks: list[Any], stats: TaskStats) -> dict[str, float]:
    """`train/sampler_entropy` (1 = uniform) and `train/sampler_max_share`, the likeliest task's share."""
    w = stats.weights(tasks, cfg.group_size) if cfg.task_sampler == "signal" else [1.0] * len(tasks)
    return {"train/sampler_entropy": entropy(w), "train/sampler_max_share": max(w, default=0.0) / (sum(w) or 1.0)}


async def train(
    tasks: list[dict[str, Any]],
    cfg: LoopConfig,
    run: RunDir,
    publisher: Publisher,
    rollouts: Rollouts,
    on_event: Event = lambda kind, data: None,
    eval_tasks: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume) the loop; returns the metrics of the steps this call ran. `eval_tasks`: held-out tasks,
    evaluated as `hrl.train.heldout` says."""
    trainer, state = await start_trainer(cfg, run, publisher, on_event)
    teacher = await on_trainer_thread(start_teacher, cfg, trainer)  # None without distill.teacher
    version, history = state["version"], []
    evals = Evaluations(eval_tasks, cfg, run, rollouts)
    stats = sampler_stats(cfg, run, state["iteration"], tasks)  # rebuilt from the committed steps on resume
    publisher.take_cpu_per_token()  # sets the mark: each step reports its own window
    try:
        with MetricsSink(run.path, wandb=cfg.wandb, config=cfg.model_dump(), on_event=on_event) as sink:
            for it in range(state["iteration"], cfg.iterations):
                await evals.at(it, version, sink, on_event)  # the policy this step's rollouts use
                if it == cfg.iterations - 1:  # the last batch and the final evaluation: no sandbox made past them
                    rollouts.expect(cfg.tasks_per_iteration * cfg.group_size + evals.episodes_at(cfg.iterations))
                metrics, path = await _iteration(
                    it, tasks, cfg, run, publisher, rollouts, trainer, version, on_event, stats, teacher
                )
                version = metrics["version"]
                commit(run, sink, metrics, path)
                if cfg.task_sampler == "signal":
                    stats.observe(run.iteration_traces(it))  # what a resume rebuilds: the committed step's traces
                history.append(metrics)
                on_event("step", metrics)
            await evals.at(cfg.iterations, version, sink, on_event)  # the policy the run ends with
    finally:
        await on_trainer_thread(trainer.close)  # the other ranks of trainer.nproc > 1
    return history


async def _iteration(
    it: int, tasks: list[dict[str, Any]], cfg: LoopConfig, run: RunDir, publisher: Publisher, rollouts: Rollouts,
    trainer: Trainer, version: int, on_event: Event, stats: TaskStats, teacher: Teacher | None = None,
) -> tuple[dict[str, Any], str]:  # fmt: skip
    """One batch: roll out what is missing, update, save, publish; the step's metrics and checkpoint path. A step
    that trained on nothing saves and publishes nothing: its checkpoint is the run's last, its version unchanged.
    With a `teacher`, it prefills the batch's samples after the rollouts end, before the update (`time/distill_s`,
    within `time/train_s`)."""
    t0, peaks = time.monotonic(), PhasePeaks(trainer.device)  # mem/peak_gib/<phase> on a GPU
    peaks.start()
    episodes = _batch(tasks, cfg, it, stats, rollouts)
    sampled = sampler_metrics(cfg, tasks, stats)
    rerun = run.set_aside_cancelled(it)  # episodes a Ctrl-C cut short run again
    done = {t.get("metadata", {}).get("episode") for t in run.iteration_traces(it)}
    todo = [e for e in episodes if e.key not in done]
    on_event("rollout", {"iteration": it, "episodes": len(episodes), "resumed": len(episodes) - len(todo),
                         "rerun": rerun})  # fmt: skip
    await run_episodes(rollouts, todo, run.trace_file(it), cfg.concurrency)
    keys = {e.key for e in episodes}
    traces = [t for t in run.iteration_traces(it) if t.get("metadata", {}).get("episode") in keys]
    check_batch(traces, str(run.path))  # nothing the policy did: the run stops, naming why
    t1, mem = time.monotonic(), peaks.end("rollout")
    await sleep(publisher, trainer)  # colocated: vLLM frees the GPU, the trainer takes back what it offloaded
    metrics = await update(trainer, traces, cfg, version, teacher=teacher)
    t2 = time.monotonic()
    empty = bool(metrics["train/empty"])  # trained on nothing: the weights are still `version`'s, kept as they are
    path = run.state()["checkpoint"] if empty else await save_checkpoint(trainer, run, version + 1)
    offloaded = await wake(publisher, trainer)  # the trainer offloads, then vLLM wakes
    mem |= peaks.end("update") | offloaded
    if empty:
        await restore_dropped_weights(publisher, path or cfg.trainer.model)
        published = unpublished(publisher, version)
    else:
        published = await publish_checkpoint(publisher, path, cfg.trainer.mode, version + 1)
    mem |= peaks.end("publish")
    return metrics | sampled | mem | {
        "step": it,
        **published,
        "time/rollout_s": t1 - t0,
        "time/train_s": t2 - t1,
        "time/publish_s": time.monotonic() - t2,
    }, path
