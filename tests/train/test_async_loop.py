"""Asynchronous training through the real proxy and engine: whole groups, staleness bound, one trace per episode."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from hrl.runners.rundir import RunDir
from hrl.runners.serving.stack import serving
from hrl.runners.simagent import SimulatedAgent
from hrl.train.async_loop import AsyncConfig, oldest_version, train_async
from hrl.train.loop import LoopConfig
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


def _check(tmp_path, tiny_model, policy: str, sampler: str = "uniform") -> None:
    run = RunDir(tmp_path / policy)
    cfg = LoopConfig(iterations=4, group_size=2, task_sampler=sampler, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    acfg = AsyncConfig(max_in_flight=6, batch_traces=4, max_staleness=0, max_buffered=8)
    run.create(cfg.model_dump())
    history = asyncio.run(_run(tiny_model, run, cfg, acfg, policy))
    assert [m["version"] for m in history] == [1, 2, 3, 4]
    traces = run.all_traces()
    assert set(run.trace_files()) <= set(range(5))  # one file per step, as the sync loop writes (4: after the last)
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
    assert run.state()["iteration"] == 4 and run.state()["version"] == 4
    cfg = LoopConfig(iterations=6, group_size=2, trainer=TrainerConfig(model=tiny_model, lr=1e-2))
    acfg = AsyncConfig(max_in_flight=6, batch_traces=4, max_staleness=0, max_buffered=8)
    history = asyncio.run(_run(tiny_model, run, cfg, acfg, "mixed"))
    assert [m["version"] for m in history] == [5, 6]
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
    assert [r["iteration"] for r in rows][:6] == list(range(6)) and all(r["traces"] for r in rows[:6])
    assert all(r["metrics"]["version"] == r["iteration"] + 1 for r in rows[:6])  # the logged step, per iteration
    report = _hrl("report", str(run.path), "--json")
    assert report["traces"] == n_traces and report["steps"] >= 6
    assert run.all_traces()[-1]["trace_id"] in Path(report["out"]).read_text()


def test_async_pin(tiny_model, tmp_path):
    _check(tmp_path, tiny_model, "pin", sampler="signal")


class _FlakyAgent:
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
    assert [m["version"] for m in history] == [1, 2, 3]
    traces = run.all_traces()
    broken = [t for t in traces if t["failure_reason"] == "internal_error"]
    assert broken and all("broke" in t["metadata"]["error"] for t in broken)
    assert len(traces) == history[-1]["async/started"]  # one trace per started episode, the broken ones too
    assert sum(m["train/infra_failures"] for m in history) >= 1
    assert sum(m["trace/failures/internal_error"] for m in history) == sum(m["train/infra_failures"] for m in history)
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/lr"] for m in rows] == [cfg.trainer.lr] * 3  # the learning rate of each step, in its row
