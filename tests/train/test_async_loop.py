"""Asynchronous training through the real proxy and engine: whole groups, staleness bound, one trace per episode."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.runners.engines.base import Engine
from hrl.runners.errors import HrlError, UsageError
from hrl.runners.rollouts.episodes import Rollouts
from hrl.runners.rollouts.simagent import SimulatedAgent
from hrl.runners.rundir import RunDir
from hrl.runners.serving.stack import serving
from hrl.train.async_loop import AsyncConfig, check_batch_fits, train_async
from hrl.train.loop import LoopConfig
from hrl.train.staleness import oldest_version
from hrl.train.step import Publisher
from hrl.train.trainer import TrainerConfig

TASKS = [{"instance_id": f"t{i}", "problem_statement": p} for i, p in enumerate(["fix it", "run tests", "ls"])]


async def _run(model: str, run: RunDir, cfg: LoopConfig, acfg: AsyncConfig, policy: str):
    opts = {"engine_options": {"dtype": "float32"}, "proxy_options": {"version_policy": policy}}
    async with serving(model, **opts) as stack:
        agent = SimulatedAgent(stack.proxy, stack.url, min_turns=1, max_turns=6, tool_time_median_s=0.05)
        try:
            return await train_async(TASKS, cfg, acfg, run, stack.proxy, agent)
        finally:
            await agent.close()


def _published(history: list[dict], start: int = 0) -> list[int]:
    """The version after each step: one more after each step that trained, the same after one that trained on
    nothing (`train/empty`: every group's rewards agreed)."""
    return list(itertools.accumulate((int(not m["train/empty"]) for m in history), initial=start))[1:]


def _check(tmp_path, tiny_model, policy: str, sampler: str = "uniform") -> None:
    run = RunDir(tmp_path / policy)
    cfg = LoopConfig(iterations=4, group_size=2, task_sampler=sampler, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    acfg = AsyncConfig(max_in_flight=6, batch_traces=4, max_staleness=0, max_buffered=8, staleness="drop")
    run.create(cfg.model_dump())
    history = asyncio.run(_run(tiny_model, run, cfg, acfg, policy))
    assert [m["version"] for m in history] == _published(history)
    traces = run.all_traces()
    assert set(run.trace_files()) <= set(range(5))  # one file per step, as the sync loop writes (4: after the last)
    started = history[-1]["async/started"]
    assert len(traces) == started == len({t["metadata"]["episode"] for t in traces})  # one trace per episode
    cancelled = [t for t in traces if t["failure_reason"] == "cancelled"]
    assert len(traces) - len(cancelled) >= 16
    # staleness 0: every trained trace was sampled entirely by the version live at its update; stale ones counted
    assert sum(m["async/dropped_stale"] for m in history) == history[-1]["async/dropped_stale_total"]
    assert all(m["trace/staleness/max"] == 0 for m in history)
    assert all(m["async/masked_tokens"] == 0 for m in history)  # drop masks nothing
    assert all(m["async/stale_groups"] <= m["async/dropped_stale"] for m in history)  # a group lost one or more
    mixed = [t for t in traces if len({v for c in t["calls"] for _, v in c["versions"]}) > 1]
    if policy == "pin":
        assert not mixed  # a pinned trace never changes version
    print(
        f"\n{policy}: {started} episodes, {len(cancelled)} cancelled at stop, {len(mixed)} multi-version traces, "
        f"{history[-1]['async/dropped_stale_total']} dropped as stale"
    )
    assert all(oldest_version(t) is None or oldest_version(t) <= 4 for t in traces)
    # the share of each update's groups whose rewards differ, and how even the task weights were, for both samplers
    signal = [m["train/groups_with_signal"] for m in history]
    assert all(0 <= s <= 1 for s in signal) and all(
        round(s * m["adv/groups"]) == m["adv/groups"] - m["adv/zero_variance_groups"]
        for s, m in zip(signal, history, strict=True)
    )
    entropies = [m["train/sampler_entropy"] for m in history]
    # 1e-9 for the float64 rounding of Σ p·log p / log n (equal weights can give 1 + 2e-16)
    if sampler == "uniform":
        assert all(abs(e - 1) < 1e-9 for e in entropies)
    else:
        assert all(0 < e < 1 + 1e-9 for e in entropies)
    print(f"{sampler}: groups_with_signal {signal}, sampler_entropy {[round(e, 3) for e in entropies]}")


def test_async_mixed(tiny_model, tmp_path):
    _check(tmp_path, tiny_model, "mixed")
    # every committed step has exactly one metrics line, and a resumed run goes on from the committed state
    run = RunDir(tmp_path / "mixed")
    version = run.state()["version"]
    assert run.state()["iteration"] == 4 and version == run.metric_rows()[3]["version"]
    cfg = LoopConfig(iterations=6, group_size=2, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    # resumed with staleness: mask (only stale tokens leave the loss), counted per step and over the run
    acfg = AsyncConfig(max_in_flight=6, batch_traces=4, max_staleness=0, max_buffered=8, staleness="mask")
    history = asyncio.run(_run(tiny_model, run, cfg, acfg, "mixed"))
    assert [m["version"] for m in history] == _published(history, version)
    masked = [m["async/masked_tokens"] for m in history]
    assert all(n >= 0 for n in masked) and sum(masked) == history[-1]["async/masked_tokens_total"]
    assert all(0 <= m["async/stale_groups"] <= m["async/dropped_stale"] for m in history)
    lines = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(6)) and run.state()["iteration"] == 6
    cpu = [m["proxy/cpu_us_per_token"] for m in lines if "proxy/cpu_us_per_token" in m]
    assert len(cpu) >= 4 and all(c > 0 for c in cpu)  # the proxy's CPU per streamed token, per step
    keys = [t["metadata"]["episode"] for t in run.all_traces()]
    assert len(keys) == len(set(keys))  # the resumed run started new groups, not the first run's again
    _check_readers(run, len(keys))


def _hrl(*args: str) -> dict:
    env = {**os.environ, "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-m", "hrl.cli", *args], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _check_readers(run: RunDir, n_traces: int) -> None:
    """An async run's traces are where `hrl inspect RUN_DIR` and `hrl report` look, per step."""
    rows = _hrl("inspect", str(run.path), "--json")
    assert sum(r["traces"] for r in rows) == n_traces
    assert [r["iteration"] for r in rows][:6] == list(range(6))
    # each step's own traces (a step while pacing held every new group, async.pace, started none: it has none)
    assert all(r["traces"] == len(run.iteration_traces(r["iteration"])) for r in rows[:6])
    assert rows[0]["traces"] > 0
    logged = run.metric_rows()
    assert all(r["metrics"]["version"] == logged[r["iteration"]]["version"] for r in rows[:6])  # per iteration
    report = _hrl("report", str(run.path), "--json")
    assert report["traces"] == n_traces and report["steps"] >= 6
    assert run.all_traces()[-1]["trace_id"] in Path(report["out"]).read_text()


def test_async_pin(tiny_model, tmp_path):
    _check(tmp_path, tiny_model, "pin", sampler="signal")


class _FlakyAgent(Rollouts):
    """Every k-th episode raises instead of returning its trace (a bug in a runner, a sandbox gone wrong)."""

    def __init__(self, inner, k: int) -> None:
        self.inner, self.k, self.n = inner, k, 0

    async def episode(self, ep, trace_file):
        self.n += 1
        if self.n % self.k == 0:
            raise RuntimeError(f"episode {ep.key} broke")
        return await self.inner.episode(ep, trace_file)


def test_async_loses_no_episode_when_every_third_raises(tiny_model, tmp_path):
    """An episode that raises becomes an internal_error trace: its group completes, it is counted and left out of
    training, and the loop runs to the end instead of waiting for a trace that never comes."""

    async def main(run, cfg, acfg):
        async with serving(tiny_model, "scripted", engine_options={"turns": ["Done."]}) as stack:
            agent = SimulatedAgent(stack.proxy, stack.url, min_turns=1, max_turns=2, tool_time_median_s=0.01)
            try:
                flaky = _FlakyAgent(agent, 3)
                return await asyncio.wait_for(train_async(TASKS, cfg, acfg, run, stack.proxy, flaky), 240)
            finally:
                await agent.close()

    run = RunDir(tmp_path / "flaky")
    cfg = LoopConfig(iterations=3, group_size=2, trainer=TrainerConfig(model=tiny_model, lr=1e-3))
    acfg = AsyncConfig(max_in_flight=4, batch_traces=4, max_staleness=8, max_buffered=8)
    run.create(cfg.model_dump())
    history = asyncio.run(main(run, cfg, acfg))
    assert [m["version"] for m in history] == _published(history)  # "Done." every time: the rewards agree
    traces = run.all_traces()
    broken = [t for t in traces if t["failure_reason"] == "internal_error"]
    assert broken and all("broke" in t["metadata"]["error"] for t in broken)
    assert len(traces) == history[-1]["async/started"]  # one trace per started episode, the broken ones too
    assert sum(m["train/infra_failures"] for m in history) >= 1
    assert sum(m["trace/failures/internal_error"] for m in history) == sum(m["train/infra_failures"] for m in history)
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/lr"] for m in rows] == [cfg.trainer.lr] * 3  # the learning rate of each step, in its row


def _fills_always(max_in_flight: int, group: int, max_buffered: int, batch: int) -> bool:
    """Whether the producer can always fill the trainer's batch, by brute force over every order of events: episodes
    finishing one at a time or together (the producer may wake once for several), whole groups failing (dropped,
    at most two), the trainer taking a batch whenever one is ready or much later. A state with nothing running,
    less than a batch ready and no group it may start is a run that waits forever."""
    cap, need = max(max_in_flight, group) // group * group, -(-batch // group) * group

    def start(ready, groups, ghosts):  # the producer's launch loop: whole groups while there is room and buffer
        groups, running = list(groups), sum(group - f for f in groups) + ghosts
        while running + group <= cap and ready + sum(groups) < max_buffered:
            groups.append(0)
            running += group
        return tuple(sorted(groups))

    seen, todo = set(), [(0, (), 0, 0)]  # ready traces, finished per open group, orphaned runners, drops
    while todo:
        state = todo.pop()
        if state in seen:
            continue
        seen.add(state)
        ready, groups, ghosts, drops = state
        launched = start(ready, groups, ghosts)
        if not groups and not ghosts and ready < need and launched == groups:
            return False
        nxt = [(ready, launched, ghosts, drops)]
        if ready >= need:
            nxt.append((ready - need, groups, ghosts, drops))
        if ghosts:
            nxt.append((ready, groups, ghosts - 1, drops))
        for i, f in enumerate(groups):
            rest = groups[:i] + groups[i + 1 :]
            if f + 1 == group:
                nxt.append((ready + group, rest, ghosts, drops))
            else:
                nxt.append((ready, tuple(sorted((*rest, f + 1))), ghosts, drops))
            if drops < 2:  # an episode left no trace at all: its group is dropped, its other episodes run on
                nxt.append((ready, rest, ghosts + group - f - 1, drops + 1))
        todo += [s for s in nxt if s not in seen]
    return True


def test_async_settings_that_can_leave_a_batch_unfilled_are_refused_and_only_those():
    """check_batch_fits refuses exactly the settings under which some order of events leaves the trainer waiting
    forever (`_fills_always`), over every small combination; max_in_flight changes when, never whether."""
    for g, m, b, n in itertools.product(range(1, 5), range(1, 9), range(1, 9), range(1, 9)):
        acfg = AsyncConfig(max_in_flight=m, batch_traces=n, max_buffered=b)
        try:
            check_batch_fits(acfg, g)
            refused = None
        except UsageError as e:
            refused = e
        assert (refused is None) == _fills_always(m, g, b, n), (m, g, b, n)
        if refused is not None:  # the fields and their values, and a buffer of a whole batch as the fix
            assert f"async.max_buffered={b}" in str(refused) and f"async.batch_traces={n}" in str(refused)
            assert f"async.max_buffered={-(-n // g) * g}" in refused.hint
    # the demo's groups of 8: max_buffered=2 with batch_traces=16 gathers 8 traces and stops; 16 in flight help not
    with pytest.raises(UsageError, match=r"can never fill a batch.*at most 8 are ever gathered"):
        check_batch_fits(AsyncConfig(max_in_flight=8, batch_traces=16, max_buffered=2), 8)
    with pytest.raises(UsageError, match="leaves 8 waiting"):
        check_batch_fits(AsyncConfig(max_in_flight=32, batch_traces=16, max_buffered=2), 8)
    check_batch_fits(AsyncConfig(max_in_flight=8, batch_traces=16, max_buffered=9), 8)  # 9 traces: 2 groups started


class _Gated(Rollouts):
    """Episodes that all end when the test opens the gate, each with a trace of its own (reward 0)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def episode(self, ep, trace_file):
        await self.gate.wait()
        return {"trace_id": ep.key, "task_id": ep.task_id, "group_id": ep.group_id, "reward": 0.0, "calls": []}


async def _settle() -> None:
    """Let every ready callback and task run (a fixed number of event-loop turns, not a time)."""
    for _ in range(50):
        await asyncio.sleep(0)


def test_a_buffer_short_of_a_batch_stalls_the_real_producer_whatever_max_in_flight_is(tmp_path):
    """The order of events the refusal is about, on the real producer: 3 groups of 2 in flight (more than the batch
    of 4), all ending together while the trainer is busy; the trainer takes 4 and 2 stay. With max_buffered=2 no
    group starts again and nothing runs: the next batch never fills. With 3 (ceil(3/2) = 2 groups, a batch) the
    producer starts groups again at once."""
    from hrl.train.async_loop import _Producer

    async def after_one_take(max_buffered: int) -> tuple[int, int, int]:
        run = RunDir(tmp_path / f"b{max_buffered}")
        cfg = LoopConfig(group_size=2, trainer=TrainerConfig(model="m"))
        run.create(cfg.model_dump())
        acfg, rollouts = AsyncConfig(max_in_flight=6, batch_traces=4, max_buffered=max_buffered), _Gated()
        producer = _Producer(TASKS, cfg, acfg, rollouts, run)
        feeder = asyncio.create_task(producer.loop())
        await _settle()
        assert producer.started == 6
        rollouts.gate.set()
        await _settle()
        rollouts.gate.clear()  # episodes started from here on run until the end of the test
        assert len(await producer.take(4)) == 4
        await _settle()
        feeder.cancel()
        ready = sum(len(g) for g in producer.ready)
        running = len(producer.running)
        await producer.stop()
        return ready, running, producer.started

    assert asyncio.run(after_one_take(2)) == (2, 0, 6)  # 2 ready of the 4 it waits for, none running, none to start
    with pytest.raises(UsageError, match=r"async\.max_buffered=2 cannot hold a batch"):
        check_batch_fits(AsyncConfig(max_in_flight=6, batch_traces=4, max_buffered=2), 2)
    assert asyncio.run(after_one_take(3)) == (2, 6, 12)  # 3 new groups started
    check_batch_fits(AsyncConfig(max_in_flight=6, batch_traces=4, max_buffered=3), 2)


class _Unreached(Engine):
    """An engine nothing reaches."""

    name, version = "unreached", 0


class _NoEngine(Publisher):
    """A publisher with no engine behind it: the producer fails before any publish."""

    engine, stats = _Unreached(), {}

    async def publish(self, path: str, kind: str, version: int | None = None) -> int:
        raise AssertionError("nothing is published before the first batch")

    def take_cpu_per_token(self) -> float | None:
        return None


class _MixGoneBad(_Gated):
    """A harness mix whose list of harnesses breaks once the first group has started: the producer raises while
    starting the second group, outside any episode."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.set()
        self.reads = 0

    @property
    def harnesses(self) -> tuple[str, ...]:
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("harness registry went away")
        return ()


class _NoTrace(_Gated):
    """A runner bug: episodes return None instead of their trace, so collecting them raises in the producer."""

    async def episode(self, ep, trace_file):
        return None


@pytest.mark.parametrize(("rollouts", "needle"), [(_MixGoneBad, "RuntimeError: harness registry went away"),
                                                  (_NoTrace, "AttributeError: 'NoneType'")])  # fmt: skip
def test_a_producer_that_raises_ends_the_run_with_its_error(tiny_model, tmp_path, rollouts, needle):
    """Before: the feeder task died (or a done-callback raised) unseen and the trainer waited for its batch forever.
    The 120 s bound only turns such a wait into a failure; the run ends at the first take either way."""
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=2, group_size=2, trainer=TrainerConfig(model=tiny_model))
    acfg = AsyncConfig(max_in_flight=4, batch_traces=4, max_buffered=8)
    run.create(cfg.model_dump())
    with pytest.raises(HrlError, match="the async rollout producer stopped") as info:
        asyncio.run(asyncio.wait_for(train_async(TASKS, cfg, acfg, run, _NoEngine(), rollouts()), 120))
    assert needle in str(info.value) and info.value.__cause__ is not None and "HRL_DEBUG=1" in info.value.hint
    assert run.state() == {"iteration": 0, "version": 0, "checkpoint": None}  # nothing committed


def test_async_steps_that_train_on_nothing_publish_nothing(tiny_model, tmp_path):
    """Every reward 0: every group agrees, every advantage is 0, the trainer skips. No version is published, no
    checkpoint written; each step's line says train/empty = 1 and train/empty_steps counts them."""
    run = RunDir(tmp_path / "empty")
    cfg = LoopConfig(iterations=2, group_size=2, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    acfg = AsyncConfig(max_in_flight=4, batch_traces=4, max_staleness=8, max_buffered=8)
    run.create(cfg.model_dump())

    async def main():
        async with serving(tiny_model, "scripted", engine_options={"turns": ["Done."]}) as stack:
            agent = SimulatedAgent(stack.proxy, stack.url, max_turns=1, reward=lambda text: 0.0)
            try:
                history = await asyncio.wait_for(train_async(TASKS, cfg, acfg, run, stack.proxy, agent), 240)
            finally:
                await agent.close()
            return history, stack.proxy.stats["proxy/publishes"]

    history, publishes = asyncio.run(main())
    assert publishes == 0 and not list(run.checkpoints.glob("v*"))
    assert [m["version"] for m in history] == [0, 0]
    assert [(m["train/empty"], m["train/empty_steps"]) for m in history] == [(1.0, 1.0), (1.0, 2.0)]
    assert run.state() == {"iteration": 2, "version": 0, "checkpoint": None}


def test_an_episode_cancelled_before_it_began_still_ends_as_one_trace(tmp_path):
    """The producer stops (end of run, an error) while episodes it started have not taken their first step: their
    coroutine never runs, so no runner writes their `cancelled` trace; the producer does. Under load this was two
    started episodes of 22 without a trace."""
    from hrl.train.async_loop import _Producer

    class Waits(Rollouts):
        async def episode(self, ep, trace_file):
            await asyncio.Event().wait()

    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=1, group_size=2, trainer=TrainerConfig(model="unused"))
    run.create(cfg.model_dump())

    async def main() -> _Producer:
        producer = _Producer(TASKS, cfg, AsyncConfig(max_in_flight=4, batch_traces=4), Waits(), run)
        starter = asyncio.create_task(producer._start_groups())
        await asyncio.sleep(0)  # the starter ran once: its episodes are created, none has taken a step
        assert producer.started == 4 and not producer._began
        starter.cancel()  # as the loop does: no new group, then stop what runs
        await producer.stop()
        return producer

    producer = asyncio.run(main())
    traces = run.all_traces()
    assert len(traces) == producer.started == 4
    assert {t["failure_reason"] for t in traces} == {"cancelled"}
