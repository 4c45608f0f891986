"""Proxy overhead: throughput and added latency of the recording proxy vs talking to the same engine directly.

Both paths stream. "direct" sends token-id prompts to the engine (vLLM's /v1/completions, or a bare token-in/
token-out HTTP endpoint around an in-process engine: no template, no sessions, no recording); "proxy" sends
chat requests to `hrl serve`'s app, which renders, tokenizes, reuses ids, records and answers in a dialect.
Sessions are multi-turn (each turn appends the answer and a user message), so the proxy's token reuse runs.

Also the serving process's CPU time per streamed token, for the bare baseline and the proxy, per dialect and
streaming mode (the proxy's figure minus the baseline's is what the proxy adds). The scripted engine is paced like
a GPU engine (decoding costs no CPU; tokens come due on the clock at 1/--token-delay per sequence).

    python bench/proxy_overhead.py --model DIR [--engine scripted|embedded|vllm] [--sessions 64 256 1024]
        [--dialects chat responses anthropic gemini] [--modes stream nonstream] [--turns 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

try:
    from orjson import loads as _loads
except ImportError:  # orjson is optional
    from json import loads as _loads

from hrl.runners.engines import SamplingParams
from hrl.runners.proxy.server import run_server
from hrl.runners.proxy.template import ChatTemplate
from hrl.runners.proxy.tokens import owner
from hrl.runners.serving.loop import run
from hrl.runners.serving.stack import serving
from hrl.runners.serving.workers import WorkerPool
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


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- one client per dialect: the request body for a conversation, and the reply text out of its answer --------


def _body(dialect: str, msgs: list[dict[str, str]], a: argparse.Namespace, stream: bool) -> tuple[str, dict[str, Any]]:
    if dialect == "chat":
        body = {"messages": msgs, "max_tokens": a.tokens, "stream": stream, "ignore_eos": True}
        return "/v1/chat/completions", body | ({"stream_options": {"include_usage": True}} if stream else {})
    if dialect == "responses":
        items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in msgs]
        return "/v1/responses", {"input": items, "max_output_tokens": a.tokens, "stream": stream}
    if dialect == "anthropic":
        return "/v1/messages", {"messages": msgs, "max_tokens": a.tokens, "stream": stream}
    contents = [{"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": m["content"]}]}
                for m in msgs]  # fmt: skip
    verb = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/v1beta/models/m:{verb}", {"contents": contents, "generationConfig": {"maxOutputTokens": a.tokens}}


def _delta_text(dialect: str, ev: dict[str, Any]) -> str:
    if dialect == "chat":
        return ((ev.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
    if dialect == "responses":
        return str(ev.get("delta", "")) if ev.get("type") == "response.output_text.delta" else ""
    if dialect == "anthropic":
        delta = ev.get("delta") or {}
        return str(delta.get("text", "")) if ev.get("type") == "content_block_delta" else ""
    return _gemini_text(ev)


def _gemini_text(ev: dict[str, Any]) -> str:
    parts = ((ev.get("candidates") or [{}])[0].get("content") or {}).get("parts") or []
    return "".join(p.get("text", "") for p in parts if not p.get("thought"))


def _reply_text(dialect: str, body: dict[str, Any]) -> str:
    if dialect == "chat":
        return body["choices"][0]["message"]["content"] or ""
    if dialect == "responses":
        return "".join(c["text"] for o in body["output"] if o["type"] == "message" for c in o["content"])
    if dialect == "anthropic":
        return "".join(b["text"] for b in body["content"] if b["type"] == "text")
    return _gemini_text(body)


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], dialect: str = "direct"):
    """POST and read SSE; returns (time to the first sampled token, total, tokens seen, text)."""
    t0, ttft, n, text = time.perf_counter(), 0.0, 0, []
    async with session.post(url, json=body) as r:
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev, before = _loads(line[6:]), (n, len(text))
            if "token_ids" in ev:
                n += len(ev["token_ids"])
            elif ev.get("choices") and "text" in ev["choices"][0]:  # vLLM completions stream
                n += len(ev["choices"][0].get("token_ids") or [])
            elif piece := _delta_text(dialect, ev):
                text.append(piece)
            if not ttft and (n, len(text)) != before:  # the first event that carries a token, not a preamble
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0, n, "".join(text)


async def _session_direct(
    http: aiohttp.ClientSession, url: str, tmpl: ChatTemplate, sid: int, a: argparse.Namespace, vllm: bool,
    start_s: float = 0.0,
):  # fmt: skip
    await asyncio.sleep(start_s)
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


async def _session_proxy(
    http: aiohttp.ClientSession, url: str, sid: str, a: argparse.Namespace, case: str, start_s: float = 0.0
):
    await asyncio.sleep(start_s)
    dialect, mode = case.split("/")
    host, _, port = url.rpartition(":")
    base = f"{host}:{int(port) + owner(sid, a.workers)}/s/{sid}"  # the worker that owns the session
    msgs: list[dict[str, str]] = [{"role": "user", "content": f"session {sid}: fix the failing test"}]
    lat = []
    for turn in range(a.turns):
        path, body = _body(dialect, msgs, a, mode == "stream")
        if mode == "stream":
            ttft, total, _, text = await _stream(http, base + path, body, dialect)
        else:
            t0 = time.perf_counter()
            async with http.post(base + path, json=body) as r:
                text = _reply_text(dialect, _loads(await r.read()))
            ttft = total = time.perf_counter() - t0
        lat.append((ttft, total, a.tokens))  # the scripted turn is longer than max_tokens: each call samples that many
        msgs = [*msgs, {"role": "assistant", "content": text}, {"role": "user", "content": f"turn {turn}"}]
    return lat


async def _run(a: argparse.Namespace, mode: str, url: str, tmpl: ChatTemplate, vllm: bool, sessions: int,
               pids: list[int]) -> dict[str, float]:  # fmt: skip
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=3600)) as http:
        starts = [i * a.stagger / sessions for i in range(sessions)]  # the same schedule on both paths
        t0, cpu0 = time.perf_counter(), sum(map(_cpu_s, pids))
        if mode == "direct":
            res = await asyncio.gather(*[_session_direct(http, url, tmpl, i, a, vllm, starts[i])
                                         for i in range(sessions)])  # fmt: skip
        else:
            tag = uuid.uuid4().hex[:8]  # fresh sessions every run
            res = await asyncio.gather(*[_session_proxy(http, url, f"b{tag}{i}", a, mode, starts[i])
                                         for i in range(sessions)])  # fmt: skip
        wall, cpu = time.perf_counter() - t0, sum(map(_cpu_s, pids)) - cpu0
    flat = [x for s in res for x in s]
    tokens = sum(n for _, _, n in flat)
    return {
        "tok_per_s": tokens / wall,
        "p50_ttft_ms": statistics.median(t for t, _, _ in flat) * 1e3,
        "p50_total_ms": statistics.median(t for _, t, _ in flat) * 1e3,
        "cpu_us_per_token": cpu / tokens * 1e6,
        "tokens": tokens,
        "wall_s": wall,
    }


async def serve(a: argparse.Namespace) -> None:
    """Server side (its own process, so the client does not compete for the same core): engine, direct, proxy."""
    opts: dict[str, Any] = {}
    if a.engine == "scripted":  # paced like a GPU engine: decoding costs no CPU, tokens come due on the clock
        opts = {"decode_tps": 1 / a.token_delay, "max_batch": a.max_batch, "turns": ["x " * (a.tokens * 2)]}
    traces = TraceWriter(a.traces) if a.traces else None
    proxy_options = {"default_max_tokens": a.tokens, "open_sessions": True, "idle_timeout_s": 0, **dict(a.proxy_option)}
    async with serving(a.model, a.engine, port=a.port, engine_options=opts, proxy_options=proxy_options,
                       traces=traces) as stack:  # fmt: skip
        direct_url, direct = getattr(stack.engine, "base_url", None), None
        if a.engine != "vllm":  # not a proxy: the bare token-in/token-out baseline around the same engine
            ready = asyncio.Event()
            direct = asyncio.create_task(run_server(_direct_app(stack.engine), "127.0.0.1", a.port + 1, ready))
            await ready.wait()
            direct_url = f"http://127.0.0.1:{a.port + 1}"
        pool, urls = None, {"direct": direct_url, "proxy": stack.url, "workers": 1, "pids": [os.getpid()]}
        if a.workers > 1:  # N proxy processes with session affinity, each with its own (paced) engine or vLLM client
            shared = {"url": direct_url} if a.engine == "vllm" else opts
            pool = WorkerPool(a.model, a.engine, workers=a.workers, port=a.port + 2, control_token=uuid.uuid4().hex,
                              engine_options=shared, proxy_options=proxy_options)  # fmt: skip
            await asyncio.to_thread(pool.__enter__)
            urls |= {"proxy": pool.url(0), "workers": a.workers, "pids": [os.getpid(), *(p.pid for p in pool.procs)]}
        print(json.dumps(urls), flush=True)
        try:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
        finally:
            if pool is not None:
                await asyncio.to_thread(pool.__exit__, None, None, None)
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
    vllm = a.engine == "vllm"
    cases = [f"{d}/{m}" for d in a.dialects for m in a.modes]
    rows = []
    try:
        await _run(a, "direct", urls["direct"], tmpl, vllm, min(a.sessions), urls["pids"])  # warm-up
        for sessions in a.sessions:
            results: dict[str, list[dict[str, float]]] = {}
            for _ in range(a.repeats):  # interleave so machine noise hits both paths alike
                for mode in ("direct", *cases):
                    url = urls["direct" if mode == "direct" else "proxy"]
                    results.setdefault(mode, []).append(await _run(a, mode, url, tmpl, vllm, sessions, urls["pids"]))
            rows.append(_summary(a, sessions, results))
    finally:
        child.stdin.close()
        await child.wait()
    json.dump({"engine": a.engine, "workers": a.workers, "stagger_s": a.stagger, "turns": a.turns, "tokens_per_turn": a.tokens, "load": os.getloadavg(),
               "results": rows}, sys.stdout, indent=2)  # fmt: skip
    print()
    for r in rows:
        for case, c in r["proxy"].items():
            print(f"sessions {r['sessions']:5d}  {case:20s} throughput {c['throughput_ratio']:.3f} of direct  "
                  f"p50 added {c['p50_added_total_ms']:+7.1f} ms  ttft {_ms(c['p50_added_ttft_ms'])}  "
                  f"cpu/token {c['cpu_us_per_token']:6.1f} us (direct {r['direct']['cpu_us_per_token']:.1f})",
                  file=sys.stderr)  # fmt: skip


def _ms(value: float | None) -> str:
    return "      -   " if value is None else f"{value:+7.1f} ms"


def _summary(a: argparse.Namespace, sessions: int, results: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results.items()}
    d = med.pop("direct")
    proxy = {
        case: p
        | {
            "throughput_ratio": p["tok_per_s"] / d["tok_per_s"],
            "p50_added_ttft_ms": p["p50_ttft_ms"] - d["p50_ttft_ms"] if case.endswith("/stream") else None,
            "p50_added_total_ms": p["p50_total_ms"] - d["p50_total_ms"],
            "added_cpu_us_per_token": p["cpu_us_per_token"] - d["cpu_us_per_token"],
        }
        for case, p in med.items()
    }
    return {"sessions": sessions, "repeats": a.repeats, "direct": d, "proxy": proxy}


def _option(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    return key, json.loads(value)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", default="scripted", choices=["scripted", "embedded", "vllm"])
    ap.add_argument("--sessions", type=int, nargs="+", default=[64], help="one or more session counts, side by side")
    ap.add_argument("--dialects", nargs="+", default=["chat"], choices=["chat", "responses", "anthropic", "gemini"])
    ap.add_argument("--modes", nargs="+", default=["stream"], choices=["stream", "nonstream"])
    ap.add_argument("--workers", type=int, default=1, help="proxy worker processes (session affinity)")
    ap.add_argument("--max-batch", type=int, default=0, help="scripted engine: most sequences decoding at once")
    ap.add_argument(
        "--proxy-option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a ProxyConfig field for the proxy, e.g. stream_coalesce_ms=2",
    )
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per turn")
    ap.add_argument("--token-delay", type=float, default=0.02, help="scripted engine: seconds per token per sequence")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        help="seconds over which the sessions start (evenly; the same schedule for direct and proxy); 0 = all at "
        "once, a burst of N simultaneous requests per turn",
    )
    ap.add_argument("--port", type=int, default=8750)
    ap.add_argument("--traces", default=None, help="also write traces (measures recording cost)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        run(serve(args))  # the serving side: on uvloop when it is installed (HRL_UVLOOP=0: asyncio's loop)
    else:
        asyncio.run(main(args))
