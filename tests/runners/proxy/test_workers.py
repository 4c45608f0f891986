"""N proxy workers with session affinity: each session lives in the worker that owns its token, and the traces are
the ones a single proxy writes."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

from hrl.runners.proxy.tokens import owned_token, owner
from hrl.runners.serving.workers import WorkerPool
from hrl.runners.trace import call_prompt_ids, read_traces
from tests.proxy_helpers import CONTROL_TOKEN, running_proxy

SCRIPT = ["First answer, with a few words.", "Second answer: done.", "Third."]


def test_owned_tokens_belong_to_their_worker() -> None:
    for n in (1, 2, 3, 8):
        for i in range(n):
            assert owner(owned_token(i, n), n) == i
    tokens = [owned_token(0, 1) for _ in range(400)]
    assert {owner(t, 4) for t in tokens} == {0, 1, 2, 3}  # spread over all workers


async def _conversation(http: aiohttp.ClientSession, base_url: str, k: int) -> None:
    msgs = [{"role": "user", "content": f"task {k}: fix the failing test"}]
    for turn in range(3):
        body = {"messages": msgs, "max_tokens": 32, "stream": bool(turn % 2)}
        async with http.post(f"{base_url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            if body["stream"]:
                events = [json.loads(line[6:]) async for line in r.content if line.startswith(b"data: {")]
                text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
            else:
                text = (await r.json())["choices"][0]["message"]["content"]
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"go on ({turn})"}]


def _ids(trace: dict) -> list[tuple[list[int], list[int]]]:
    return [(call_prompt_ids(trace, i), c["response_ids"]) for i, c in enumerate(trace["calls"])]


def _free_ports(n: int) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65535 and all(_free(base + i) for i in range(n)):
            return base
    pytest.fail("no free port range")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_two_workers_keep_each_session_in_one_worker_and_write_the_same_traces(tiny_model: str, tmp_path) -> None:
    opts = {"turns": SCRIPT}
    port = _free_ports(2)
    traces = str(tmp_path / "traces")

    async def pooled(pool: WorkerPool) -> tuple[list[str], int, int]:
        async with aiohttp.ClientSession() as http:
            sessions = [await pool.register(http, {"task_id": f"t{k}"}) for k in range(4)]
            await asyncio.gather(*[_conversation(http, url, k) for k, (_, url) in enumerate(sessions)])
            token0 = sessions[0][0]
            other = pool.url((owner(token0, 2) + 1) % 2)  # the worker that does not own it
            body = {"messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{other}/s/{token0}/v1/chat/completions", json=body) as r:
                wrong_worker = r.status
            async with http.post(f"{other}/sessions", json={"token": token0}, headers=pool.control) as r:
                foreign = r.status
            child = {"parent": token0, "name": "helper", "trainable": False}
            async with http.post(f"{pool.url_for(token0)}/sessions", json=child, headers=pool.control) as r:
                assert r.status == 201
                assert owner((await r.json())["token"], 2) == owner(token0, 2)  # a sub-agent lives with its root
            for token, _ in sessions:
                await pool.end(http, token)
        return [t for t, _ in sessions], wrong_worker, foreign

    with WorkerPool(tiny_model, "scripted", workers=2, port=port, control_token=CONTROL_TOKEN, engine_options=opts,
                    traces=traces) as pool:  # fmt: skip
        tokens, wrong_worker, foreign = asyncio.run(pooled(pool))
    assert wrong_worker == 401  # a session is served only by its worker
    assert foreign == 409  # and registered only there
    by_worker = {i: list(read_traces(f)) for i, f in enumerate(pool.trace_files())}
    assert sorted(t["session"] for ts in by_worker.values() for t in ts) == sorted(tokens)
    assert all(owner(t["session"], 2) == i for i, ts in by_worker.items() for t in ts)
    assert all(by_worker.values())  # round-robin registration used both workers
    pooled_ids = {t["task_id"]: _ids(t) for ts in by_worker.values() for t in ts}

    async def single(url: str, proxy) -> None:
        async with aiohttp.ClientSession() as http:
            for k in range(4):
                await _conversation(http, f"{url}/s/single-{k}-0123456789abcdef", k)

    with running_proxy(tiny_model, engine_options=opts) as p:
        asyncio.run(single(p.url, p.proxy))
        alone = {f"t{k}": _ids(p.end(f"single-{k}-0123456789abcdef")) for k in range(4)}
    assert pooled_ids == alone  # token for token, the traces one proxy writes
    assert all(len(v) == 3 for v in alone.values())
