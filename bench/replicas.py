"""Engine replicas behind one proxy: episodes per minute with 1 against 2 replicas, and the prefix-cache hit rate
of sticky (HRW, and HRW with bounded loads) against round-robin routing, side by side in one run.

The engines are the scripted engine paced like a GPU (`decode_tps` per sequence, at most `max_batch` sequences at
once, `prefill_tps` charged on the prompt tokens past the longest prefix that replica saw before: its prefix
cache), so the CPU of this machine does not limit them. Episodes are simulated agents (`runners/simagent.py`):
`--turns` chat turns each, every turn extending the last, with tool pauses between.

    python bench/replicas.py --model DIR [--episodes 48] [--concurrency 32] [--turns 4] [--json FILE]
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

from hrl.runners.episodes import Episode, run_episodes
from hrl.runners.simagent import SimulatedAgent
from hrl.runners.stack import serving

ANSWER = " ".join(f"word{i}" for i in range(40))


async def one(model: str, replicas: int, policy: str, args: argparse.Namespace, load: float = 0) -> dict[str, Any]:
    opts = {"turns": [ANSWER], "decode_tps": args.decode_tps, "max_batch": args.max_batch,
            "prefill_tps": args.prefill_tps}  # fmt: skip
    engine_options = {"replicas": [{"engine": "scripted", "options": opts} for _ in range(replicas)], "policy": policy,
                      "load_factor": load}  # fmt: skip
    tasks = [
        {"instance_id": f"t{i}", "problem_statement": f"task {i}: " + "context " * 64} for i in range(args.episodes)
    ]
    episodes = [Episode(t, 0, 0) for t in tasks]
    async with serving(model, "replicas", engine_options=engine_options,
                       proxy_options={"default_max_tokens": 256, "open_sessions": False}) as stack:  # fmt: skip
        agent = SimulatedAgent(stack.proxy, stack.url, min_turns=args.turns, max_turns=args.turns,
                               tool_time_median_s=args.tool_s, max_tokens=256, seed=1)  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            traces = await run_episodes(agent, episodes, Path(tmp) / "traces.jsonl", args.concurrency)
            seconds = time.monotonic() - t0
        await agent.close()
        engines = [r.engine for r in stack.engine.replicas.values()]  # type: ignore[attr-defined]
        prompt = sum(e.prompt_tokens for e in engines)
        cached = sum(e.cached_tokens for e in engines)
    failed = sum(t["failure_reason"] is not None for t in traces)
    return {"replicas": replicas, "policy": policy + (f"+bounded {load:g}" if load else ""), "episodes": len(traces), "failed": failed,
            "seconds": round(seconds, 2), "episodes_per_min": round(len(traces) / seconds * 60, 1),
            "prefix_hit_rate": round(cached / max(prompt, 1), 3)}  # fmt: skip


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for replicas, policy, load in ((1, "hrw", 0), (2, "hrw", 0), (2, "hrw", 1.25), (2, "round_robin", 0)):
        rows.append(await one(args.model, replicas, policy, args, load))
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tool-s", type=float, default=0.2, help="median tool pause between turns")
    ap.add_argument("--decode-tps", type=float, default=60.0, help="tokens/s per sequence")
    ap.add_argument("--max-batch", type=int, default=8, help="sequences decoding at once per replica")
    ap.add_argument("--prefill-tps", type=float, default=4000.0, help="uncached prompt tokens/s")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = asyncio.run(main(args))
    print(f"{'replicas':>8} {'routing':>16} {'episodes/min':>13} {'prefix hits':>12} {'failed':>7}")
    for r in rows:
        print(f"{r['replicas']:>8} {r['policy']:>16} {r['episodes_per_min']:>13} {r['prefix_hit_rate']:>12} "
              f"{r['failed']:>7}")  # fmt: skip
    if args.json:
        meta = {"args": vars(args) | {"json": str(args.json), "model": "DIR"}, "load": os.getloadavg()}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
