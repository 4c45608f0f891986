"""A training step once its traces are in, the same in both loops (`loop.train`, `async_loop.train_async`):
update the trainer, save the new weights, publish them, then log and commit the step. The order is the resume
contract: state.json moves past a step only after its weights are saved and published and its metrics line is
written."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from hrl.config import LoopConfig
from hrl.runners.durable import write_atomically
from hrl.runners.engines.base import Engine
from hrl.runners.errors import BatchFailedError, HrlError
from hrl.runners.metrics import step_metrics
from hrl.runners.models import resolve_model
from hrl.runners.rundir import RunDir
from hrl.runners.trace import dropped_media, image_calls, is_infra_failure
from hrl.train.advantages import group_advantages
from hrl.train.credit import credit_turns
from hrl.train.device import release_free_memory
from hrl.train.distill import Teacher, distill
from hrl.train.group import make_trainer
from hrl.train.media import unusable_images
from hrl.train.offload import OffloadPlan, resolve_offload
from hrl.train.samples import RETAINED_TOKEN_RATIO, build_samples, mask_stale, retained_tokens
from hrl.train.sinks import MetricsSink
from hrl.train.trainer import Trainer, TrainerConfig
from hrl.train.weight_sync import ipc_updates

__all__ = [
    "Event",
    "Publisher",
    "attach_ipc_weights",
    "check_batch",
    "commit",
    "off_policy",
    "offload_plan",
    "on_trainer_thread",
    "publish_checkpoint",
    "restore_dropped_weights",
    "save_checkpoint",
    "sleep",
    "start_trainer",
    "trainable",
    "trained_nothing",
    "unpublished",
    "update",
    "update_from_traces",
    "wake",
]


_TRAINER_THREAD: ThreadPoolExecutor | None = None


async def on_trainer_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` off the event loop, always on the process's one trainer thread. glibc gives each thread that
    allocates its own malloc arena and keeps what is freed there: an update run on whichever thread `to_thread`
    picks left one update's peak behind in each (a 135M model's LoRA steps took a run from 7 to 21 GiB resident in
    nine steps, until the OOM killer ended it). One thread reuses one arena; what a step freed goes back to the OS."""
    global _TRAINER_THREAD
    if _TRAINER_THREAD is None:
        _TRAINER_THREAD = ThreadPoolExecutor(1, thread_name_prefix="hrl-trainer")
    ctx = contextvars.copy_context()

    def run() -> Any:
        try:
            return ctx.run(fn, *args)
        finally:
            release_free_memory()

    return await asyncio.get_running_loop().run_in_executor(_TRAINER_THREAD, run)


Event = Callable[[str, dict[str, Any]], None]
_log = logging.getLogger(__name__)
_logged: set[str] = set()  # reasons image traces were left out, each logged once per process


class Publisher(Protocol):
    """What the loops use of whatever publishes new weights: the proxy in front of the engine (`Proxy`: agents
    never see an update), or the Ray driver's `ShardedPublisher`. `keep_media` has a default, which another
    publisher (a test's) inherits by subclassing this."""

    engine: Engine  # the engine the weights reach (its sleep mode, IPC weights, `last_publish_tier`: `Engine`'s)
    # the proxy's counters: `proxy/pause_s` (total time publishes held requests) and `proxy/queue_depth` (most
    # requests waiting at once; the loop resets it after each step). {} where no proxy counts them
    stats: dict[str, float]

    async def publish(self, path: str, kind: Any, version: int | None = None) -> int: ...

    def take_cpu_per_token(self) -> float | None:
        """`proxy/cpu_us_per_token` since the previous call; None on the first call, without streamed tokens, or
        where no proxy runs in this process."""
        ...

    def keep_media(self, folder: str | Path) -> None:
        """Keep the run's images' bytes in `folder`, where training reads them; nowhere by default."""
        return


