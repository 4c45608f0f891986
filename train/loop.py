"""The synchronous loop: roll out a batch (tasks × group size) → verify → samples → update → publish → repeat.

Readable top to bottom: `train()` is the whole algorithm; rollouts are whatever implements `Rollouts` (agent
CLIs in sandboxes for real runs). Every iteration commits its state only after the new weights are saved,
published and its metrics logged, so `--resume` after a crash (even `kill -9`) re-runs only the episodes whose
traces are missing, logs each step once and publishes the same next version.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field, model_validator

from hrl.runners.episodes import Episode, Rollouts, harness_for, run_episodes
from hrl.runners.errors import HrlError
from hrl.runners.metrics import step_metrics
from hrl.runners.rundir import RunDir
from hrl.runners.trace import is_infra_failure
from hrl.train.advantages import AdvantageKind, group_advantages
from hrl.train.group import make_trainer
from hrl.train.heldout import Evaluations
from hrl.train.sampler import SamplerKind, Strata, TaskStats, entropy, task_id, weighted_sample
from hrl.train.samples import RETAINED_TOKEN_RATIO, build_samples, retained_tokens
from hrl.train.sinks import MetricsSink
from hrl.train.trainer import Trainer, TrainerConfig
from hrl.train.weight_sync import ipc_update_info

__all__ = ["Episode", "LoopConfig", "Rollouts", "run_episodes", "train", "update_from_traces"]

Event = Callable[[str, dict[str, Any]], None]


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
        "evaluated at step 0 and after the last step either way; sync loop only). 0 = only then.",
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
    seed: int = 0
    wandb: bool = Field(False, description="Also log metrics to Weights & Biases.")
    trainer: TrainerConfig

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


class Publisher(Protocol):
    """The engine, or better the proxy in front of it (so agents never see the update)."""

    async def publish(self, path: str, kind: Any, version: int | None = None) -> int: ...


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
        Episode(t, k, iteration, harness_for(rollouts, first + j))
        for j, t in enumerate(picked)
        for k in range(cfg.group_size)
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


async def start_trainer(cfg: LoopConfig, run: RunDir, publish: Any, on_event: Event) -> tuple[Trainer, dict[str, Any]]:
    """A trainer for the run; on resume, the same weights in trainer and engine under the same version number,
    and no metrics line of a step that was logged but not committed (it runs again)."""
    state = run.state()
    run.discard_uncommitted_metrics()
    engine = _engine(getattr(publish, "__self__", None))
    if getattr(getattr(engine, "config", None), "sleep_level", 0) == 2 and cfg.trainer.mode == "lora":
        raise HrlError("engine_options.sleep_level=2 drops vLLM's base weights, and a LoRA publish does not bring "
                       "them back", hint="use -c engine_options.sleep_level=1 with LoRA (2 is for full training)")  # fmt: skip
    trainer = await asyncio.to_thread(make_trainer, cfg.trainer)
    attach_ipc_weights(engine, trainer, cfg.trainer)
    if state["checkpoint"]:
        await asyncio.to_thread(trainer.load, state["checkpoint"])
        await publish(state["checkpoint"], cfg.trainer.mode, state["version"])
        on_event("resumed", state)
    return trainer, state


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
    trainer, state = await start_trainer(cfg, run, publisher.publish, on_event)
    version, history = state["version"], []
    evals = Evaluations(eval_tasks, cfg, run, rollouts)
    stats = sampler_stats(cfg, run, state["iteration"], tasks)  # rebuilt from the committed steps on resume
    _cpu_per_token(publisher)  # sets the mark: each step reports its own window
    try:
        with MetricsSink(run.path, wandb=cfg.wandb, config=cfg.model_dump(), on_event=on_event) as sink:
            for it in range(state["iteration"], cfg.iterations):
                await evals.at(it, version, sink, on_event)  # the policy this step's rollouts use
                metrics, path = await _iteration(
                    it, tasks, cfg, run, publisher, rollouts, trainer, version, on_event, stats
                )
                version = metrics["version"]
                sink.log(metrics, step=it)  # before the commit: a step is never committed without its line
                run.save_state(it + 1, version, path)
                if cfg.task_sampler == "signal":
                    stats.observe(run.iteration_traces(it))  # what a resume rebuilds: the committed step's traces
                history.append(metrics)
                on_event("step", metrics)
            await evals.at(cfg.iterations, version, sink, on_event)  # the policy the run ends with
    finally:
        await asyncio.to_thread(getattr(trainer, "close", lambda: None))  # the other ranks of trainer.nproc > 1
    return history


async def _iteration(
    it: int, tasks: list[dict[str, Any]], cfg: LoopConfig, run: RunDir, publisher: Publisher, rollouts: Rollouts,
    trainer: Any, version: int, on_event: Event, stats: TaskStats,
) -> tuple[dict[str, Any], str]:  # fmt: skip
    """One batch: roll out what is missing, update, save, publish; the step's metrics and checkpoint path."""
    t0 = time.monotonic()
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
    t1 = time.monotonic()
    await sleep(publisher)  # colocated: vLLM frees the GPU for the update
    metrics = await asyncio.to_thread(update_from_traces, trainer, traces, cfg)
    metrics |= step_metrics(traces, trainer_version=version)
    t2 = time.monotonic()
    pause0 = _pause_s(publisher)
    path = str(await asyncio.to_thread(trainer.save, run.checkpoint(version + 1)))
    await wake(publisher)
    version, pub = await publish_logged(publisher.publish, path, cfg.trainer.mode, version + 1)
    return metrics | sampled | {
        "step": it,
        "version": version,
        "proxy/pause_s": _pause_s(publisher) - pause0,
        "proxy/queue_depth": _take_queue_depth(publisher),
        **_cpu_per_token(publisher),
        "time/rollout_s": t1 - t0,
        "time/train_s": t2 - t1,
        "time/publish_s": time.monotonic() - t2,
        **pub,
    }, path


