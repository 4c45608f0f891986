"""Proxy overhead: throughput and added latency of the recording proxy vs talking to the same engine directly.

Both paths stream. "direct" sends token-id prompts to the engine (vLLM's /v1/completions, or a bare token-in/
token-out HTTP endpoint around an in-process engine: no template, no sessions, no recording); "proxy" sends
chat requests to `hrl serve`'s app, which renders, tokenizes, reuses ids, records and answers in a dialect.
Sessions are multi-turn (each turn appends the answer and a user message), so the proxy's token reuse runs.

    python bench/proxy_overhead.py --model DIR [--engine scripted|embedded|vllm] [--sessions 64] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import aiohttp
from aiohttp import web

from hrl.runners.engines import SamplingParams
from hrl.runners.proxy.server import run_server
from hrl.runners.proxy.template import ChatTemplate
from hrl.runners.stack import serving
from hrl.runners.trace import TraceWriter


def _direct_app(engine: Any) -> web.Application:
    """A bare token-in/token-out SSE endpoint around an in-process engine (the 'direct' baseline)."""

    async def gen(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        params = SamplingParams(max_tokens=body["max_tokens"], temperature=1.0, stop_token_ids=tuple(body["stop"]))
        async for d in engine.generate(body["id"], body["prompt"], params):
            await resp.write(f"data: {json.dumps({'token_ids': d.token_ids, 'logprobs': d.logprobs})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/generate", gen)
    return app


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, float, int, str]:
    """POST and read SSE; returns (ttft, total, tokens seen, text)."""
    t0, ttft, n, text = time.perf_counter(), 0.0, 0, []
    async with session.post(url, json=body) as r:
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if not ttft:
                ttft = time.perf_counter() - t0
            if "token_ids" in ev:
                n += len(ev["token_ids"])
            elif ev.get("choices"):
                delta = ev["choices"][0].get("delta") or {}
                text.append(delta.get("content") or "")
            elif ev.get("usage"):
                n = ev["usage"]["completion_tokens"]
            if ev.get("choices") and "text" in ev["choices"][0]:  # vLLM completions stream
                n += len(ev["choices"][0].get("token_ids") or [])
    return ttft, time.perf_counter() - t0, n, "".join(text)


async def _session_direct(
    http: aiohttp.ClientSession, url: str, tmpl: ChatTemplate, sid: int, a: argparse.Namespace, vllm: bool
):
    msgs = [{"role": "user", "content": f"session {sid}: fix the failing test"}]
    prompt = tmpl.encode(tmpl.render(msgs))
    lat = []
    for turn in range(a.turns):
        if vllm:
            body = {
                "model": a.model,
                "prompt": prompt,
                "max_tokens": a.tokens,
                "stream": True,
                "return_token_ids": True,
                "logprobs": 0,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
            ttft, total, n, _ = await _stream(http, f"{url}/v1/completions", body)
        else:
            body = {"id": f"{sid}-{turn}", "prompt": prompt, "max_tokens": a.tokens, "stop": []}
            ttft, total, n, _ = await _stream(http, f"{url}/generate", body)
        lat.append((ttft, total, n))
        prompt = prompt + [1] * n + tmpl.encode(f"\n<|im_start|>user\nturn {turn}<|im_end|>\n<|im_start|>assistant\n")
    return lat


async def _session_proxy(http: aiohttp.ClientSession, url: str, sid: int, a: argparse.Namespace):
    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"session {sid}: fix the failing test"}]
    lat = []
    for turn in range(a.turns):
        body = {
            "messages": msgs,
            "max_tokens": a.tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        ttft, total, n, text = await _stream(http, f"{url}/s/b{sid}/v1/chat/completions", body)
        lat.append((ttft, total, n))
        msgs = [*msgs, {"role": "assistant", "content": text}, {"role": "user", "content": f"turn {turn}"}]
    return lat


async def _run(a: argparse.Namespace, mode: str, url: str, tmpl: ChatTemplate, vllm: bool) -> dict[str, float]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=3600)) as http:
        t0 = time.perf_counter()
        if mode == "direct":
            res = await asyncio.gather(*[_session_direct(http, url, tmpl, i, a, vllm) for i in range(a.sessions)])
        else:
            res = await asyncio.gather(*[_session_proxy(http, url, i, a) for i in range(a.sessions)])
        wall = time.perf_counter() - t0
    flat = [x for s in res for x in s]
    tokens = sum(n for _, _, n in flat)
    return {
        "tok_per_s": tokens / wall,
        "p50_ttft_ms": statistics.median(t for t, _, _ in flat) * 1e3,
        "p50_total_ms": statistics.median(t for _, t, _ in flat) * 1e3,
        "tokens": tokens,
        "wall_s": wall,
    }


async def serve(a: argparse.Namespace) -> None:
    """Server side (its own process, so the client does not compete for the same core): engine, direct, proxy."""
    opts = {"token_delay_s": a.token_delay, "turns": ["x " * (a.tokens * 2)]} if a.engine == "scripted" else {}
    traces = TraceWriter(a.traces) if a.traces else None
    proxy_options = {"default_max_tokens": a.tokens}
    async with serving(a.model, a.engine, port=a.port, engine_options=opts, proxy_options=proxy_options,
                       traces=traces) as stack:  # fmt: skip
        direct_url, direct = getattr(stack.engine, "base_url", None), None
        if a.engine != "vllm":  # not a proxy: the bare token-in/token-out baseline around the same engine
            ready = asyncio.Event()
            direct = asyncio.create_task(run_server(_direct_app(stack.engine), "127.0.0.1", a.port + 1, ready))
            await ready.wait()
            direct_url = f"http://127.0.0.1:{a.port + 1}"
        print(json.dumps({"direct": direct_url, "proxy": stack.url}), flush=True)
        try:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
        finally:
            if direct is not None:
                direct.cancel()


async def main(a: argparse.Namespace) -> None:
    tmpl = ChatTemplate(a.model)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve",
        *sys.argv[1:],
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    urls = json.loads(await asyncio.wait_for(child.stdout.readline(), 600))
    results: dict[str, list[dict[str, float]]] = {}
    vllm = a.engine == "vllm"
    try:
        await _run(a, "direct", urls["direct"], tmpl, vllm)  # warm-up
        for _ in range(a.repeats):  # interleave so machine noise hits both paths alike
            for mode in ("direct", "proxy"):
                results.setdefault(mode, []).append(await _run(a, mode, urls[mode], tmpl, vllm))
    finally:
        child.stdin.close()
        await child.wait()
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results.items()}
    d, p = med["direct"], med["proxy"]
    summary = {
        "engine": a.engine,
        "sessions": a.sessions,
        "turns": a.turns,
        "tokens_per_turn": a.tokens,
        "direct": d,
        "proxy": p,
        "throughput_ratio": p["tok_per_s"] / d["tok_per_s"],
        "throughput_loss_pct": 100 * (1 - p["tok_per_s"] / d["tok_per_s"]),
        "p50_added_ttft_ms": p["p50_ttft_ms"] - d["p50_ttft_ms"],
        "p50_added_total_ms": p["p50_total_ms"] - d["p50_total_ms"],
    }
    json.dump(summary, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", default="scripted", choices=["scripted", "embedded", "vllm"])
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per turn")
    ap.add_argument("--token-delay", type=float, default=0.02, help="scripted engine: seconds per token")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=8750)
    ap.add_argument("--traces", default=None, help="also write traces (measures recording cost)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    asyncio.run(serve(args) if args.serve else main(args))
