"""Sandbox acquisition: a sandbox per episode vs a warm pool vs one sandbox reused per GRPO group, side by side.

The demo recipe's tasks, the real mini-swe-agent CLI in `local` sandboxes (bubblewrap where it runs), the real proxy
and the demo's test verifier (grading in a fresh sandbox, as always); the engine is the scripted one (a look at the
file, then submit), so the model costs nothing and what differs between the rows is the sandbox path alone. Each
row runs the same episodes (--tasks tasks x --group episodes, --concurrency at once) and reports episodes per
minute, sandbox acquire p50/p95 (asking for a sandbox to holding it at the task's start state: created or pooled
and the task laid out, or reset and checked), reset p50 for the reused ones, how many sandboxes were created and the reset mismatches.

Each row also gives the harness's start-up p50 (launching the CLI to its first model call, `harness_start_s`).

    python bench/sandboxes.py [--model DIR] [--sandbox local|docker] [--tasks 2] [--group 4] [--concurrency 2]
                              [--warm 2] [--first-batch]

--first-batch times a run's first batch instead: the pool has made nothing yet and learns the spec from it.
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

from hrl.runners.agents.mini_swe_agent import SUBMIT_COMMAND
from hrl.runners.rollouts.episodes import Episode, run_episodes
from hrl.runners.rollouts.rollout import AgentRollouts, RolloutConfig
from hrl.runners.serving.stack import serving
from hrl.runners.summary import percentile

DEMO = Path(__file__).resolve().parents[1] / "recipes" / "demo"
TURNS = [
    {"tool_calls": [{"name": "bash", "arguments": {"command": "cat rules.py"}}]},
    {"tool_calls": [{"name": "bash", "arguments": {"command": SUBMIT_COMMAND}}]},
]


async def one(a: argparse.Namespace, name: str, warm: int, reuse: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    cfg = RolloutConfig(agent="mini-swe-agent", sandbox=a.sandbox, time_budget_s=120, warm_sandboxes=warm, reuse=reuse,
                        run_id=f"bench-sbx-{name}-{os.getpid()}", agent_options={"step_limit": 5})  # fmt: skip
    async with serving(a.model, "scripted", engine_options={"turns": TURNS}) as stack:
        rollouts = AgentRollouts(stack, cfg, verifier={"name": "tests", "timeout_s": 60, "run_id": cfg.run_id})
        await asyncio.to_thread(rollouts.prepare)
        episodes = [Episode(t, k, 0) for t in tasks for k in range(a.group)]
        with tempfile.TemporaryDirectory() as tmp:
            if not a.first_batch:
                # one untimed episode of another group first, in every row: the agent's first start, and the pool
                # learning the spec from it (as in a long run, where only the run's first episode misses)
                await run_episodes(rollouts, [Episode(tasks[0], 0, -1)], Path(tmp) / "warmup.jsonl", 1)
                await rollouts.pool.settle()
            created, warmed = rollouts.pool.counts["created"], rollouts.pool.counts["warmed"]
            started = time.monotonic()
            traces = await run_episodes(rollouts, episodes, Path(tmp) / "t.jsonl", a.concurrency)
            wall = time.monotonic() - started
        counts = dict(rollouts.pool.counts)
        await rollouts.close()
    meta = [t.get("metadata") or {} for t in traces]
    acquire = sorted(float(m["sandbox_acquire_s"]) for m in meta if "sandbox_acquire_s" in m)
    reset = sorted(float(m["sandbox_reset_s"]) for m in meta if "sandbox_reset_s" in m)
    start = sorted(float(m["harness_start_s"]) for m in meta if "harness_start_s" in m)
    return {
        "mode": name,
        "episodes": len(traces),
        "failed": sum(1 for t in traces if t.get("failure_reason")),
        "episodes_per_min": round(60 * len(traces) / wall, 2),
        "acquire_p50_s": percentile(acquire, 0.5),
        "acquire_p95_s": percentile(acquire, 0.95),
        "reset_p50_s": percentile(reset, 0.5) if reset else None,
        "harness_start_p50_s": percentile(start, 0.5) if start else None,
        "created_by_episodes": counts.get("created", 0) - created - (counts.get("warmed", 0) - warmed),
        "pooled": counts.get("pooled", 0),
        "reused": counts.get("reused", 0),
        "reset_mismatch": counts.get("reset_mismatch", 0),
    }


def main(a: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in (DEMO / "tasks.jsonl").read_text().splitlines()[: a.tasks]]
    modes = [("warm 0", 0, "none"), (f"warm {a.warm}", a.warm, "none"), ("reuse group", 0, "group")]
    results = [asyncio.run(one(a, name, warm, reuse, rows)) for name, warm, reuse in modes]
    head = f"{'mode':<12} {'eps':>4} {'fail':>4} {'eps/min':>8} {'acq p50':>8} {'acq p95':>8} {'reset p50':>9} "
    print(
        f"sandbox: {a.sandbox}\n"
        + head
        + f"{'start p50':>9} {'created':>7} {'pooled':>6} {'reused':>6} {'mismatch':>8}"
    )
    for r in results:
        reset, start = (("-" if r[k] is None else f"{r[k]:.3f}") for k in ("reset_p50_s", "harness_start_p50_s"))
        print(f"{r['mode']:<12} {r['episodes']:>4} {r['failed']:>4} {r['episodes_per_min']:>8.2f} "
              f"{r['acquire_p50_s']:>8.3f} {r['acquire_p95_s']:>8.3f} {reset:>9} {start:>9} "
              f"{r['created_by_episodes']:>7} {r['pooled']:>6} {r['reused']:>6} {r['reset_mismatch']:>8}")  # fmt: skip
    if a.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(Path.home() / ".cache" / "hrl" / "models" / "tiny"))
    p.add_argument("--sandbox", choices=["local", "docker"], default="local")
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--warm", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--first-batch",
        action="store_true",
        help="time a run's first batch: no untimed episode first, the pool learns the spec from the batch",
    )
    sys.exit(main(p.parse_args()))
