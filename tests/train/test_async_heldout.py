"""Held-out evaluation inside an async run, through the real proxy and embedded engine: every evaluation, those
that run beside training rollouts while a newer version is published included, samples every token of every
episode with one policy version, the version of its step."""

from __future__ import annotations

import asyncio
import json
import random

from hrl.runners.rundir import RunDir
from hrl.runners.serving.stack import serving
from hrl.runners.simagent import SimulatedAgent
from hrl.train.async_loop import AsyncConfig, train_async
from hrl.train.loop import LoopConfig
from hrl.train.trainer import TrainerConfig

TASKS = [{"instance_id": f"t{i}", "problem_statement": p} for i, p in enumerate(["fix it", "run tests", "ls"])]
HELD_OUT = [{"instance_id": f"h{i}", "problem_statement": p} for i, p in enumerate(["add a test", "rename it"])]
ITERATIONS = 3


def test_async_heldout_episodes_keep_one_version_across_a_publish(tiny_model, tmp_path):
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(
        iterations=ITERATIONS, group_size=2, eval_every=1, eval_slice=2,
        trainer=TrainerConfig(model=tiny_model, lr=1e-2),
    )  # fmt: skip
    acfg = AsyncConfig(max_in_flight=4, batch_traces=4, max_staleness=8, max_buffered=8)
    run.create(cfg.model_dump())
    rng = random.Random(0)
    held_across: list[str] = []  # mid-run eval episodes held open until the engine served a newer version

    async def main():
        opts = {"engine_options": {"dtype": "float32"}, "proxy_options": {"version_policy": "mixed"}}
        async with serving(tiny_model, **opts) as stack:

            async def across_a_publish(ep, turn: int) -> None:
                """An evaluation between the first and the last: wait after its first turn until step
                `ep.iteration` has published its successor, so the next turn comes after that publish."""
                if str(ep.group_id).startswith("eval") and 0 < ep.iteration < ITERATIONS and turn == 0:
                    while stack.proxy.engine.version <= ep.iteration:  # noqa: ASYNC110 (a publish sets no event)
                        await asyncio.sleep(0.02)
                    held_across.append(ep.key)

            # a continuous random reward: the two rewards of a group differ, so every step trains and publishes
            agent = SimulatedAgent(
                stack.proxy, stack.url, min_turns=2, max_turns=3, reward=lambda text: rng.random(),
                between_turns=across_a_publish,
            )  # fmt: skip
            try:
                return await asyncio.wait_for(
                    train_async(TASKS, cfg, acfg, run, stack.proxy, agent, eval_tasks=HELD_OUT), 300
                )
            finally:
                await agent.close()

    history = asyncio.run(main())
    assert [m["version"] for m in history] == [1, 2, 3]  # every step published: version k is step k's policy
    rows = run.eval_rows()
    assert sorted(rows) == [0, 1, 2, 3]
    assert all(rows[k]["eval/version"] == k for k in rows)  # the held-out table names the pinned version
    lines = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 0, 1, 1, 2, 2, 3]  # an evaluation's row before its step's (wandb order)
    assert len(held_across) == 2 * len(HELD_OUT)  # the two mid-run evaluations, each episode across a publish
    for step in rows:
        traces = [json.loads(line) for line in run.eval_trace_file(step).read_text().splitlines()]
        assert len(traces) == (len(HELD_OUT) if step in (0, ITERATIONS) else cfg.eval_slice)
        for t in traces:
            assert len(t["calls"]) >= 2, t["failure_reason"]
            versions = {v for c in t["calls"] for _, v in c["versions"]}
            assert versions == {step}, (t["metadata"]["episode"], [c["versions"] for c in t["calls"]])
