"""Staleness that does not bias the data: `async.staleness: mask` is the default, admission is paced by the oldest
episode's version lag (`async.pace`), and each step counts what staleness took per bucket of LLM calls per trace."""

from __future__ import annotations

import asyncio
import time

import pytest

from hrl.runners.rollouts.episodes import Rollouts
from hrl.runners.rollouts.simagent import SimulatedAgent
from hrl.runners.rundir import RunDir
from hrl.runners.serving.stack import serving
from hrl.train.async_loop import AsyncConfig, _Producer, train_async
from hrl.train.loop import LoopConfig
from hrl.train.samples import build_samples, mask_stale
from hrl.train.staleness import select_fresh, staleness_by_calls
from hrl.train.trainer import TrainerConfig
from tests.train.test_math import _call

TASKS = [{"instance_id": f"t{i}", "problem_statement": p} for i, p in enumerate(["fix it", "run tests", "ls"])]
BUCKETS = ("0-2", "3-5", "6-10", "11+")


def test_mask_is_the_default_pacing_is_on_and_drop_stays():
    acfg = AsyncConfig()
    assert acfg.staleness == "mask" and acfg.pace is True
    assert AsyncConfig(staleness="drop", pace=False).staleness == "drop"


def _chain(tid: str, versions: list[int], side: int | None = None) -> dict:
    """A trace of len(versions) calls, each extending the one before, of 2 sampled tokens sampled by its version;
    call `side` (if any) is a side call."""
    calls = []
    for i, v in enumerate(versions):
        ref = (f"{tid}-{i - 1}", 2 + 2 * i) if i else None
        calls.append(_call(f"{tid}-{i}", prompt=None if i else [1, 2], ref=ref, resp=[10 + i, 20 + i],
                           parent=f"{tid}-{i - 1}" if i else None, side=i == side, versions=[[0, v]]))  # fmt: skip
    return {"trace_id": tid, "group_id": tid, "reward": 1.0, "calls": calls}


def test_staleness_by_calls_buckets_traces_by_llm_calls_and_counts_what_each_mode_takes():
    """Trainer at version 5, max_staleness 1: tokens older than 4 are stale. Traces of 2, 3, 10 and 11 calls (the
    bucket bounds), the long ones with their first calls old. Drop leaves out every trace with a stale token; mask
    keeps them and counts their stale tokens, the way the trainer's mask counts them."""
    batch = [
        _chain("two", [5, 5]),  # 0-2, fresh
        _chain("three", [3, 4, 5]),  # 3-5: one stale call (2 tokens)
        _chain("ten", [2] * 4 + [5] * 6, side=9),  # 6-10: 4 stale calls; its last call is a side call
        _chain("eleven", [1] * 8 + [4] * 3),  # 11+: 8 stale calls
    ]
    drop = AsyncConfig(max_staleness=1, staleness="drop")
    kept, before = select_fresh(batch, 5, drop)
    m = staleness_by_calls(batch, kept, before)
    assert [m[f"async/traces/calls_{b}"] for b in BUCKETS] == [1, 1, 1, 1]
    assert [m[f"async/dropped_stale/calls_{b}"] for b in BUCKETS] == [0, 1, 1, 1]
    assert not any(k.startswith(("async/stale_tokens", "async/sampled_tokens")) for k in m)  # drop masks nothing

    kept, before = select_fresh(batch, 5, AsyncConfig(max_staleness=1))  # mask, the default
    assert kept == batch and before == 4
    m = staleness_by_calls(batch, kept, before)
    assert [m[f"async/dropped_stale/calls_{b}"] for b in BUCKETS] == [0, 0, 0, 0]
    assert [m[f"async/stale_tokens/calls_{b}"] for b in BUCKETS] == [0, 2, 8, 16]
    assert [m[f"async/sampled_tokens/calls_{b}"] for b in BUCKETS] == [4, 6, 18, 22]  # the side call's 2 not
    # the same count the trainer's mask makes of each trace (`async/masked_tokens`)
    assert [mask_stale(t, build_samples(t), before) for t in batch] == [0, 2, 8, 16]
    m = staleness_by_calls(batch, kept, before, include_side=True)
    assert m["async/sampled_tokens/calls_6-10"] == 20
    # at version 6 "eleven" has no fresh token left: dropped in mask mode too, counted in its bucket
    kept, before = select_fresh(batch, 6, AsyncConfig(max_staleness=1))
    m = staleness_by_calls(batch, kept, before)
    assert [m[f"async/dropped_stale/calls_{b}"] for b in BUCKETS] == [0, 0, 0, 1]
    assert [m[f"async/stale_tokens/calls_{b}"] for b in BUCKETS] == [0, 4, 8, 0]
    assert m["async/sampled_tokens/calls_11+"] == 0