async def start_trainer(
    cfg: LoopConfig, run: RunDir, publisher: Publisher, on_event: Event
) -> tuple[Trainer, dict[str, Any]]:
    """A trainer for the run; on resume, the same weights in trainer and engine under the same version number,
    and no metrics line of a step that was logged but not committed (it runs again)."""
    state = run.state()
    run.discard_uncommitted_metrics()
    engine = publisher.engine
    if engine.sleep_level == 2 and cfg.trainer.mode == "lora":  # vLLM only
        raise HrlError("engine_options.sleep_level=2 drops vLLM's base weights, and a LoRA publish does not bring "
                       "them back", hint="use -c engine_options.sleep_level=1 with LoRA (2 is for full training)")  # fmt: skip
    engine.check_publish(cfg.trainer.mode)  # vLLM: the server serves the publish routes
    if cfg.trainer.offload == "all" and _ipc_weights(engine, cfg.trainer, cuda=cfg.trainer.device != "cpu"):
        raise HrlError("trainer.offload=all moves the weights to CPU memory, but engine_options.weight_sync=ipc "
                       "publishes them from the trainer's GPU memory",
                       hint="use -c trainer.offload=optimizer (or auto), or -c engine_options.weight_sync=disk")  # fmt: skip
    placement = getattr(publisher, "placement", None)  # a Ray placement's: placement.trainer=ray, ranks as actors
    if placement is not None and placement.trainer == "ray":
        from hrl.train.ray_group import RayTrainerGroup

        trainer = await on_trainer_thread(RayTrainerGroup, cfg.trainer, placement)
    else:
        trainer = await on_trainer_thread(make_trainer, cfg.trainer)
    if (record := getattr(publisher, "placement_record", None)) is not None:  # where each piece of the run is
        ranks = getattr(trainer, "ranks", None)
        write_atomically(run.path / "placement.json", json.dumps(record(ranks, cfg.trainer.nproc), indent=1) + "\n")
    trainer.media_dir = run.traces / "media"  # images' bytes, where the proxy keeps them for this run
    publisher.keep_media(trainer.media_dir)
    attach_ipc_weights(engine, trainer, cfg.trainer)
    if state["checkpoint"]:
        await on_trainer_thread(trainer.load, state["checkpoint"])
        await publisher.publish(state["checkpoint"], cfg.trainer.mode, state["version"])
    if state["checkpoint"] or state["iteration"]:  # a resumed run (its steps so far may have published nothing)
        on_event("resumed", state)
    await on_trainer_thread(trainer.offload, offload_plan(engine, trainer))  # the first rollouts run beside it
    return trainer, state


def attach_ipc_weights(engine: Engine, trainer: Any, tcfg: TrainerConfig) -> None:
    """weight_sync=ipc on the engine: a full publish takes the weights straight from the trainer's GPU memory (one
    trainer process on CUDA); anything else keeps the disk reload (an engine without IPC weights takes none)."""
    if tcfg.mode == "full" and tcfg.nproc == 1 and trainer.device.type == "cuda":
        engine.attach_weights(lambda bucket_bytes: ipc_updates(trainer.named_weights(), bucket_bytes))


def _ipc_weights(engine: Engine, tcfg: TrainerConfig, cuda: bool) -> bool:
    """Whether full publishes read the trainer's weights on its GPU (attach_ipc_weights's conditions)."""
    return engine.weight_sync == "ipc" and tcfg.mode == "full" and tcfg.nproc == 1 and cuda


def offload_plan(engine: Engine, trainer: Trainer) -> OffloadPlan:
    """`trainer.offload` for this engine and trainer (the rule: `hrl.train.offload.resolve_offload`)."""
    tcfg, cuda = trainer.config, trainer.device.type == "cuda"
    return resolve_offload(tcfg.offload, tcfg.mode, engine.sleep_level, ipc=_ipc_weights(engine, tcfg, cuda),
                           cuda=cuda, nproc=tcfg.nproc)  # fmt: skip


async def sleep(publisher: Publisher, trainer: Trainer) -> None:
    """Colocated layout: the engine frees the GPU for the update (a no-op for engines without a sleep mode), then
    the trainer brings back what it offloaded for the rollouts."""
    await publisher.engine.sleep()
    await on_trainer_thread(trainer.onload)


