"""Sync vs async training wall time for the same number of trained traces, on a heavy-tailed agent workload.

Simulated agents (runners/simagent.py) talk to the real proxy and the real embedded engine: 1–30 turns per
episode, lognormal tool/think time (σ = 1) between turns. Both modes train the same number of traces with the
same trainer, engine and episode concurrency; the async mode keeps that many episodes in flight and trains on
whole groups as they finish, for each version policy.

    python bench/async_vs_sync.py --model DIR [--iterations 4] [--batch 16] [--tool-median 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hrl.runners.rundir import RunDir
from hrl.runners.simagent import SimulatedAgent
from hrl.runners.stack import Stack, serving
from hrl.train.async_loop import AsyncConfig, train_async
from hrl.train.loop import LoopConfig, train
from hrl.train.trainer import TrainerConfig

TASKS = [{"instance_id": f"t{i}", "problem_statement": f"task {i}: fix the failing test"} for i in range(32)]


async def one(a: argparse.Namespace, mode: str, policy: str, workdir: Path) -> dict[str, Any]:
    opts = {"engine_options": {"dtype": "float32"}, "proxy_options": {"version_policy": policy}}
    async with serving(a.model, **opts) as stack:
        return await _measure(a, mode, policy, workdir, stack)


async def _measure(a: argparse.Namespace, mode: str, policy: str, workdir: Path, stack: Stack) -> dict[str, Any]:
    engine, proxy = stack.engine, stack.proxy
    agent = SimulatedAgent(
        proxy,
        stack.url,
        seed=a.seed,
        min_turns=1,
        max_turns=30,
        tool_time_median_s=a.tool_median,
        tool_time_sigma=1.0,
        max_tokens=a.tokens,
    )
    groups = a.batch // a.group
    cfg = LoopConfig(
        iterations=a.iterations,
        tasks_per_iteration=groups,
        group_size=a.group,
        concurrency=a.batch,
        seed=a.seed,
        trainer=TrainerConfig(model=a.model, mode="lora", lr=1e-3, micro_batch=16),
    )
    run = RunDir(workdir / f"{mode}-{policy}")
    run.create(cfg.model_dump())
    t0, busy0 = time.monotonic(), engine.busy_s
    try:
        if mode == "sync":
            history = await train(TASKS, cfg, run, engine, agent)
        else:
            acfg = AsyncConfig(
                max_in_flight=a.in_flight or a.batch, batch_traces=a.batch, max_staleness=a.staleness,
                max_buffered=2 * a.batch,
            )  # fmt: skip
            history = await train_async(TASKS, cfg, acfg, run, proxy.publish, agent)
        wall = time.monotonic() - t0
    finally:
        await agent.close()
    return {
        "mode": mode,
        "policy": policy,
        "wall_s": wall,
        "trained_traces": sum(m["trace/count"] for m in history),
        "engine_busy_frac": (engine.busy_s - busy0) / wall,
        "dropped_stale": history[-1].get("async/dropped_stale_total", 0),
        "proxy_pause_s": proxy.stats["proxy/pause_s"],
    }


async def main(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [await one(a, "sync", "mixed", Path(tmp))]
        for policy in ("mixed", "pin"):
            rows.append(await one(a, "async", policy, Path(tmp)))
    sync = rows[0]["wall_s"]
    for r in rows:
        r["speedup_vs_sync"] = sync / r["wall_s"]
    json.dump({"config": vars(a), "results": rows}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16, help="traces per update = episodes in flight")
    ap.add_argument("--group", type=int, default=4, help="GRPO group size")
    ap.add_argument("--tool-median", type=float, default=0.5, help="median tool/think time per turn, seconds")
    ap.add_argument("--tokens", type=int, default=16, help="max tokens per model turn")
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=0, help="async: episodes kept in flight (default: --batch)")
    ap.add_argument("--seed", type=int, default=0)
    asyncio.run(main(ap.parse_args()))