def attach_ipc_weights(engine: Any, trainer: Any, tcfg: TrainerConfig) -> None:
    """weight_sync=ipc on the engine: a full publish takes the weights straight from the trainer's GPU memory (one
    trainer process on CUDA); anything else keeps the disk reload."""
    attach = getattr(engine, "attach_weights", None)
    if callable(attach) and tcfg.mode == "full" and tcfg.nproc == 1 and trainer.device.type == "cuda":
        attach(lambda: ipc_update_info(trainer.named_weights()))


def _engine(publisher: Any) -> Any:
    """The engine behind a publisher (the proxy's, or the publisher itself)."""
    return getattr(publisher, "engine", publisher)


async def sleep(publisher: Any) -> None:
    """Colocated layout: the engine frees the GPU for the update (engines without a sleep mode have no `sleep`)."""
    if callable(fn := getattr(_engine(publisher), "sleep", None)):
        await fn()


async def wake(publisher: Any) -> None:
    if callable(fn := getattr(_engine(publisher), "wake_up", None)):
        await fn()


async def publish_logged(publish: Any, path: str, kind: str, version: int) -> tuple[int, dict[str, Any]]:
    """Publish and measure it: `publish/seconds`, `publish/bytes` (the checkpoint's weight files) and
    `publish/tier`, how the weights reached the engine (lora-adapter, disk-reload, …)."""
    t0 = time.monotonic()
    new = await publish(path, kind, version=version)
    seconds = time.monotonic() - t0
    tier = getattr(_engine(getattr(publish, "__self__", None)), "last_publish_tier", "") or "unknown"
    nbytes = await asyncio.to_thread(_weight_bytes, Path(path))
    return new, {"publish/seconds": seconds, "publish/bytes": nbytes, "publish/tier": tier}


def _weight_bytes(path: Path) -> float:
    files = [f for f in path.iterdir() if f.suffix in {".safetensors", ".bin"}] if path.is_dir() else []
    return float(sum(f.stat().st_size for f in files))


def _pause_s(publisher: Any) -> float:
    return float(getattr(publisher, "stats", {}).get("proxy/pause_s", 0.0))


def _cpu_per_token(publisher: Any) -> dict[str, float]:
    """`proxy/cpu_us_per_token` since the last call, when the publisher is a proxy that streamed tokens."""
    take = getattr(publisher, "take_cpu_per_token", None)
    value = take() if take is not None else None
    return {} if value is None else {"proxy/cpu_us_per_token": value}


def _take_queue_depth(publisher: Any) -> float:
    """Most requests that waited at once during this step's publish (then reset for the next step)."""
    stats = getattr(publisher, "stats", None)
    if not stats:
        return 0.0
    depth, stats["proxy/queue_depth"] = stats.get("proxy/queue_depth", 0.0), 0.0
    return float(depth)


def trainable(trace: dict[str, Any]) -> bool:
    """Traces with a real score: the agent's own failures (exit, timeout, crash, overflow) keep their reward and
    are trained on; infrastructure failures (no reward) are not."""
    return trace.get("reward") is not None and not is_infra_failure(trace)


def update_from_traces(trainer: Trainer, traces: list[dict[str, Any]], cfg: LoopConfig) -> dict[str, Any]:
    """Advantages per group, branch samples, one trainer step. Returns the step's advantage and train metrics."""
    rewards = {t["trace_id"]: float(t["reward"]) for t in traces if trainable(t)}
    groups = {t["trace_id"]: str(t.get("group_id")) for t in traces}
    adv, adv_metrics = group_advantages(
        rewards,
        groups,
        cfg.advantage,
        drop_zero_variance=cfg.drop_zero_variance,
    )
    samples, trained, sampled = [], 0, 0
    for t in traces:
        if t["trace_id"] in adv:
            mine = build_samples(t, cfg.include_side_calls)
            kept, total = retained_tokens(t, mine, cfg.include_side_calls)
            trained, sampled = trained + kept, sampled + total
            for s in mine:
                s.advantage = adv[t["trace_id"]]
            samples += mine
    infra = float(sum(is_infra_failure(t) for t in traces))  # left out of training, counted
    signal = adv_metrics["adv/groups"] - adv_metrics["adv/zero_variance_groups"]
    return {**adv_metrics, "train/groups_with_signal": signal / max(adv_metrics["adv/groups"], 1.0),
            "train/trained_traces": float(len(rewards)), "train/infra_failures": infra,
            **({RETAINED_TOKEN_RATIO: trained / sampled} if sampled else {}),
            **trainer.step(samples, cfg.ppo_epochs, cfg.mini_batches)}  # fmt: skip
