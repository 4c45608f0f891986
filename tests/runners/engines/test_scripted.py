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
    # the 40th token is due 40/200 s after admission: a late clock only delays it; the upper bound is 10× that
    assert 0.2 - 1e-6 <= took < 2.0
    assert 0.2 - 1e-6 <= busy <= took  # busy spans the admission, which lies within the timed call


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
    # two waves of two: a second-wave sequence is admitted once a first-wave one has held its slot for its 0.1 s
    assert 0.2 - 1e-6 <= took < 2.0  # (4 at once: 0.1 s); the upper bound is 10× the paced time
    # both waves decode two at once (one at a time: 1.0); below 1.5 only if a single sequence ran alone for 0.2 s
    assert 1.5 < mean_batch <= 2.0
    # the consumer blocks 50 ms after its first delta, while a token falls due every 10 ms: 5 of them at once
    assert sum(deltas) == 10 and max(deltas) >= 4


def test_prefill_is_charged_on_uncached_prompt_tokens_only(tiny_model: str) -> None:
    async def main() -> tuple[float, float, int]:
        engine = await _engine(tiny_model, decode_tps=1000, prefill_tps=1000)
        prompt = list(range(100, 400))  # 300 tokens: 0.3 s of prefill
        params = SamplingParams(max_tokens=1)
        t0 = time.monotonic()
        await collect(engine.generate("a", prompt, params))
        t1 = time.monotonic()
        await collect(engine.generate("b", [*prompt, 7, 8], params))  # the prefix is cached
        return t1 - t0, time.monotonic() - t1, engine.cached_tokens

    cold, warm, cached = asyncio.run(main())
    assert cached == 288  # the 18 full 16-token blocks of the 300-token prefix
    assert cold >= 0.3  # 300 uncached tokens at 1000/s: a sleep, so never shorter
    assert warm < 0.3  # 14 uncached tokens (0.014 s); without the cache it would sleep 302/1000 s


def test_a_turn_takes_an_id_from_the_prompt_where_it_says_match(tiny_model: str) -> None:
    """`{{match:REGEX}}`: REGEX's group at its last match in this call's decoded prompt (an element's index the
    harness numbered for this episode); `||TEXT` where it matches nothing; with neither, an engine error."""
    from transformers import AutoTokenizer

    from hrl.runners.errors import EngineError

    tok = AutoTokenizer.from_pretrained(tiny_model)
    turn = '{"click": {{match:\\[(\\d+)\\]<button||0}}}'

    async def reply(turns: list[object], prompt: str) -> str:
        engine = ScriptedEngine(ScriptedEngineConfig(model=tiny_model, turns=turns))  # type: ignore[arg-type]
        await engine.start()
        out = await collect(engine.generate("r", tok.encode(prompt), SamplingParams(max_tokens=64)))
        return tok.decode(out.token_ids, skip_special_tokens=True)

    assert asyncio.run(reply([turn], "[7]<button old [12]<button new")) == '{"click": 12}'
    assert asyncio.run(reply([turn], "no buttons here")) == '{"click": 0}'
    with pytest.raises(EngineError, match="matches nothing"):
        asyncio.run(reply(['{"click": {{match:\\[(\\d+)\\]<button}}}'], "no buttons here"))
