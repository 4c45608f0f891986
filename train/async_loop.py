"""Asynchronous RL: a producer keeps M episodes in flight; the trainer takes the next N finished traces (whole
GRPO groups only), updates and publishes while rollouts go on.

- Weight updates go through the publisher (the proxy), so agents never see them: new requests wait inside the
  proxy, and in-flight generations follow the proxy's version policy (`mixed` or `pin`).
- `max_staleness` (in versions): a sampled token older than `version - max_staleness` at the time it would be
  trained on is stale. `staleness: mask` (the default) takes only the stale tokens out of the loss (counted:
  `async/masked_tokens`) and trains the rest of the trace, with its group whole and its advantage as it was; `drop`
  drops, and counts (`async/dropped_stale`), every trace with a stale token, so its group trains short
  (`async/stale_groups`). A trace whose every sampled token is stale is dropped either way. Nothing is dropped
  silently. Long episodes span the most publishes, so staleness hits them hardest: each step counts it per bucket of
  LLM calls per trace (`staleness_by_calls`).
- Pacing (`pace`, on by default): no new group starts while the oldest episode in flight started (was admitted)
  more than `max_staleness` versions before the trainer's version. The trainer then runs out of batches and waits
  for that episode instead of running ahead of it on short ones: without pacing a long episode among short ones
  grows stale without bound (one version per batch the short ones fill); with it, its lag stays within
  `max_staleness` + the batches that work admitted before the hold can fill. Admission is the only lever the loop
  has (the trainer takes whole groups as they complete); a rule on the trainer's side, waiting for a given group,
  would idle it while finished groups wait. The hold is timed (`async/paced_s`). It cannot deadlock: it holds only
  while an episode is in flight, holding starts nothing new, and every episode ends (time budget, failure trace,
  cancellation); with nothing in flight the producer is the unpaced one, which `check_batch_fits` shows always fills
  a batch. The trainer's version does not move while it waits for a batch, so no wait is on both sides. An episode
  that never ends (`rollout.time_budget_s` 0 and a hung agent) holds new groups with it.
- Backpressure: no new groups start while `max_buffered` finished traces wait for the trainer. So the buffer must
  hold a whole batch (`check_batch_fits`, before anything starts): with less, a batch can wait forever.
- A step that trained on nothing (every advantage zero, every trace filtered out) publishes nothing: the version
  stays, `train/empty` says so and `train/empty_steps` counts them.
- A producer that raises (not an episode: those end as traces) stops the run with its error, never a silent wait.
- Traces go to the run directory's per-step files, like the synchronous loop's: an episode's trace is appended to
  `traces/iter-NNNN.jsonl` of the step whose batch was being gathered when the episode started. A resumed run
  starts new groups (numbered past every group in the run's traces); unfinished groups of the killed process
  are left untrained.
- `train.task_sampler=signal` draws each new group's task by the signal weights of the traces finished so far
  (rebuilt from the run's traces on resume); groups are drawn one at a time, so a task may recur within a batch.
  `balanced` takes the strata of `train.sampler_key` in turn, by group number, as the sync loop does.
- Held-out evaluation (`eval_tasks`, `hrl.train.heldout`): the whole set before the first rollout and after the last
  step (no training episode runs then), and with `train.eval_every` the slice at each such step k, beside the
  training rollouts: its episodes are pinned to version k (the policy of step k), so none mixes versions while
  step k trains and publishes k+1. A LoRA publish keeps version k loaded beside k+1; a full-weight publish, which
  replaces the weights, waits for the evaluation to end. Its row is logged before step k's.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

from hrl.config import AsyncConfig, check_batch_fits
from hrl.runners.errors import HrlError
from hrl.runners.rollouts.episodes import Episode, Rollouts, failed_trace, guarded_episode, harness_for
from hrl.runners.rundir import RunDir
from hrl.runners.trace import write_trace
from hrl.train.distill import Teacher, start_teacher
from hrl.train.heldout import Evaluations
from hrl.train.loop import LoopConfig, sampler_metrics
from hrl.train.sampler import Strata, TaskStats
from hrl.train.sinks import MetricsSink
from hrl.train.staleness import age, select_fresh, stale_groups, staleness_by_calls
from hrl.train.step import (
    Event,
    Publisher,
    check_batch,
    commit,
    on_trainer_thread,
    publish_checkpoint,
    save_checkpoint,
    start_trainer,
    unpublished,
    update,
)
from hrl.train.trainer import Trainer

__all__ = ["AsyncConfig", "Producer", "check_batch_fits", "train_async"]


def _next_group(run: RunDir) -> int:
    """The first group number no trace of the run used (group ids are `it<n>:<task>`)."""
    used = [int(m.group(1)) for t in run.all_traces() if (m := re.match(r"it(\d+):", str(t.get("group_id"))))]
    return max(used, default=-1) + 1


class Producer(Protocol):
    """Where the loop's finished traces come from: the episodes it starts itself (`_Producer`), or an online run's
    clients (`hrl.train.online.ExternalProducer`). Every producer subclasses it: `advantages`, `policy_ready` and
    `metrics` have defaults."""

    running: set[Any]  # episodes in flight
    dropped: set[str]  # groups that can never complete
    dropped_traces: int  # their traces, counted, not trained
    started: int
    stats: TaskStats
    advantages: Any = None  # what replaces the groups' advantages (`update`); None: the groups'

    def buffered(self) -> int: ...

    async def loop(self) -> None:
        """Produce for as long as the run lasts."""
        ...

    async def take(self, n: int) -> list[dict[str, Any]]:
        """Wait for ≥ n finished traces, in whole groups, and take them."""
        ...

    async def stop(self) -> None: ...

    def policy_ready(self) -> None:
        """The trainer published the run's policy (once, before the first step); nothing to do by default."""
        return

    def published(self, version: int) -> None:
        """The trainer's version is `version` (at the start, then after each step); nothing to do by default."""
        return

    def metrics(self, trained: list[dict[str, Any]]) -> dict[str, float]:
        """Its own metrics of a step that trained on `trained`; none by default."""
        return {}


