"""Soak: many concurrent streaming sessions through the real proxy for minutes, with clients that hang up
mid-stream and a share of malformed requests. Loopback only, bounded in time and sessions, stops by itself.

The proxy (the real `serving()` stack, scripted engine streaming real token ids of the model's tokenizer) runs in a
child process, so its RSS is its own; this process is the clients. Reported: errors on well-formed requests (goal
0), 5xx answers to malformed ones (goal 0), traces written against sessions ended (goal equal), proxy RSS at start
and end, and the latency the proxy adds per request (p50/p99: wall time minus the engine's own token delays).

    python bench/proxy_soak.py --model DIR                       # 256 sessions for 600 s (the issue's figure)
    python bench/proxy_soak.py --model DIR --seconds 60 --json   # what CI runs (tests/runners/proxy/test_soak.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

TURN = "Looking at the failing test now; the fix is a one-line change in the parser. " * 2
TOKEN_DELAY_S = 0.002
CONTROL = "soak-control-token-0123456789abcdef0123"
BAD_BODIES = [
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "abc"}',
    b'{"messages": [{"role": "assistant", "content": "", "tool_calls": ["x"]}]}',
    b'{"messages": [{"role": "user", "cont',
    b'\xff\xfe{"messages": []}',
    b'{"messages": null, "temperature": -1}',
]


def _serve(model: str, traces: str) -> None:
    """Child: the serving stack on a free port; prints the URL, runs until stdin closes."""
    from hrl.runners.serving.stack import serving
    from hrl.runners.trace import TraceWriter

    async def main() -> None:
        opts = {"turns": [TURN], "token_delay_s": TOKEN_DELAY_S, "max_model_len": 1 << 20}
        async with serving(model, "scripted", engine_options=opts, traces=TraceWriter(traces),
                           proxy_options={"idle_timeout_s": 0}, control_token=CONTROL) as stack:  # fmt: skip
            print(stack.url, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Soak:
    def __init__(self, url: str, seconds: float, bad_share: float, hangup_share: float, seed: int) -> None:
        self.url, self.deadline, self.rng = url, time.monotonic() + seconds, random.Random(seed)
        self.bad_share, self.hangup_share = bad_share, hangup_share
        self.n = dict.fromkeys(["requests", "ok", "errors", "bad", "bad_4xx", "bad_5xx", "hangups", "ended"], 0)
        self.added_s: list[float] = []
        self.error_samples: list[str] = []
        self.auth = {"Authorization": f"Bearer {CONTROL}"}

    async def session(self, http: aiohttp.ClientSession) -> None:
        """One client after another on this slot: register, 2-6 streamed turns, end (through the control API)."""
        while time.monotonic() < self.deadline:
            async with http.post(f"{self.url}/sessions", json={"task_id": "soak"}, headers=self.auth) as r:
                token = (await r.json())["token"]
            msgs: list[dict[str, Any]] = [{"role": "user", "content": f"fix bug {self.rng.randrange(10**6)}"}]
            for _ in range(self.rng.randint(2, 6)):
                if time.monotonic() >= self.deadline:
                    break
                if self.rng.random() < self.bad_share:
                    await self.malformed(http, token)
                    continue
                reply = await self.turn(http, token, msgs)
                if reply is None:
                    break  # hung up: this client is gone, the session ends below
                msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "go on"}]
            async with http.post(f"{self.url}/s/{token}/end", json={"reward": 0.0}, headers=self.auth) as r:
                if r.status == 200:
                    self.n["ended"] += 1
                else:
                    self.fail(f"end {r.status}: {(await r.text())[:200]}")

    async def turn(self, http: aiohttp.ClientSession, token: str, msgs: list[dict[str, Any]]) -> str | None:
        body = {"messages": msgs, "stream": True, "max_tokens": 64}
        hangup = self.rng.random() < self.hangup_share
        t0, text, tokens, done = time.perf_counter(), [], 0, False
        self.n["requests"] += 1
        try:
            async with http.post(f"{self.url}/s/{token}/v1/chat/completions", json=body) as r:
                if r.status != 200:
                    self.fail(f"turn {r.status}: {(await r.text())[:200]}")
                    return None
                async for raw in r.content:
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: {"):
                        ev = json.loads(line[6:])
                        if "error" in ev:
                            self.fail(f"stream error: {line[:200]}")
                            return None
                        for choice in ev.get("choices") or []:
                            if choice["delta"].get("content"):
                                text.append(choice["delta"]["content"])
                                tokens += 1
                    if hangup and tokens >= 3:
                        self.n["hangups"] += 1
                        return None  # leaving the block closes the connection mid-stream
        except (TimeoutError, aiohttp.ClientError) as e:
            self.fail(f"turn {type(e).__name__}: {e}")
            return None
        if not done:
            self.fail("stream ended without [DONE]")
            return None
        self.n["ok"] += 1
        self.added_s.append(time.perf_counter() - t0 - tokens * TOKEN_DELAY_S)
        return "".join(text)

    async def malformed(self, http: aiohttp.ClientSession, token: str) -> None:
        self.n["bad"] += 1
        raw = self.rng.choice(BAD_BODIES)
        async with http.post(f"{self.url}/s/{token}/v1/chat/completions", data=raw,
                             headers={"Content-Type": "application/json"}) as r:  # fmt: skip
            self.n["bad_4xx" if 400 <= r.status < 500 else "bad_5xx"] += 1

    def fail(self, what: str) -> None:
        self.n["errors"] += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(what)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 2)


async def soak(url: str, a: argparse.Namespace) -> Soak:
    s = Soak(url, a.seconds, a.bad_share, a.hangup_share, a.seed)
    limit = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=limit, timeout=aiohttp.ClientTimeout(total=120)) as http:
        await asyncio.gather(*(s.session(http) for _ in range(a.sessions)))
    return s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model dir whose tokenizer the scripted engine uses")
    p.add_argument("--sessions", type=int, default=256, help="concurrent client sessions")
    p.add_argument("--seconds", type=float, default=600, help="how long new turns start")
    p.add_argument("--bad-share", type=float, default=0.05, help="share of malformed requests")
    p.add_argument("--hangup-share", type=float, default=0.05, help="share of streams the client cuts off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--serve", nargs=2, metavar=("MODEL", "TRACES"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        _serve(*a.serve)
        return
    if not a.model:
        p.error("--model is required")
    with tempfile.TemporaryDirectory(prefix="hrl-soak-") as tmp:
        traces = Path(tmp) / "traces.jsonl"
        child = subprocess.Popen([sys.executable, __file__, "--serve", a.model, str(traces)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            url = child.stdout.readline().strip()  # type: ignore[union-attr]
            if not url.startswith("http://127.0.0.1:"):
                sys.exit(f"the proxy did not start (exit {child.poll()})")
            rss0 = _rss_mb(child.pid)
            t0 = time.monotonic()
            s = asyncio.run(soak(url, a))
            wall = time.monotonic() - t0
            rss1 = _rss_mb(child.pid)
        finally:
            child.stdin.close()  # type: ignore[union-attr]
            child.wait(60)
        written = traces.read_text().count("\n") if traces.exists() else 0
    result = {
        "sessions": a.sessions, "seconds": round(wall, 1), **s.n, "traces_written": written,
        "rss_mb_start": round(rss0, 1), "rss_mb_end": round(rss1, 1),
        "added_ms_p50": _pct(s.added_s, 0.5), "added_ms_p99": _pct(s.added_s, 0.99),
        "requests_per_s": round(s.n["requests"] / wall, 1), "error_samples": s.error_samples,
    }  # fmt: skip
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>16}  {v}")
    sys.exit(1 if s.n["errors"] or s.n["bad_5xx"] or written != s.n["ended"] else 0)


if __name__ == "__main__":
    main()
