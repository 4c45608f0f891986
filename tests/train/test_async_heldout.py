"""Held-out evaluation inside an async run, through the real proxy and embedded engine: every evaluation, those
that run beside training rollouts while the trainer publishes a newer version included, samples every token of
every episode with one policy version, the version of its step."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from hrl.runners.rollouts.simagent import SimulatedAgent
from hrl.runners.rundir import RunDir
from hrl.runners.serving.stack import serving
from hrl.train.async_loop import AsyncConfig, train_async
from hrl.train.loop import LoopConfig
from hrl.train.step import Publisher
from hrl.train.trainer import TrainerConfig

TASKS = [{"instance_id": f"t{i}", "problem_statement": p} for i, p in enumerate(["fix it", "run tests", "ls"])]
HELD_OUT = [{"instance_id": f"h{i}", "problem_statement": p} for i, p in enumerate(["add a test", "rename it"])]
ITERATIONS = 3
FULL_WAIT_S = 3.0  # full weights: how long a mid-run eval episode waits for a publish that must not come


class _Watched(Publisher):
    """The proxy as the loop's publisher, noting at each publish how many pinned (eval) sessions were open."""

    def __init__(self, proxy: Any) -> None:
        self.proxy, self.open_at_publish = proxy, []

    @property
    def engine(self) -> Any:
        return self.proxy.engine

    @property
    def stats(self) -> dict[str, float]:
        return self.proxy.stats

    def take_cpu_per_token(self) -> float | None:
        return self.proxy.take_cpu_per_token()

    async def publish(self, path: str, kind: Any, version: int | None = None) -> int:
        self.open_at_publish.append(sum(s.held_version for s in self.proxy.sessions.values()))
        return await self.proxy.publish(path, kind, version)


def _run(tiny_model: str, run: RunDir, mode: str) -> tuple[list[dict], list[int], list[str]]:
    cfg = LoopConfig(
        iterations=ITERATIONS, group_size=2, eval_every=1, eval_slice=2,
        trainer=TrainerConfig(model=tiny_model, lr=1e-2, mode=mode),
    )  # fmt: skip
    acfg = AsyncConfig(max_in_flight=4, batch_traces=4, max_staleness=8, max_buffered=8)
    run.create(cfg.model_dump())
    rng = random.Random(0)
    held_across: list[str] = []  # mid-run eval episodes held open across (lora) or up to (full) their step's publish

    async def main():
        opts = {"engine_options": {"dtype": "float32"}, "proxy_options": {"version_policy": "mixed"}}
        async with serving(tiny_model, **opts) as stack:
            publisher = _Watched(stack.proxy)

            async def publish_of_step(k: int) -> bool:
                while len(publisher.open_at_publish) <= k:  # noqa: ASYNC110 (a publish sets no event)
                    await asyncio.sleep(0.02)
                return True

            async def across_a_publish(ep, turn: int) -> None:
                """An evaluation between the first and the last, after its first turn: LoRA, wait until step
                `ep.iteration` has published its successor, so the next turn comes after it; full weights, give
                that publish FULL_WAIT_S to come (it must not: it waits for the evaluation)."""
                if not (str(ep.group_id).startswith("eval") and 0 < ep.iteration < ITERATIONS and turn == 0):
                    return
                if mode == "lora":
                    await publish_of_step(ep.iteration)
                else:
                    await asyncio.wait([asyncio.create_task(publish_of_step(ep.iteration))], timeout=FULL_WAIT_S)
                held_across.append(ep.key)

            # a continuous random reward: the two rewards of a group differ, so every step trains and publishes
            agent = SimulatedAgent(
                stack.proxy, stack.url, min_turns=2, max_turns=3, reward=lambda text: rng.random(),
                between_turns=across_a_publish,
            )  # fmt: skip
            try:
                history = await asyncio.wait_for(
                    train_async(TASKS, cfg, acfg, run, publisher, agent, eval_tasks=HELD_OUT), 300
                )
            finally:
                await agent.close()
            return history, publisher.open_at_publish

    history, open_at_publish = asyncio.run(main())
    return history, open_at_publish, held_across


def _check_one_version_per_episode(run: RunDir, history: list[dict], held_across: list[str]) -> None:
    assert [m["version"] for m in history] == [1, 2, 3]  # every step published: version k is step k's policy
    rows = run.eval_rows()
    assert sorted(rows) == [0, 1, 2, 3]
    assert all(rows[k]["eval/version"] == k for k in rows)  # the held-out table names the pinned version
    lines = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 0, 1, 1, 2, 2, 3]  # an evaluation's row before its step's (wandb order)
    assert len(held_across) == 2 * len(HELD_OUT)  # the two mid-run evaluations, each of their episodes
    for step in rows:
        traces = [json.loads(line) for line in run.eval_trace_file(step).read_text().splitlines()]
        assert len(traces) == len(HELD_OUT)  # the whole set, or a slice of 2 of the 2
        for t in traces:
            assert t["failure_reason"] is None and len(t["calls"]) >= 2, t.get("calls", [{}])[-1].get("error")
            versions = {v for c in t["calls"] for _, v in c["versions"]}
            assert versions == {step}, (t["metadata"]["episode"], [c["versions"] for c in t["calls"]])


def test_async_heldout_episodes_keep_one_version_across_a_lora_publish(tiny_model, tmp_path):
    run = RunDir(tmp_path / "run")
    history, open_at_publish, held_across = _run(tiny_model, run, "lora")
    _check_one_version_per_episode(run, history, held_across)
    assert open_at_publish == [0, len(HELD_OUT), len(HELD_OUT)]  # steps 1 and 2 published under their evaluation


def test_async_heldout_holds_a_full_weight_publish_until_the_evaluation_ends(tiny_model, tmp_path):
    run = RunDir(tmp_path / "run")
    history, open_at_publish, held_across = _run(tiny_model, run, "full")
    _check_one_version_per_episode(run, history, held_across)
    assert open_at_publish == [0, 0, 0]  # no eval session open at any publish: each waited for its evaluation