class _Producer(Producer):
    """Launches whole groups while there is room (and pacing lets it: the module docstring); collects finished
    traces into complete groups."""

    def __init__(
        self, tasks: list[dict[str, Any]], cfg: LoopConfig, acfg: AsyncConfig, rollouts: Rollouts, run: RunDir
    ):
        self.cfg, self.acfg, self.rollouts, self.run = cfg, acfg, rollouts, run
        rng = random.Random(cfg.seed)
        first = _next_group(run)  # a resumed run goes on with new groups
        self.tasks, self.stats = tasks, TaskStats(cfg.success_reward, tasks, cfg.sampler_key)
        if cfg.task_sampler == "signal":
            self.stats.observe(run.all_traces())
        self.strata = Strata(tasks, cfg.sampler_key) if cfg.task_sampler == "balanced" else None
        self._groups = (
            Episode.group(t, cfg.group_size, n, harness_for(rollouts, n))
            for n in itertools.count()
            for t in [self._pick(rng, n)]
            if n >= first
        )
        self.running: set[asyncio.Task[dict[str, Any]]] = set()
        self._episodes: dict[asyncio.Task[dict[str, Any]], Episode] = {}
        self._admitted: dict[asyncio.Task[dict[str, Any]], int] = {}  # the trainer's version when each started
        self.version = 0  # the trainer's (`published`)
        self._held_since: float | None = None  # pacing holds a group that has room since then
        self._paced_s = self._paced_total = 0.0  # held seconds: since the last step's metrics, over the run
        self.dropped: set[str] = set()  # groups that can never complete: their traces are not trained, but counted
        self.dropped_traces = 0
        self.errors: list[str] = []
        self.failure: BaseException | None = None  # the producer itself raised: take() raises it
        self.partial: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.ready: list[list[dict[str, Any]]] = []
        self.changed = asyncio.Event()
        self.started = self.finished = 0
        self._files: dict[asyncio.Task[dict[str, Any]], Any] = {}  # each episode's trace file
        self._began: set[asyncio.Task[Any] | None] = set()  # episodes whose coroutine ran (`_run`)
        self.step = run.state()["iteration"]  # the step whose batch is being gathered: new episodes trace there

    def _pick(self, rng: random.Random, group: int) -> Any:
        if self.strata is not None:  # by (seed, group number) alone: a resumed run draws the same
            return self.strata.pick(self.cfg.seed, group)
        if self.cfg.task_sampler == "signal":
            return rng.choices(self.tasks, self.stats.weights(self.tasks, self.cfg.group_size))[0]
        return rng.choice(self.tasks)

    def buffered(self) -> int:
        return sum(len(g) for g in self.ready) + sum(len(g) for g in self.partial.values())

    async def loop(self) -> None:
        """Start groups while there is room, for as long as the run lasts; an error here ends the run (take)."""
        try:
            await self._start_groups()
        except Exception as e:
            self._fail(e)

    def published(self, version: int) -> None:
        self.version = version
        self.changed.set()  # pacing may hold from now on: its clock starts now

    def _room(self) -> bool:
        """Whether max_in_flight and max_buffered leave room for a group."""
        in_flight = len(self.running) + self.cfg.group_size <= max(self.acfg.max_in_flight, self.cfg.group_size)
        return in_flight and self.buffered() < self.acfg.max_buffered

    def _paced(self) -> bool:
        """Whether pacing holds new groups: the oldest episode in flight started more than max_staleness versions
        before the trainer's version (never with nothing in flight)."""
        oldest = min(self._admitted.values(), default=None)
        return self.acfg.pace and oldest is not None and self.version - oldest > self.acfg.max_staleness

    async def _start_groups(self) -> None:
        while True:
            while self._room() and not self._paced():
                trace_file = self.run.trace_file(self.step)
                for ep in next(self._groups):
                    task = asyncio.create_task(self._run(ep, trace_file))
                    self._episodes[task], self._admitted[task] = ep, self.version
                    self._files[task] = trace_file
                    task.add_done_callback(self._done)
                    self.running.add(task)
                    self.started += 1
            self._hold(self._room())  # room left here: pacing holds it
            self.changed.clear()
            await self.changed.wait()

    async def _run(self, ep: Episode, trace_file: Any) -> dict[str, Any]:
        """The episode, marked as begun: a task cancelled before its first step never reaches the runner, which
        writes the `cancelled` trace of an episode it ran, so `stop` writes that one's."""
        self._began.add(asyncio.current_task())
        return await guarded_episode(self.rollouts, ep, trace_file)

    def _hold(self, held: bool) -> None:
        """Time the pacing hold: it starts when a group that has room is held, ends when none is."""
        now = time.monotonic()
        if held and self._held_since is None:
            self._held_since = now
        elif not held and self._held_since is not None:
            self._paced_s += now - self._held_since
            self._held_since = None

    def metrics(self, trained: list[dict[str, Any]]) -> dict[str, float]:
        """`async/paced_s`: seconds since the last step's metrics that pacing held a group there was room for (a
        hold still on is counted up to now); `async/paced_s_total`: over this process's run."""
        if self._held_since is not None:
            now = time.monotonic()
            self._paced_s, self._held_since = self._paced_s + now - self._held_since, now
        paced, self._paced_s = self._paced_s, 0.0
        self._paced_total += paced
        return {"async/paced_s": paced, "async/paced_s_total": self._paced_total}

    def _fail(self, error: BaseException) -> None:
        self.failure = self.failure or error
        self.changed.set()

    def _done(self, task: asyncio.Task[dict[str, Any]]) -> None:
        """A finished episode's trace into its group. A callback's exception would only be logged, its trace lost
        and the trainer left waiting: it ends the run instead."""
        try:
            self._collect(task)
        except Exception as e:
            self._fail(e)

    def _collect(self, task: asyncio.Task[dict[str, Any]]) -> None:
        self.running.discard(task)
        ep = self._episodes.pop(task)
        self._admitted.pop(task, None)
        self._files.pop(task, None)
        if task.cancelled():
            self.changed.set()
            return
        error = task.exception()
        if error is not None:  # not even a trace (writing the internal_error trace failed): drop its group, counted
            self.errors.append(f"{ep.key}: {type(error).__name__}: {error}")
            self.dropped.add(ep.group_id)
            self.dropped_traces += len(self.partial.pop(ep.group_id, []))
            self.changed.set()
            return
        trace = task.result()
        self.finished += 1
        self.stats.observe([trace])
        if str(trace.get("group_id")) in self.dropped:
            self.dropped_traces += 1
            self.changed.set()
            return
        group = self.partial[str(trace.get("group_id"))]
        group.append(trace)
        if len(group) == self.cfg.group_size:
            self.ready.append(self.partial.pop(str(trace.get("group_id"))))
        self.changed.set()

    async def take(self, n: int) -> list[dict[str, Any]]:
        """Wait for ≥ n traces in complete groups; take whole groups, oldest first."""
        self._raise_failure()
        while sum(len(g) for g in self.ready) < n:
            self._raise_failure()
            if len(self.dropped) > self.acfg.max_failed_groups:
                raise RuntimeError(f"{len(self.dropped)} groups could not complete (last: {self.errors[-1]})")
            self.changed.clear()
            await self.changed.wait()
        out: list[dict[str, Any]] = []
        while self.ready and len(out) < n:
            out += self.ready.pop(0)
        self.step += 1  # episodes started from now on belong to the next batch
        self.changed.set()  # room for more episodes
        return out

    def _raise_failure(self) -> None:
        """The producer's error as the run's: an hrl error as it is (its hint, its exit code), else one naming the
        producer and the exception, the traceback kept as its cause."""
        if isinstance(self.failure, HrlError):
            raise self.failure
        if self.failure is not None:
            raise HrlError(
                f"the async rollout producer stopped: {type(self.failure).__name__}: {self.failure}",
                hint="re-run with HRL_DEBUG=1 for the producer's traceback",
            ) from self.failure

    async def stop(self) -> None:
        """Cancel what runs; every started episode ends as one trace, one that never began too."""
        never = [(self._episodes[t], self._files[t]) for t in self.running if t not in self._began]
        for t in list(self.running):
            t.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
        for ep, trace_file in never:
            trace = failed_trace(ep, "cancelled", "cancelled before it started", time.time())
            await asyncio.to_thread(write_trace, trace_file, trace, self.rollouts.export)