async def wake(publisher: Publisher, trainer: Trainer) -> dict[str, float]:
    """Before the engine wakes for rollouts, the trainer moves out what `trainer.offload` names and frees its cached
    GPU memory, so the engine finds its share free; `offload/gib` and `offload/seconds` when anything moved."""
    moved = await on_trainer_thread(trainer.offload, offload_plan(publisher.engine, trainer))
    await publisher.engine.wake_up()
    return moved


def check_batch(traces: list[dict[str, Any]], where: str) -> None:
    """Raise BatchFailedError when every episode of a batch failed in the infrastructure (`no_llm_calls`: the agent
    ended before its first model call; a sandbox, engine or verifier error), naming the reasons and the first
    episode's cause (the agent's last stderr lines). Cancelled episodes (Ctrl-C) are no such failure."""
    from collections import Counter

    from hrl.runners.summary import failure_cause

    failed = [t for t in traces if is_infra_failure(t) and t.get("failure_reason") != "cancelled"]
    if not traces or len(failed) < len(traces):
        return
    counts = ", ".join(f"{k} {v}" for k, v in sorted(Counter(str(t["failure_reason"]) for t in failed).items()))
    raise BatchFailedError(
        f"all {len(traces)} episodes of the batch failed before the policy could be trained ({counts}); the first: "
        f"{failure_cause(failed[0])}",
        hint=f"`hrl inspect {where} --json` shows each episode's metadata; one episode alone: `hrl rollout --limit 1`",
    )


def trainable(trace: dict[str, Any], keep_dropped_media: bool = False) -> bool:
    """Traces with a real score: the agent's own failures (exit, timeout, crash, overflow) keep their reward and
    are trained on; infrastructure failures (no reward) are not, nor, unless `keep_dropped_media`, a trace whose
    requests lost media to `proxy.media: drop` (the model answered without seeing it). A trace whose prompts held
    images is trained with their pixels, unless the trainer cannot use them (`update_from_traces`)."""
    media_ok = keep_dropped_media or not dropped_media(trace)
    return trace.get("reward") is not None and not is_infra_failure(trace) and media_ok


def _unseen_images(trainer: Trainer, traces: list[dict[str, Any]]) -> set[str]:
    """Traces whose images the trainer cannot use (`hrl.train.media.unusable_images`): left out, counted as
    `train/image_traces`, each reason logged once."""
    out = set()
    for t in traces:
        if image_calls(t) and (why := unusable_images(t, trainer.takes_images, trainer.media_dir)):
            out.add(t["trace_id"])
            if why not in _logged:
                _logged.add(why)
                _log.warning("traces with images left out of training: %s", why)
    return out


