"""Sync vs async training wall time for the same number of trained traces, on a heavy-tailed agent workload.

Simulated agents (runners/rollouts/simagent.py) talk to the real proxy: 1–30 turns per episode, lognormal tool/think
time (σ = 1) between turns. The engine is the scripted one paced like a GPU engine (--decode-tps per sequence, a
--max-batch ceiling, --prefill-tps; decoding costs no CPU), so the figure measures the loop's design and not this
machine's cores; `--engine embedded` runs the real CPU model instead. Both modes train the same number of traces
(N = --batch per update) with the same trainer and engine; sync runs N episodes at a time and waits for the last,
async keeps M = --in-flight episodes going and trains on whole groups as they finish, for each version policy.
Reported per mode: wall time, the speedup over sync, engine busy time (≥ 1 sequence decoding) and batch occupancy.
`--staleness-mode drop mask` runs async once per `async.staleness` and sets them side by side: groups trained whole,
traces dropped as stale, tokens trained (loss tokens) and tokens masked, wall time (`--no-sync`: async rows only).

    python bench/async_vs_sync.py --model DIR [--iterations 3] [--batch 16] [--in-flight 64] [--tool-median 0.2]
    python bench/async_vs_sync.py --model DIR --no-sync --script vary --staleness 0 --staleness-mode drop mask
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hrl.runners.rollouts.simagent import SimulatedAgent
from hrl.runners.rundir import RunDir
from hrl.runners.serving.stack import Stack, serving
from hrl.train.async_loop import AsyncConfig, train_async
from hrl.train.loop import LoopConfig, train
from hrl.train.trainer import TrainerConfig

TASKS = [{"instance_id": f"t{i}", "problem_statement": f"task {i}: fix the failing test"} for i in range(32)]


async def one(a: argparse.Namespace, mode: str, policy: str, workdir: Path, stale: str = "drop") -> dict[str, Any]:
    engine_options: dict[str, Any] = {"dtype": "float32"}
    if a.engine == "scripted":  # long turns: every call samples max_tokens
        engine_options = {"turns": _script(a), "decode_tps": a.decode_tps, "max_batch": a.max_batch,
                          "prefill_tps": a.prefill_tps, "publish_delay_s": a.publish_delay}  # fmt: skip
    opts = {"engine_options": engine_options, "proxy_options": {"version_policy": policy}}
    async with serving(a.model, a.engine, **opts) as stack:
        return await _measure(a, mode, policy, workdir, stack, stale)


async def _measure(
    a: argparse.Namespace, mode: str, policy: str, workdir: Path, stack: Stack, stale: str
) -> dict[str, Any]:
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
    run = RunDir(workdir / f"{mode}-{policy}-{stale}")
    run.create(cfg.model_dump())
    t0, busy0, seq0 = time.monotonic(), _busy(engine), getattr(engine, "seq_s", 0.0)
    try:
        if mode == "sync":
            history = await train(TASKS, cfg, run, proxy, agent)
        else:
            acfg = AsyncConfig(
                max_in_flight=a.in_flight or a.batch, batch_traces=a.batch, max_staleness=a.staleness,
                staleness=stale, max_buffered=max(2 * a.batch, a.in_flight),
            )  # fmt: skip
            history = await train_async(TASKS, cfg, acfg, run, proxy, agent)
        wall = time.monotonic() - t0
    finally:
        await agent.close()
    groups = -(-a.batch // a.group) * len(history)  # a step takes whole groups until it has --batch traces
    return {
        "mode": mode,
        "policy": policy,
        "staleness": stale if mode == "async" else None,
        "wall_s": wall,
        "trained_traces": sum(m["trace/count"] for m in history),
        "groups": groups,
        "groups_whole": groups - sum(m.get("async/stale_groups", 0) for m in history),
        "loss_tokens": sum(m.get("train/loss_tokens", 0) for m in history),
        "masked_tokens": sum(m.get("async/masked_tokens", 0) for m in history),
        "engine_busy_frac": (_busy(engine) - busy0) / wall,
        "batch_occupancy": (engine.seq_s - seq0) / wall / a.max_batch if hasattr(engine, "seq_s") else None,
        "proxy_cpu_us_per_token": [round(m.get("proxy/cpu_us_per_token", 0), 1) for m in history],
        "dropped_stale": history[-1].get("async/dropped_stale_total", 0),
        "proxy_pause_s": proxy.stats["proxy/pause_s"],
    }


def _script(a: argparse.Namespace) -> list[str]:
    """The scripted engine's turns, each long enough to sample --tokens. `same`: one word throughout, so every reply
    scores alike, every group agrees and no step trains or publishes. `vary`: the word cycles with the turn (letter
    rewards 1/5, 2/4, 0/4), so the reward follows the turn count: groups carry signal, steps train and publish, and
    episodes in flight across a publish grow stale (what --staleness-mode compares)."""
    words = ["step"] if a.script == "same" else ["step", "eel", "run"]
    return [f"{words[i % len(words)]} " * (4 * a.tokens) for i in range(30 if a.script == "vary" else 1)]


def _busy(engine: Any) -> float:
    return float(getattr(engine, "busy", engine.busy_s))  # the scripted engine counts its running interval too


async def main(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [] if a.no_sync else [await one(a, "sync", "mixed", Path(tmp))]
        for policy in a.policies:
            for stale in a.staleness_mode:
                rows.append(await one(a, "async", policy, Path(tmp), stale))
    sync = None if a.no_sync else rows[0]["wall_s"]
    for r in rows:
        r["speedup_vs_sync"] = sync and sync / r["wall_s"]
    json.dump({"config": vars(a), "load": os.getloadavg(), "results": rows}, sys.stdout, indent=2)
    print()
    for r in rows:
        vs = f"x{r['speedup_vs_sync']:.2f}" if r["speedup_vs_sync"] else "-"
        print(f"{r['mode']:5s} {r['policy']:5s} {r['staleness'] or '':4s} wall {r['wall_s']:6.1f} s  "
              f"{vs} vs sync  engine busy {r['engine_busy_frac']:.0%}  "
              f"batch occupancy {r['batch_occupancy'] or 0:.0%}  traces {r['trained_traces']}  "
              f"groups whole {r['groups_whole']}/{r['groups']}  dropped stale {r['dropped_stale']}  "
              f"tokens trained {r['loss_tokens']:.0f}  masked {r['masked_tokens']:.0f}", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", default="scripted", choices=["scripted", "embedded"])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="N: traces per update (sync: episodes in flight)")
    ap.add_argument("--group", type=int, default=4, help="GRPO group size")
    ap.add_argument("--tool-median", type=float, default=0.2, help="median tool/think time per turn, seconds")
    ap.add_argument("--tokens", type=int, default=16, help="max tokens per model turn")
    ap.add_argument("--decode-tps", type=float, default=100, help="scripted: tokens/s per sequence")
    ap.add_argument("--max-batch", type=int, default=64, help="scripted: most sequences decoding at once")
    ap.add_argument("--prefill-tps", type=float, default=50000, help="scripted: prompt tokens/s of prefill")
    ap.add_argument("--publish-delay", type=float, default=0.2, help="scripted: seconds a weight publish takes")
    ap.add_argument("--policies", nargs="+", default=["mixed"], choices=["mixed", "pin"], help="async policies")
    ap.add_argument("--staleness", type=int, default=2, help="async.max_staleness, in versions")
    ap.add_argument("--staleness-mode", nargs="+", default=["drop"], choices=["drop", "mask"], help="async.staleness")
    ap.add_argument("--script", default="same", choices=["same", "vary"], help="scripted: turns (see _script)")
    ap.add_argument("--no-sync", action="store_true", help="async rows only (no sync baseline)")
    ap.add_argument("--in-flight", type=int, default=64, help="M: async episodes kept in flight (0: --batch)")
    ap.add_argument("--seed", type=int, default=0)
    asyncio.run(main(ap.parse_args()))
