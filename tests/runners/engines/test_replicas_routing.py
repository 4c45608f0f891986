"""cache_aware routing (runners/engines/routing.py) on a real ReplicaSet of scripted replicas: placement on the least
loaded, stickiness within move_threshold, a counted move past it, re-placement off a dead home, and the routing
metrics (moves, per-replica prefix-cache hit rate; absent where an engine keeps no counters)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from hrl.runners.engines.base import SamplingParams, TokenDelta
from hrl.runners.engines.replicas import ReplicaSet, ReplicaSetConfig
from hrl.runners.engines.routing import Router, RoutingConfig, hrw_rank
from hrl.runners.engines.scripted import ScriptedEngine, ScriptedEngineConfig

ANSWER = "one two three four five six seven eight nine ten eleven twelve"
PROMPT = list(range(100, 164))  # 64 ids: four full prefix-cache blocks of 16


class Recorder:
    """The proxy call's side of `engines.base.Routed`: what the replica set notes of the call it places."""

    def __init__(self, key: str) -> None:
        self.sticky_key = key
        self.replicas: list[str] = []
        self.moves: list[tuple[str, str, dict[str, int]]] = []

    def ran_on(self, replica: str) -> None:
        self.replicas.append(replica)

    def switched(self, source: str, target: str, after_tokens: int, error: str) -> None:
        raise AssertionError(f"no replica died here ({source} -> {target}: {error})")

    def moved(self, source: str, target: str, loads: dict[str, int]) -> None:
        self.moves.append((source, target, loads))


async def _replica_set(model: str, names: list[str], **routing) -> tuple[ReplicaSet, dict[str, ScriptedEngine]]:
    engines = {n: ScriptedEngine(ScriptedEngineConfig(model=model, turns=[ANSWER])) for n in names}
    rs = ReplicaSet(ReplicaSetConfig(model=model, poll_s=3600, **routing), engines)  # refreshed by hand only
    await rs.start()
    return rs, engines


async def _turn(rs: ReplicaSet, call: Recorder, rid: str) -> str:
    async for _ in rs.generate(rid, PROMPT, SamplingParams(max_tokens=8), call=call):
        pass
    return call.replicas[-1]


async def _hold(engine: ScriptedEngine, rid: str) -> AsyncIterator[TokenDelta]:
    """A generation that another proxy shard runs on `engine`: started and left open, so the engine counts it as
    running until it is closed (the replica set sees it only through the engine's metrics)."""
    gen = engine.generate(rid, [7, 8, 9], SamplingParams(max_tokens=64))
    await gen.__anext__()
    return gen


def test_router_places_on_the_least_loaded_and_breaks_ties_by_hrw():
    router = Router(RoutingConfig())
    assert router.pick("s", {"r0": 3, "r1": 0, "r2": 1}) == "r1"
    assert router.pick("s", {"r0": 2, "r1": 2, "r2": 5}) == hrw_rank("s", ["r0", "r1"])[0]
    keys = [f"k{i}" for i in range(64)]
    assert {router.pick(k, {"r0": 0, "r1": 0}) for k in keys} == {"r0", "r1"}  # idle replicas: spread by hash


def test_router_sticks_within_the_threshold_then_moves_once_and_sticks_again():
    router = Router(RoutingConfig(move_threshold=2))
    home = router.pick("s", {"r0": 0, "r1": 0})
    other = "r1" if home == "r0" else "r0"
    assert router.placed("s", home, {"r0": 0, "r1": 0}) is None
    within = {home: 5, other: 3}  # 2 more than the least loaded: at the threshold, not past it
    assert router.pick("s", within) == home
    assert router.placed("s", home, within) is None
    past = {home: 6, other: 3}
    assert router.pick("s", past) == other
    assert router.placed("s", other, past) == home
    assert router.pick("s", {home: 0, other: 2}) == other  # the new home holds while within the threshold
    assert (router.moves, router.rehomes) == (1, 0)


def test_router_re_places_a_session_whose_home_is_gone_without_counting_a_move():
    router = Router(RoutingConfig())
    router.placed("s", "r0", {"r0": 0, "r1": 0})
    assert router.pick("s", {"r1": 9, "r2": 4}) == "r2"  # r0 dead or fenced: the least loaded of the rest
    assert router.placed("s", "r2", {"r1": 9, "r2": 4}) is None
    assert (router.moves, router.rehomes) == (0, 1)
    assert router.pick("s", {}) is None


