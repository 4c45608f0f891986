"""Continuous batching in the embedded engine: a request that arrives mid-decode joins the running batch (its first
token long before the running generation ends) and gets the ids and logprobs it gets alone; rows that leave disturb
no other; a request of other weights waits for the running batch to drain and is never overtaken."""

from __future__ import annotations

import asyncio

from hrl.runners.engines import SamplingParams, collect, make_engine
from tests.models import chat_prompt

LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)


def run(coro):
    return asyncio.run(coro)


async def _started(model: str, **options):
    engine = make_engine("embedded", model, dtype="float32", **options)
    await engine.start()
    return engine


class _Log:
    """Consumes streams as they come, in one shared order: who got which delta when."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first_at: dict[str, dict[str, int]] = {}  # name -> the other streams' token counts at its first token
        self.last_at: dict[str, dict[str, int]] = {}  # name -> the same at its last delta

    async def consume(self, name: str, stream, started: asyncio.Event | None = None, after: int = 0):
        ids, logprobs, versions = [], [], []
        self.counts[name] = 0
        async for d in stream:
            if d.token_ids and not ids:
                self.first_at[name] = dict(self.counts)
            ids += d.token_ids
            logprobs += d.logprobs
            versions += [d.version] * len(d.token_ids)
            self.counts[name] = len(ids)
            if started is not None and len(ids) >= after:
                started.set()
            if d.finish_reason is not None:
                self.last_at[name] = dict(self.counts)
        return ids, logprobs, versions


async def _alone(engine, name: str, prompt: list[int], params: SamplingParams):
    gen = await collect(engine.generate(name, prompt, params))
    return gen.token_ids, gen.logprobs


def _close(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tol


def test_a_request_arriving_mid_decode_joins_and_matches_alone(tiny_model):
    """A decodes 200 tokens; B (a prompt longer than A's, so A's rows get padded) and C (shorter) arrive while it
    runs. Each gets its first token while A still has most of its tokens to go, and the greedy ids of each, A's
    included (B and C leave mid-way), equal those alone, logprobs within 1e-4 (float32). Fails on static batching:
    B and C would wait for A's 200 tokens."""
    p_a = chat_prompt(tiny_model, "fix it")
    p_b = chat_prompt(tiny_model, "run the tests please, then read the failing one and report back what broke " * 2)
    p_c = chat_prompt(tiny_model, "ls")
    short = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    assert len(p_b) > len(p_a) + 10 > len(p_c) + 10

    async def go():
        engine = await _started(tiny_model)
        try:
            alone = {
                "a": await _alone(engine, "a0", p_a, LONG),
                "b": await _alone(engine, "b0", p_b, short),
                "c": await _alone(engine, "c0", p_c, short),
            }
            log, a_running, b_running = _Log(), asyncio.Event(), asyncio.Event()
            task_a = asyncio.create_task(log.consume("a", engine.generate("a", p_a, LONG), a_running, after=5))
            await a_running.wait()
            task_b = asyncio.create_task(log.consume("b", engine.generate("b", p_b, short), b_running, after=3))
            await b_running.wait()
            task_c = asyncio.create_task(log.consume("c", engine.generate("c", p_c, short)))
            together = dict(zip("abc", await asyncio.gather(task_a, task_b, task_c), strict=True))
            return alone, together, log
        finally:
            await engine.close()

    alone, together, log = run(go())
    assert log.first_at["b"]["a"] < 100, log.first_at  # A had over half its tokens to go when B's first came
    assert log.first_at["c"]["a"] < 100, log.first_at
    assert log.last_at["b"]["a"] < LONG.max_tokens  # B left the batch while A still ran
    for name in "abc":
        ids, logprobs, _ = together[name]
        assert ids == alone[name][0], name
        assert _close(logprobs, alone[name][1]), name


def test_static_mode_makes_the_joiner_wait(tiny_model):
    """`continuous: false` (kept for comparison): B's first token comes after A's last, as before."""
    prompt = chat_prompt(tiny_model)

    async def go():
        engine = await _started(tiny_model, continuous=False)
        try:
            log, a_running = _Log(), asyncio.Event()
            task_a = asyncio.create_task(log.consume("a", engine.generate("a", prompt, LONG), a_running, after=5))
            await a_running.wait()
            b = await log.consume("b", engine.generate("b", prompt, SamplingParams(max_tokens=4, temperature=0.0)))
            await task_a
            return log, b
        finally:
            await engine.close()

    log, b = run(go())
    assert log.first_at["b"]["a"] == LONG.max_tokens
    assert len(b[0]) == 4