def update_from_traces(
    trainer: Trainer,
    traces: list[dict[str, Any]],
    cfg: LoopConfig,
    stale_before: int | None = None,
    advantages: Any = None,
    teacher: Teacher | None = None,
) -> dict[str, Any]:
    """Advantages per group, branch samples, one trainer step. Returns the step's advantage and train metrics,
    `train/lr` (the learning rate of this step) among them. `stale_before`: tokens sampled by an older version leave
    the loss (`mask_stale`, counted as `async/masked_tokens`), after the retained-token check, which stays a check of
    tokenization alone; advantages are the traces' own, as without it. A trace an online run trains off-policy (its
    reward came late: `online.late_reward: off_policy`) keeps its stale tokens. `advantages`: (rewards, groups) →
    (advantages, metrics) in place of the per-group ones (an online run's `lone_advantages`). `teacher`: the run's
    (`hrl.train.distill.start_teacher`), whose per-token term is added to the samples' advantages, with its
    `distill/*` metrics and `time/distill_s`. `train.credit: turn` adds each turn's credit on top (`credit/*`)."""
    unseen = _unseen_images(trainer, traces)
    rewards = {t["trace_id"]: float(t["reward"]) for t in traces
               if trainable(t, cfg.keep_dropped_media) and t["trace_id"] not in unseen}  # fmt: skip
    groups = {t["trace_id"]: str(t.get("group_id")) for t in traces}
    if advantages is not None:
        adv, adv_metrics = advantages(rewards, groups)
    else:
        adv, adv_metrics = group_advantages(rewards, groups, cfg.advantage, drop_zero_variance=cfg.drop_zero_variance)
    samples, trained, sampled, masked, by_trace = [], 0, 0, 0, []
    for t in traces:
        if t["trace_id"] in adv:
            mine = build_samples(t, cfg.include_side_calls, trainer.media_dir)
            kept, total = retained_tokens(t, mine, cfg.include_side_calls)
            trained, sampled = trained + kept, sampled + total
            if stale_before is not None and not off_policy(t):
                masked += mask_stale(t, mine, stale_before)
            for s in mine:
                s.advantage = adv[t["trace_id"]]
            samples += mine
            by_trace.append((t, mine))
    distilled = distill(samples, teacher, cfg.distill.coef) if teacher is not None else {}
    # after distillation, which sets the dense term: turn credit adds to it
    credit = credit_turns(by_trace, cfg.credit_coef, cfg.include_side_calls) if cfg.credit == "turn" else {}
    infra = float(sum(is_infra_failure(t) for t in traces))  # left out of training, counted
    images = float(len(unseen))  # left out: images the trainer cannot use (no vision tower, bytes missing)
    media = float(sum(trainable(t, keep_dropped_media=True) and t["trace_id"] not in rewards
                      and t["trace_id"] not in unseen for t in traces))  # fmt: skip
    signal = adv_metrics["adv/groups"] - adv_metrics["adv/zero_variance_groups"]
    lr = trainer.lr_info()  # read before the step: the rate the step uses
    return {**adv_metrics, "train/groups_with_signal": signal / max(adv_metrics["adv/groups"], 1.0),
            "train/trained_traces": float(len(rewards)), "train/infra_failures": infra,
            "train/dropped_media": media,  # left out for media the proxy dropped (0 with train.keep_dropped_media)
            "train/image_traces": images,
            **({RETAINED_TOKEN_RATIO: trained / sampled} if sampled else {}), **lr,
            **({"async/masked_tokens": float(masked)} if stale_before is not None else {}), **distilled, **credit,
            **trainer.step(samples, cfg.ppo_epochs, cfg.mini_batches)}  # fmt: skip


def trained_nothing(metrics: dict[str, Any]) -> bool:
    """Whether an update left the weights as they were: no sample with a loss token (every trace filtered out), or
    every advantage zero (the trainer skipped its optimizer step). Such a step has nothing to save or publish."""
    return not metrics.get("train/samples") or bool(metrics.get("train/skipped"))


def off_policy(trace: dict[str, Any]) -> bool:
    """A trace an online run trains although its reward came late (`online.late_reward: off_policy`)."""
    return bool(((trace.get("metadata") or {}).get("online") or {}).get("off_policy"))


async def update(
    trainer: Trainer,
    traces: list[dict[str, Any]],
    cfg: LoopConfig,
    version: int,
    stale_before: int | None = None,
    advantages: Any = None,
    teacher: Teacher | None = None,
) -> dict[str, Any]:
    """One update on the traces (off the event loop), with their trace metrics; `version`: the trainer's now;
    `stale_before` and `teacher`: as in `update_from_traces`. `train/empty` = 1 when it trained on nothing (`trained_nothing`): the
    loops then neither save nor publish."""
    metrics = await on_trainer_thread(update_from_traces, trainer, traces, cfg, stale_before, advantages, teacher)
    return metrics | step_metrics(traces, trainer_version=version) | {"train/empty": float(trained_nothing(metrics))}


async def save_checkpoint(trainer: Trainer, run: RunDir, version: int) -> str:
    """Save the weights (and optimizer state) as the run's checkpoint of `version`; its path."""
    return str(await on_trainer_thread(trainer.save, run.checkpoint(version)))