def test_hrw_and_round_robin_stay_available():
    hrw = Router(RoutingConfig(policy="hrw"))
    assert hrw.pick("s", {"r0": 9, "r1": 0}) == hrw_rank("s", ["r0", "r1"])[0]  # load does not matter
    rr = Router(RoutingConfig(policy="round_robin"))
    picks = []
    for _ in range(4):
        picks.append(rr.pick("s", {"r0": 0, "r1": 0}))
        rr.placed("s", picks[-1], {"r0": 0, "r1": 0})
    assert picks == ["r0", "r1", "r0", "r1"]


def test_cache_aware_is_the_default_policy():
    assert RoutingConfig().policy == "cache_aware"
    with pytest.raises(ValueError, match="move_threshold"):
        RoutingConfig(move_threshold=-1)


def test_a_session_sticks_while_loads_are_within_the_threshold_and_moves_past_it(tiny_model):
    async def scenario() -> None:
        rs, engines = await _replica_set(tiny_model, ["r0", "r1"], move_threshold=2)
        call = Recorder("sess")
        home = await _turn(rs, call, "t0")
        assert home == hrw_rank("sess", ["r0", "r1"])[0]  # both idle: the HRW tie-break
        other = "r1" if home == "r0" else "r0"
        held = [await _hold(engines[home], f"bg{i}") for i in range(2)]
        await rs.refresh()
        assert {s["name"]: s["external"] for s in rs.describe()} == {home: 2, other: 0}
        assert await _turn(rs, call, "t1") == home  # 2 more than the other: within the threshold
        held.append(await _hold(engines[home], "bg2"))
        await rs.refresh()
        assert await _turn(rs, call, "t2") == other  # 3 more: past it, the next generation moves
        assert call.moves == [(home, other, {home: 3, other: 0})]
        for gen in held:
            await gen.aclose()
        await rs.refresh()
        assert await _turn(rs, call, "t3") == other  # loads even again: the session stays on its new home
        stats = rs.take_stats()
        assert (stats["routing/moves"], stats["routing/rehomes"], stats["routing/switches"]) == (1.0, 0.0, 0.0)
        assert rs.take_stats()["routing/moves"] == 0.0  # a window: counted once
        await rs.close()

    asyncio.run(scenario())


def test_new_sessions_go_to_the_least_loaded_replica(tiny_model):
    async def scenario() -> None:
        rs, engines = await _replica_set(tiny_model, ["r0", "r1", "r2"], move_threshold=0)
        held = [await _hold(engines["r0"], f"a{i}") for i in range(2)] + [await _hold(engines["r1"], "b0")]
        await rs.refresh()
        placed = [await _turn(rs, Recorder(f"new-{i}"), f"n{i}") for i in range(4)]
        assert placed == ["r2"] * 4  # each ran alone, so r2 (0) stayed the least loaded (r0: 2, r1: 1)
        for gen in held:
            await gen.aclose()
        await rs.close()

    asyncio.run(scenario())


def test_prefix_hit_rate_per_replica_is_reported_and_absent_without_counters(tiny_model):
    """The scripted engine's paced prefix cache: the same 64-id prompt twice on one replica is 0 then 64 of 64
    tokens cached, 64 / 128 = 0.5 exactly; a replica that served nothing has no rate (absent, not 0)."""

    async def scenario() -> None:
        engines = {n: ScriptedEngine(ScriptedEngineConfig(model=tiny_model, turns=[ANSWER], decode_tps=1e6,
                                                          prefill_tps=1e6)) for n in ("r0", "r1")}  # fmt: skip
        rs = ReplicaSet(ReplicaSetConfig(model=tiny_model, poll_s=3600), engines)
        await rs.start()
        call = Recorder("sess")
        home = await _turn(rs, call, "t0")
        await _turn(rs, call, "t1")
        await rs.refresh()
        other = "r1" if home == "r0" else "r0"
        stats = rs.take_stats()
        assert stats[f"routing/{home}/prefix_hit_rate"] == 0.5
        assert f"routing/{other}/prefix_hit_rate" not in stats
        assert {s["name"]: s["prefix_hit_rate"] for s in rs.describe()} == {home: 0.5, other: None}
        await _turn(rs, call, "t2")
        await rs.refresh()
        assert rs.take_stats()[f"routing/{home}/prefix_hit_rate"] == 1.0  # this window: 64 of 64
        await rs.close()

    asyncio.run(scenario())