def test_max_batch_size_caps_the_running_batch(tiny_model):
    prompt = chat_prompt(tiny_model)

    async def go():
        engine = await _started(tiny_model, max_batch_size=1)
        try:
            log, a_running = _Log(), asyncio.Event()
            task_a = asyncio.create_task(log.consume("a", engine.generate("a", prompt, LONG), a_running, after=5))
            await a_running.wait()
            await log.consume("b", engine.generate("b", prompt, SamplingParams(max_tokens=4, temperature=0.0)))
            await task_a
            return log
        finally:
            await engine.close()

    assert run(go()).first_at["b"]["a"] == LONG.max_tokens


def test_other_weights_wait_for_the_batch_to_drain_and_are_not_overtaken(tiny_model, tiny_lora):
    """After a LoRA publish, a live batch runs A; P (pinned to version 0) arrives, then L (live). P waits until A
    ends (the batch is the other key's); L, though it has A's key, does not overtake P: it starts after P's first
    token. Each token records its version; P's ids equal P alone."""
    prompt = chat_prompt(tiny_model)
    short = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def go():
        engine = await _started(tiny_model)
        try:
            await engine.publish(tiny_lora, "lora")
            p_alone = (await collect(engine.generate("p0", prompt, short, version=0))).token_ids
            log, a_running = _Log(), asyncio.Event()
            task_a = asyncio.create_task(log.consume("a", engine.generate("a", prompt, LONG), a_running, after=5))
            await a_running.wait()
            task_p = asyncio.create_task(log.consume("p", engine.generate("p", prompt, short, version=0)))
            while not any(r.rid == "p" for r in engine._pending):  # noqa: ASYNC110 (no event for a queued request)
                await asyncio.sleep(0.001)
            task_l = asyncio.create_task(log.consume("l", engine.generate("l", prompt, short)))
            a, p, live = await asyncio.gather(task_a, task_p, task_l)
            return log, p_alone, a, p, live
        finally:
            await engine.close()

    log, p_alone, a, p, live = run(go())
    assert log.first_at["p"]["a"] == LONG.max_tokens  # P waited for the live batch to drain
    assert log.first_at["l"]["p"] >= 1  # L came after P's first token, though A's batch had room for it
    assert p[0] == p_alone and set(p[2]) == {0}
    assert set(a[2]) == {1} and set(live[2]) == {1}


def test_abort_and_publish_reach_a_joined_request(tiny_model, tiny_lora):
    """A request that joined a running batch is aborted like any (abort delta) and follows a publish mid-generation
    (its later tokens record the new version) while the others go on."""
    prompt = chat_prompt(tiny_model)
    sampled = SamplingParams(max_tokens=150, temperature=1.0, seed=3, ignore_eos=True)

    async def go():
        engine = await _started(tiny_model)
        try:
            log, a_running, b_running = _Log(), asyncio.Event(), asyncio.Event()
            task_a = asyncio.create_task(log.consume("a", engine.generate("a", prompt, LONG), a_running, after=5))
            await a_running.wait()
            task_b = asyncio.create_task(log.consume("b", engine.generate("b", prompt, sampled), b_running, after=2))
            x = engine.generate("x", prompt, SamplingParams(max_tokens=10_000, temperature=1.0, seed=1))
            await b_running.wait()
            await anext(x)
            await engine.pause()  # all three mid-generation: the publish lands between two of their tokens
            await engine.publish(tiny_lora, "lora")
            await engine.abort("x")
            await engine.resume()
            aborted = await collect(x)
            a, b = await asyncio.gather(task_a, task_b)
            return aborted, a, b
        finally:
            await engine.close()

    aborted, a, b = run(go())
    assert aborted.finish_reason == "abort"
    assert len(a[0]) == LONG.max_tokens and len(b[0]) == sampled.max_tokens
    for _, _, versions in (a, b):
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)


def test_a_cache_that_cannot_merge_runs_static(tmp_path):
    """A sliding-window model's cache layers cannot be merged: requests wait as in static batching, and still get
    their ids alone."""
    from hrl.train.tiny import build_tiny_model
    from hrl.train.tiny.model import TinyModelConfig

    model = str(build_tiny_model(tmp_path / "sw", seed=0, cfg=TinyModelConfig(sliding_window=16)))
    prompt = chat_prompt(model)

    async def go():
        engine = await _started(model)
        try:
            alone = await collect(engine.generate("b0", prompt, SamplingParams(max_tokens=4, temperature=0.0)))
            log, a_running = _Log(), asyncio.Event()
            task_a = asyncio.create_task(log.consume("a", engine.generate("a", prompt, LONG), a_running, after=5))
            await a_running.wait()
            b = await log.consume("b", engine.generate("b", prompt, SamplingParams(max_tokens=4, temperature=0.0)))
            await task_a
            return log, alone.token_ids, b[0]
        finally:
            await engine.close()

    log, alone, b = run(go())
    assert log.first_at["b"]["a"] == LONG.max_tokens
    assert b == alone