async def publish_checkpoint(publisher: Publisher, path: str, kind: str, version: int) -> dict[str, Any]:
    """Publish a saved checkpoint as `version` and measure it: the published `version`, `publish/seconds`,
    `publish/bytes` (its weight files), `publish/tier` (how the weights reached the engine: lora-adapter,
    disk-reload, …) and the proxy's `proxy/pause_s`, `proxy/queue_depth` and `proxy/cpu_us_per_token` of the step."""
    stats = publisher.stats
    pause0, t0 = stats.get("proxy/pause_s", 0.0), time.monotonic()
    new = await publisher.publish(path, kind, version=version)
    seconds = time.monotonic() - t0
    tier = publisher.engine.last_publish_tier or "unknown"  # engines may leave it unnamed
    nbytes = await asyncio.to_thread(_weight_bytes, Path(path))
    return {
        "version": new,
        "proxy/pause_s": float(stats.get("proxy/pause_s", 0.0) - pause0),
        **_proxy_window(publisher),
        "publish/seconds": seconds,
        "publish/bytes": nbytes,
        "publish/tier": tier,
        **_fanout(publisher),
    }


def _fanout(publisher: Publisher) -> dict[str, float]:
    """On several replicas (a Ray placement): `publish/replicas_acked` and `publish/replicas_fenced`, and with
    `placement.weights: ship` `publish/shipped_bytes` and `publish/ship_failed` (replicas the files did not reach)."""
    report = getattr(publisher, "last_fanout", None)
    if not isinstance(report, dict) or report.get("step") != "publish":
        return {}
    out = {
        "publish/replicas_acked": float(len(report["acked"])),
        "publish/replicas_fenced": float(len(report["failed"])),
    }
    if shipped := report.get("shipped"):
        out |= {"publish/shipped_bytes": float(shipped["bytes"]), "publish/ship_failed": float(len(shipped["failed"]))}
    return out


async def restore_dropped_weights(publisher: Publisher, path: str) -> None:
    """A step that publishes nothing after vLLM slept at level 2 (its weights dropped): load the live version's
    weights (`path`: the last checkpoint, or the base model) back, so the next rollouts have a model to run."""
    engine = publisher.engine
    if engine.sleep_level == 2:
        await engine.restore(resolve_model(path))


def unpublished(publisher: Publisher, version: int) -> dict[str, Any]:
    """What a step that trained on nothing reports in place of a publish: the unchanged `version`, and the proxy's
    counters of its window (as a publish would: each step reports its own)."""
    return {"version": version, "proxy/pause_s": 0.0, **_proxy_window(publisher)}


def _proxy_window(publisher: Publisher) -> dict[str, float]:
    """`proxy/queue_depth`, `proxy/cpu_us_per_token` and, behind engine replicas, `routing/*` (moves, per-replica
    prefix-cache hit rate: `ReplicaSet.take_stats`) since the previous step; each starts a new window."""
    stats = publisher.stats
    depth, stats["proxy/queue_depth"] = stats.get("proxy/queue_depth", 0.0), 0.0  # this step's, then reset
    cpu = publisher.take_cpu_per_token()
    return {"proxy/queue_depth": float(depth), **({} if cpu is None else {"proxy/cpu_us_per_token": cpu}),
            **publisher.engine.take_stats()}  # fmt: skip


def commit(run: RunDir, sink: MetricsSink, metrics: dict[str, Any], path: str) -> None:
    """Log the step's metrics line, then commit the step (state.json): a step is never committed without its
    line, and a line past the commit point is dropped on resume. `train/empty_steps`: the run's steps so far that
    trained on nothing (counted from the committed lines, so a resume goes on counting)."""
    before = sum(bool(m.get("train/empty")) for k, m in run.metric_rows().items() if k < metrics["step"])
    metrics["train/empty_steps"] = float(before + bool(metrics.get("train/empty")))
    sink.log(metrics, step=metrics["step"])
    run.save_state(metrics["step"] + 1, metrics["version"], path)


def _weight_bytes(path: Path) -> float:
    files = [f for f in path.iterdir() if f.suffix in {".safetensors", ".bin"}] if path.is_dir() else []
    return float(sum(f.stat().st_size for f in files))
