"""The synchronous loop: roll out a batch (tasks × group size) → verify → samples → update → publish → repeat.

Readable top to bottom: `train()` is the whole algorithm; rollouts are whatever implements `Rollouts` (agent
CLIs in sandboxes for real runs); update, save, publish and commit are `hrl.train.step`'s, shared with the async
loop. Every iteration commits its state only after the new weights are saved, published and its metrics logged,
so `--resume` after a crash (even `kill -9`) re-runs only the episodes whose traces are missing, logs each step
once and publishes the same next version.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field, model_validator

from hrl.runners.episodes import Episode, Rollouts, harness_for, run_episodes
from hrl.runners.rundir import RunDir
from hrl.train.advantages import AdvantageKind
from hrl.train.heldout import Evaluations
from hrl.train.offload import PhasePeaks
from hrl.train.sampler import SamplerKind, Strata, TaskStats, entropy, task_id, weighted_sample
from hrl.train.sinks import MetricsSink
from hrl.train.step import (
    Event,
    Publisher,
    check_batch,
    commit,
    publish_checkpoint,
    restore_dropped_weights,
    save_checkpoint,
    sleep,
    start_trainer,
    unpublished,
    update,
    wake,
)
from hrl.train.trainer import Trainer, TrainerConfig

__all__ = ["Episode", "LoopConfig", "Rollouts", "run_episodes", "train"]


class LoopConfig(BaseModel):
    iterations: int = Field(10, ge=1, description="Training steps (one batch of rollouts each).")
    tasks_per_iteration: int = Field(4, ge=1, description="Distinct tasks per batch.")
    group_size: int = Field(4, ge=1, description="Episodes per task per batch (the GRPO group).")
    concurrency: int = Field(4, ge=1, description="Episodes running at once.")
    advantage: AdvantageKind = Field(
        "grpo",
        description="grpo: (r − mean) / std per group. mean: r − mean. dr_grpo: r − mean with the loss ÷ a constant "
        "(Dr. GRPO); sets trainer.loss_norm=constant. batch: (r − mean) / std over the whole batch (REINFORCE++): "
        "a group that all failed is pushed down when another succeeded.",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch (PPO epochs); > 1 reuses the rollouts.")
    mini_batches: int = Field(
        1,
        ge=1,
        description="Optimizer steps per epoch, each on a share of the batch's traces. ppo_epochs × mini_batches > 1: "
        "the ratio to the update's starting policy moves, so PPO clipping acts.",
    )
    drop_zero_variance: bool = Field(False, description="Skip groups whose rewards all agree.")
    task_sampler: SamplerKind = Field(
        "uniform",
        description="Which tasks a batch takes. uniform: any task alike. signal: weighted by 1 − p^G − (1 − p)^G, "
        "the chance that a group of G carries a gradient, p = the task's success rate so far (Beta(1, 1) prior). "
        "balanced: the values of sampler_key in turn, each an equal share of the groups.",
    )
    sampler_key: str = Field(
        "",
        description="A task field (dotted path, e.g. repo, or demo.op). signal: its tasks share one success count; "
        "with many tasks each is drawn too rarely for a count of its own ('' = per task). balanced: the families "
        "taken in turn (required).",
    )
    success_reward: float = Field(
        1.0, description="A reward ≥ this is a success, for task_sampler=signal's rates and eval/success."
    )
    eval_every: int = Field(
        0,
        ge=0,
        description="With eval_tasks: also evaluate every N steps, on eval_slice of them (the whole set is "
        "evaluated at step 0 and after the last step either way; in an async run, beside the rollouts, pinned to the "
        "step's version). 0 = only then.",
    )
    eval_slice: int = Field(8, ge=1, description="Held-out tasks of an evaluation between the first and the last.")
    eval_episodes: int = Field(1, ge=1, description="Episodes per held-out task in an evaluation.")
    eval_markers: dict[str, str] = Field(
        default_factory=dict,
        description="With eval_tasks: {name: text}. Each evaluation also logs eval/has/<name>, the share of episodes "
        "whose sampled text contains the text, and eval/success_given/<name>, the success rate among those "
        "(the demo: in_place = 'sed -i', the fix written in place; success among them = the right operator).",
    )
    include_side_calls: bool = Field(False, description="Train on side calls (title generation, …) too.")
    keep_dropped_media: bool = Field(
        False,
        description="Train on traces whose requests lost media to proxy.media: drop (the model answered without "
        "seeing an image or document the agent sent). Default: left out, counted per step as train/dropped_media.",
    )
    seed: int = 0
    wandb: bool = Field(False, description="Also log metrics to Weights & Biases.")
    trainer: TrainerConfig

    def group(self, task: Any, batch: int, harness: str = "") -> list[Episode]:
        """One GRPO group: `group_size` episodes of `task` in `batch` (the sync loop's iteration, the async loop's
        group number), under `harness`. Both loops make their groups here, and only here."""
        return [Episode(task, k, batch, harness) for k in range(self.group_size)]

    @model_validator(mode="after")
    def _balanced_needs_a_key(self) -> LoopConfig:
        if self.task_sampler == "balanced" and not self.sampler_key:
            raise ValueError("train.task_sampler=balanced takes turns over a task field: set train.sampler_key")
        return self

    @model_validator(mode="after")
    def _dr_grpo_normalises_by_a_constant(self) -> LoopConfig:
        """Dr. GRPO is both halves: no std scaling (the advantage) and the constant normaliser (the trainer's)."""
        if self.advantage != "dr_grpo" or self.trainer.loss_norm == "constant":
            return self
        if "loss_norm" in self.trainer.model_fields_set:
            raise ValueError(
                "train.advantage=dr_grpo normalises the loss by a constant, but trainer.loss_norm=trace was set: "
                "drop trainer.loss_norm, or use train.advantage=mean for r − mean with the per-trace token mean"
            )
        self.trainer = self.trainer.model_copy(update={"loss_norm": "constant"})
        return self


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
    return [ep for j, t in enumerate(picked) for ep in cfg.group(t, iteration, harness_for(rollouts, first + j))]


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
    version, history = state["version"], []
    evals = Evaluations(eval_tasks, cfg, run, rollouts)
    stats = sampler_stats(cfg, run, state["iteration"], tasks)  # rebuilt from the committed steps on resume
    publisher.take_cpu_per_token()  # sets the mark: each step reports its own window
    try:
        with MetricsSink(run.path, wandb=cfg.wandb, config=cfg.model_dump(), on_event=on_event) as sink:
            for it in range(state["iteration"], cfg.iterations):
                await evals.at(it, version, sink, on_event)  # the policy this step's rollouts use
                metrics, path = await _iteration(
                    it, tasks, cfg, run, publisher, rollouts, trainer, version, on_event, stats
                )
                version = metrics["version"]
                commit(run, sink, metrics, path)
                if cfg.task_sampler == "signal":
                    stats.observe(run.iteration_traces(it))  # what a resume rebuilds: the committed step's traces
                history.append(metrics)
                on_event("step", metrics)
            await evals.at(cfg.iterations, version, sink, on_event)  # the policy the run ends with
    finally:
        await asyncio.to_thread(trainer.close)  # the other ranks of trainer.nproc > 1
    return history


async def _iteration(
    it: int, tasks: list[dict[str, Any]], cfg: LoopConfig, run: RunDir, publisher: Publisher, rollouts: Rollouts,
    trainer: Trainer, version: int, on_event: Event, stats: TaskStats,
) -> tuple[dict[str, Any], str]:  # fmt: skip
    """One batch: roll out what is missing, update, save, publish; the step's metrics and checkpoint path. A step
    that trained on nothing saves and publishes nothing: its checkpoint is the run's last, its version unchanged."""
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
    metrics = await update(trainer, traces, cfg, version)
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
