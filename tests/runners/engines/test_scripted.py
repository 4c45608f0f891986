"""The scripted engine paced like a GPU engine: tokens due on the clock, a batch ceiling, prefill cost, busy time."""

from __future__ import annotations

import asyncio
import time

import pytest

from hrl.runners.engines import SamplingParams, collect
from hrl.runners.engines.scripted import ScriptedEngine, ScriptedEngineConfig

TURN = "one two three four five six seven eight nine ten " * 2


async def _engine(model: str, **opts: object) -> ScriptedEngine:
    engine = ScriptedEngine(ScriptedEngineConfig(model=model, turns=[TURN], **opts))
    await engine.start()
    return engine


def test_paced_decoding_takes_its_time_and_hands_over_every_token(tiny_model: str) -> None:
    async def main() -> tuple[float, list[int], list[int], float]:
        engine = await _engine(tiny_model, decode_tps=200)
        plain = await _engine(tiny_model)
        t0 = time.monotonic()
        paced = await collect(engine.generate("r", [1, 2, 3], SamplingParams(max_tokens=40)))
        took = time.monotonic() - t0
        ref = await collect(plain.generate("r", [1, 2, 3], SamplingParams(max_tokens=40)))
        return took, paced.token_ids, ref.token_ids, engine.busy

    took, paced, ref, busy = asyncio.run(main())
    assert paced == ref and len(paced) == 40  # the same ids, however they are cut into deltas
    assert 0.18 <= took < 1.0  # 40 tokens at 200 tokens/s
    assert busy == pytest.approx(took, abs=0.05)


def test_batch_ceiling_queues_sequences_and_late_wakeups_catch_up(tiny_model: str) -> None:
    async def main() -> tuple[float, float, list[int]]:
        engine = await _engine(tiny_model, decode_tps=100, max_batch=2)
        params = SamplingParams(max_tokens=10)  # 0.1 s each
        t0 = time.monotonic()
        gens = await asyncio.gather(*[collect(engine.generate(f"r{i}", [1, 2], params)) for i in range(4)])
        took = time.monotonic() - t0
        deltas = []  # a consumer that blocks the loop for 50 ms gets the due tokens in one delta
        async for d in engine.generate("slow", [1, 2], params):
            deltas.append(len(d.token_ids))
            if len(deltas) == 1:
                time.sleep(0.05)  # noqa: ASYNC251 - blocking the loop is the point: a late wake-up
        return took, engine.seq_s / engine.busy_s, deltas, [len(g.token_ids) for g in gens]

    took, mean_batch, deltas, lengths = asyncio.run(main())
    assert lengths == [10] * 4
    assert 0.19 <= took < 0.5  # two waves of two
    assert 1.5 < mean_batch <= 2.0
    assert sum(deltas) == 10 and max(deltas) >= 4


def test_prefill_is_charged_on_uncached_prompt_tokens_only(tiny_model: str) -> None:
    async def main() -> tuple[float, float]:
        engine = await _engine(tiny_model, decode_tps=1000, prefill_tps=1000)
        prompt = list(range(100, 400))  # 300 tokens: 0.3 s of prefill
        params = SamplingParams(max_tokens=1)
        t0 = time.monotonic()
        await collect(engine.generate("a", prompt, params))
        t1 = time.monotonic()
        await collect(engine.generate("b", [*prompt, 7, 8], params))  # the prefix is cached
        return t1 - t0, time.monotonic() - t1

    cold, warm = asyncio.run(main())
    assert cold >= 0.3
    assert warm < 0.1