class _Held(Rollouts):
    """Each episode runs until the test releases it by key, then returns a trace without calls."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}

    def release(self, key: str) -> None:
        self.gates.setdefault(key, asyncio.Event()).set()

    async def episode(self, ep, trace_file):
        await self.gates.setdefault(ep.key, asyncio.Event()).wait()
        return {"trace_id": ep.key, "task_id": ep.task_id, "group_id": ep.group_id, "reward": 0.0, "calls": []}


async def _settle() -> None:
    """Let every ready callback and task run (a fixed number of event-loop turns, not a time)."""
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.mark.parametrize("pace", [True, False])
def test_pacing_holds_new_groups_while_the_oldest_episode_lags_and_only_then(tmp_path, pace):
    """The real producer, groups of 1, 3 in flight, max_staleness 1. Episode 0 is slow. At trainer version 1 it
    lags 1: groups still start. At version 2 it lags 2: with pacing no group starts for the room episode 3 leaves
    (held, timed as async/paced_s), until episode 0 ends; without pacing one starts at once."""

    async def main() -> tuple[list[int], dict[str, float], dict[str, float]]:
        run = RunDir(tmp_path / str(pace))
        cfg = LoopConfig(group_size=1, trainer=TrainerConfig(model="m"))
        run.create(cfg.model_dump())
        acfg = AsyncConfig(max_in_flight=3, batch_traces=1, max_buffered=4, max_staleness=1, pace=pace)
        rollouts = _Held()
        producer = _Producer(TASKS, cfg, acfg, rollouts, run)
        producer.published(0)
        feeder = asyncio.create_task(producer.loop())
        await _settle()
        key = sorted(ep.key for ep in producer._episodes.values())  # it0, it1, it2: admitted at version 0
        started = [producer.started]
        rollouts.release(key[1])
        await _settle()
        started.append(producer.started)
        assert [t["trace_id"] for t in await producer.take(1)] == [key[1]]
        producer.published(1)  # episode 0 lags 1 = max_staleness: not held
        rollouts.release(key[2])
        await _settle()
        started.append(producer.started)
        await producer.take(1)
        producer.published(2)  # episode 0 lags 2 > max_staleness
        await _settle()
        third = sorted(ep.key for ep in producer._episodes.values() if ep.key not in key)[0]
        rollouts.release(third)  # room for a group
        await _settle()
        started.append(producer.started)
        t0 = time.monotonic()
        await asyncio.sleep(0.2)
        held = producer.metrics([])
        bound = time.monotonic() - t0
        rollouts.release(key[0])  # the slow episode ends: the oldest in flight started at version 1
        await _settle()
        started.append(producer.started)
        after = producer.metrics([])
        feeder.cancel()
        await producer.stop()
        return started, held | {"bound": bound}, after

    started, held, after = asyncio.run(main())
    if pace:
        assert started == [3, 4, 5, 5, 7]  # held at version 2 until episode 0 ended, then filled up at once
        assert 0.2 <= held["async/paced_s"] <= held["bound"] + 0.05
        assert held["async/paced_s_total"] == held["async/paced_s"]
        assert after["async/paced_s"] < 0.2 and after["async/paced_s_total"] >= 0.2
    else:
        assert started == [3, 4, 5, 6, 7]
        assert held["async/paced_s"] == after["async/paced_s_total"] == 0.0


class _OneSlow(Rollouts):
    """Group 0's first episode takes 4 turns and waits after its first until the engine reaches version `until` or
    `wait_s` pass; every other episode is one turn. Rewards are the episode's index in its group (0 or 1), so every
    group has signal and every step publishes."""

    def __init__(self, stack, until: int, wait_s: float) -> None:
        self.stack, self.until, self.wait_s = stack, until, wait_s
        self.released_at: int | None = None  # the engine's version when the slow episode went on
        self.slow = SimulatedAgent(stack.proxy, stack.url, min_turns=4, max_turns=4, between_turns=self._hold)
        self.fast = SimulatedAgent(stack.proxy, stack.url, min_turns=1, max_turns=1)

    async def _hold(self, ep, turn: int) -> None:
        if turn == 0:
            for _ in range(int(self.wait_s / 0.01)):
                if self.stack.proxy.engine.version >= self.until:
                    break
                await asyncio.sleep(0.01)
            self.released_at = self.stack.proxy.engine.version

    async def episode(self, ep, trace_file):
        agent = self.slow if ep.iteration == 0 and ep.index == 0 else self.fast
        trace = await agent.episode(ep, trace_file)
        return {**trace, "reward": float(ep.index)}

    async def close(self) -> None:
        await self.slow.close()
        await self.fast.close()


@pytest.mark.parametrize("pace", [True, False])
def test_pacing_keeps_the_trainer_from_running_ahead_of_a_slow_episode_and_never_deadlocks(tiny_model, tmp_path, pace):
    """The real loop, proxy, engine and trainer: groups of 2, 4 in flight, batches of one group, max_staleness 1,
    one slow episode among one-turn ones. Without pacing the short ones fill batch after batch and the trainer runs
    to version 6 while the slow episode waits for it. With pacing no group starts once it lags 2: the trainer takes
    what was already started (at most 2 more versions here) and then waits for it, which the slow episode ends
    after its 3 s. Every step gets its batch (nothing deadlocks), and the stale tokens counted per bucket are the
    ones the trainer masked. (The slow episode's sibling, one turn at version 0, has no fresh token left by then: it
    is dropped and its group trains short, counted in the 0-2 bucket.)"""
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=8, group_size=2, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    acfg = AsyncConfig(max_in_flight=4, batch_traces=2, max_buffered=2, max_staleness=1, pace=pace)
    run.create(cfg.model_dump())

    async def main():
        async with serving(tiny_model, engine_options={"dtype": "float32"}) as stack:
            rollouts = _OneSlow(stack, until=6, wait_s=3.0 if pace else 60.0)
            try:
                history = await asyncio.wait_for(train_async(TASKS, cfg, acfg, run, stack.proxy, rollouts), 240)
            finally:
                await rollouts.close()
            return history, rollouts.released_at

    t0 = time.monotonic()
    history, released_at = asyncio.run(main())
    wall = time.monotonic() - t0
    assert [m["step"] for m in history] == list(range(8)) and run.state()["iteration"] == 8  # no step waited forever
    paced = [m["async/paced_s"] for m in history]
    assert sum(paced) == pytest.approx(history[-1]["async/paced_s_total"]) and all(p >= 0 for p in paced)
    if pace:
        assert released_at <= 4 and 1.0 < history[-1]["async/paced_s_total"] < wall
    else:
        assert released_at >= 6 and history[-1]["async/paced_s_total"] == 0.0
    for m in history:  # mask, the default: the buckets add up to the step's own counts
        assert sum(m[f"async/dropped_stale/calls_{b}"] for b in BUCKETS) == m["async/dropped_stale"]
        assert sum(m[f"async/traces/calls_{b}"] for b in BUCKETS) == 2
        assert sum(m[f"async/stale_tokens/calls_{b}"] for b in BUCKETS) == m["async/masked_tokens"]
    slow_stale = sum(m["async/stale_tokens/calls_3-5"] for m in history)  # the slow episode's first turn
    assert slow_stale > 0 or not pace  # without pacing the run may end before the slow episode's group does
    dropped = {b: sum(m[f"async/dropped_stale/calls_{b}"] for m in history) for b in BUCKETS}
    print(f"\npace={pace}: slow episode released at version {released_at}, held {[round(p, 2) for p in paced]} s, "
          f"versions {[m['version'] for m in history]}, stale tokens of the 4-call trace {slow_stale:.0f}, "
          f"dropped by calls {dropped}, wall {wall:.1f} s")  # fmt: skip