async def train_async(
    tasks: list[dict[str, Any]],
    cfg: LoopConfig,
    acfg: AsyncConfig,
    run: RunDir,
    publisher: Publisher,
    rollouts: Rollouts,
    on_event: Event = lambda kind, data: None,
    eval_tasks: list[dict[str, Any]] | None = None,
    producer: Producer | None = None,
) -> list[dict[str, Any]]:
    """Run `cfg.iterations` updates asynchronously, publishing through `publisher` (the proxy, so agents never see
    an update). `eval_tasks`: held-out tasks, evaluated before the first update, after the last, and every
    `eval_every` steps between, each evaluation pinned to the version of its step (the module docstring).
    `producer`: where finished traces come from, in place of episodes this loop starts (an online run's
    `hrl.train.online.ExternalProducer`: its `metrics()` join each step's, its `advantages` replace the groups')."""
    check_batch_fits(acfg, cfg.group_size)  # before the trainer is built: a batch that can never fill is refused
    trainer, state = await start_trainer(cfg, run, publisher, on_event)
    teacher = await on_trainer_thread(start_teacher, cfg, trainer)  # None without distill.teacher
    if producer is not None:  # the run's policy is the engine's now (a resumed run's published)
        producer.policy_ready()  # an online run serves again
    history: list[dict[str, Any]] = []
    sink = MetricsSink(run.path, wandb=cfg.wandb, config=cfg.model_dump(), on_event=on_event)
    evals = Evaluations(eval_tasks, cfg, run, rollouts)
    try:
        await evals.at(0, state["version"], sink, on_event)  # before any rollout of the run
    except BaseException:
        sink.close()
        raise
    own_episodes = producer is None
    producer = producer or _Producer(tasks, cfg, acfg, rollouts, run)
    producer.published(state["version"])
    feeder = asyncio.create_task(producer.loop())
    steps = _Steps(tasks, cfg, acfg, run, publisher, trainer, producer, sink, evals, on_event, state["version"],
                   own_episodes, teacher)  # fmt: skip
    publisher.take_cpu_per_token()  # sets the mark: each step reports its own window
    try:
        for step in range(state["iteration"], cfg.iterations):
            metrics, path = await steps.run_step(step)
            commit(run, sink, metrics, path)
            history.append(metrics)
            on_event("step", metrics)
        feeder.cancel()
        await producer.stop()  # no training episode runs while the final policy is evaluated
        await evals.at(cfg.iterations, steps.version, sink, on_event)
    finally:
        await steps.cancel_eval()
        sink.close()
        feeder.cancel()
        await producer.stop()
        await on_trainer_thread(trainer.close)  # the other ranks of trainer.nproc > 1
    return history


