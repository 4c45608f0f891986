"""Asynchronous training through the real proxy and engine: whole groups, staleness bound, one trace per episode."""

from __future__ import annotations

import asyncio
import json

from hrl.runners.simagent import SimulatedAgent
from hrl.runners.stack import serving
from hrl.runners.trace import read_traces
from hrl.train.async_loop import AsyncConfig, oldest_version, train_async
from hrl.train.loop import LoopConfig
from hrl.train.rundir import RunDir
from hrl.train.trainer import TrainerConfig

TASKS = [{"instance_id": f"t{i}", "problem_statement": p} for i, p in enumerate(["fix it", "run tests", "ls"])]


async def _run(model: str, run: RunDir, cfg: LoopConfig, acfg: AsyncConfig, policy: str):
    opts = {"engine_options": {"dtype": "float32"}, "proxy_options": {"version_policy": policy}}
    async with serving(model, **opts) as stack:
        agent = SimulatedAgent(stack.proxy, stack.url, min_turns=1, max_turns=6, tool_time_median_s=0.05)
        try:
            return await train_async(TASKS, cfg, acfg, run, stack.proxy.publish, agent)
        finally:
            await agent.close()


def _check(tmp_path, tiny_model, policy: str) -> None:
    run = RunDir(tmp_path / policy)
    cfg = LoopConfig(iterations=4, group_size=2, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    acfg = AsyncConfig(max_in_flight=6, batch_traces=4, max_staleness=0, max_buffered=8)
    run.create(cfg.model_dump())
    history = asyncio.run(_run(tiny_model, run, cfg, acfg, policy))
    assert [m["version"] for m in history] == [1, 2, 3, 4]
    traces = list(read_traces(run.traces / "rollouts.jsonl"))
    started = history[-1]["async/started"]
    assert len(traces) == started == len({t["metadata"]["episode"] for t in traces})  # one trace per episode
    cancelled = [t for t in traces if t["failure_reason"] == "cancelled"]
    assert len(traces) - len(cancelled) >= 16
    # staleness 0: every trained trace was sampled entirely by the version live at its update; stale ones counted
    assert sum(m["async/dropped_stale"] for m in history) == history[-1]["async/dropped_stale_total"]
    assert all(m["trace/staleness/max"] == 0 for m in history)
    mixed = [t for t in traces if len({v for c in t["calls"] for _, v in c["versions"]}) > 1]
    if policy == "pin":
        assert not mixed  # a pinned trace never changes version
    print(
        f"\n{policy}: {started} episodes, {len(cancelled)} cancelled at stop, {len(mixed)} multi-version traces, "
        f"{history[-1]['async/dropped_stale_total']} dropped as stale"
    )
    assert all(oldest_version(t) is None or oldest_version(t) <= 4 for t in traces)


def test_async_mixed(tiny_model, tmp_path):
    _check(tmp_path, tiny_model, "mixed")
    # every committed step has exactly one metrics line, and a resumed run goes on from the committed state
    run = RunDir(tmp_path / "mixed")
    assert run.state()["iteration"] == 4 and run.state()["version"] == 4
    cfg = LoopConfig(iterations=6, group_size=2, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    acfg = AsyncConfig(max_in_flight=6, batch_traces=4, max_staleness=0, max_buffered=8)
    history = asyncio.run(_run(tiny_model, run, cfg, acfg, "mixed"))
    assert [m["version"] for m in history] == [5, 6]
    lines = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(6)) and run.state()["iteration"] == 6
    keys = [t["metadata"]["episode"] for t in read_traces(run.traces / "rollouts.jsonl")]
    assert len(keys) == len(set(keys))  # the resumed run started new groups, not the first run's again


def test_async_pin(tiny_model, tmp_path):
    _check(tmp_path, tiny_model, "pin")