@dataclass
class _Steps:
    """The steps of `train_async`: each takes a batch of finished traces, trains on the fresh ones, saves and
    publishes. Carries the trainer's version, the evaluation running beside the rollouts, and the run's totals."""

    tasks: list[dict[str, Any]]
    cfg: LoopConfig
    acfg: AsyncConfig
    run: RunDir
    publisher: Publisher
    trainer: Trainer
    producer: Producer  # a `_Producer`, or an online run's ExternalProducer
    sink: MetricsSink
    evals: Evaluations
    on_event: Event
    version: int
    own_episodes: bool  # False: an online run's clients come and go, one client's failures do not stop the run
    teacher: Teacher | None = None  # distill.teacher: it prefills each batch while the producer's episodes go on
    held: asyncio.Task[Any] | None = None  # the evaluation of this step, running beside its rollouts
    dropped_total: int = 0
    masked_total: int = 0
    t_start: float = field(default_factory=time.monotonic)

    async def run_step(self, step: int) -> tuple[dict[str, Any], str]:
        """One step; its metrics and checkpoint path (a step that trained on nothing: the run's last)."""
        t0 = time.monotonic()
        if self.evals.due(step):  # pinned to `version`: the publish below never reaches its episodes
            self.held = asyncio.create_task(self.evals.at(step, self.version, self.sink, self.on_event))
        batch = await self.producer.take(self.acfg.batch_traces)
        if self.own_episodes:
            check_batch(batch, str(self.run.path))
        t1 = time.monotonic()
        fresh, stale_before = select_fresh(batch, self.version, self.acfg)
        self.dropped_total += len(batch) - len(fresh)
        advantages = self.producer.advantages
        metrics = await update(
            self.trainer, fresh, self.cfg, self.version, stale_before, advantages, self.teacher
        ) | sampler_metrics(self.cfg, self.tasks, self.producer.stats)
        self.masked_total += int(metrics.setdefault("async/masked_tokens", 0.0))
        staleness = max((age(t, self.version) for t in fresh), default=0)
        published, path = await self._publish(bool(metrics["train/empty"]))
        metrics |= published
        if self.held is not None:  # its row (step `step`) is logged before this step's
            await self.held  # an evaluation that raised ends the run with its error
            self.held = None
        self.version = metrics["version"]
        self.producer.published(self.version)
        metrics |= self._totals(step, batch, fresh, staleness, t0, t1)
        metrics |= staleness_by_calls(batch, fresh, stale_before, self.cfg.include_side_calls)
        metrics |= self.producer.metrics(fresh)
        return metrics, path

    async def _publish(self, empty: bool) -> tuple[dict[str, Any], str]:
        """Save and publish version + 1: its metrics and checkpoint path. A step that trained on nothing publishes
        nothing (the weights are still `version`'s, its checkpoint the run's last)."""
        if empty:
            path = self.run.state()["checkpoint"]
            return unpublished(self.publisher, self.version), path
        path = await save_checkpoint(self.trainer, self.run, self.version + 1)
        if self.held is not None and self.cfg.trainer.mode != "lora":  # new full weights would replace the eval's
            await self.held
        return await publish_checkpoint(self.publisher, path, self.cfg.trainer.mode, self.version + 1), path

    def _totals(
        self, step: int, batch: list[dict[str, Any]], fresh: list[dict[str, Any]], staleness: int, t0: float, t1: float
    ) -> dict[str, Any]:
        """The step's `async/*` and `time/*` metrics: what staleness dropped, the producer's state, the times (`t0`:
        the step's start, `t1`: its batch's arrival)."""
        return {
            "step": step,
            "async/dropped_stale": len(batch) - len(fresh),
            "async/dropped_stale_total": self.dropped_total,
            "async/stale_groups": stale_groups(batch, fresh),
            "async/masked_tokens_total": self.masked_total,
            "async/in_flight": len(self.producer.running),
            "async/buffered": self.producer.buffered(),
            "async/started": self.producer.started,
            "async/dropped_groups": len(self.producer.dropped),
            "async/dropped_traces": self.producer.dropped_traces,
            "trace/staleness/max": staleness,
            "time/wait_s": t1 - t0,
            "time/step_s": time.monotonic() - t0,
            "time/elapsed_s": time.monotonic() - self.t_start,
        }

    async def cancel_eval(self) -> None:
        """Cancel the evaluation running beside the rollouts, if any (the run is ending)."""
        if self.held is not None:
            self.held.cancel()
            await asyncio.gather(self.held, return_exceptions=True)
