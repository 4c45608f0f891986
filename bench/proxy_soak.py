"""Soak: many concurrent streaming sessions through the real proxy for minutes, with clients that hang up
mid-stream and a share of malformed requests. Loopback only, bounded in time and sessions, stops by itself.

The proxy (the real `serving()` stack, scripted engine streaming real token ids of the model's tokenizer) runs in a
child process, so its RSS is its own; this process is the clients. Reported: errors on well-formed requests (goal
0), 5xx answers to malformed ones (goal 0), traces written against sessions ended (goal equal), proxy RSS at start
and end, and the latency the proxy adds per request (p50/p99: wall time minus the engine's own token delays).

With `--big-prompt-mb N`, rounds alternate: the sessions alone, then the sessions while one more client sends
N MB prompts back to back (each refused: over the byte cap, or over the context window once tokenized). Both
latencies are reported side by side (`added_ms_p99_alone`, `added_ms_p99_beside_big`, their ratio; goal ≤ 2), with
the trace bytes each refused prompt added (goal < 1024). The context window is `--context` tokens.

    python bench/proxy_soak.py --model DIR                       # 256 sessions for 600 s (the issue's figure)
    python bench/proxy_soak.py --model DIR --seconds 60 --json   # what CI runs (tests/runners/proxy/test_soak.py)
    python bench/proxy_soak.py --model DIR --sessions 64 --seconds 120 --big-prompt-mb 5 --bad-share 0 --hangup-share 0
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
CODE = b"def parse(line): return [int(x) for x in line.split(',') if x.strip()]  # one line of a big file; "
CONTROL = "soak-control-token-0123456789abcdef0123"
BAD_BODIES = [
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "abc"}',
    b'{"messages": [{"role": "assistant", "content": "", "tool_calls": ["x"]}]}',
    b'{"messages": [{"role": "user", "cont',
    b'\xff\xfe{"messages": []}',
    b'{"messages": null, "temperature": -1}',
]


def _serve(model: str, traces: str, context: str) -> None:
    """Child: the serving stack on a free port; prints the URL, runs until stdin closes."""
    from hrl.runners.serving.stack import serving
    from hrl.runners.trace import TraceWriter

    async def main() -> None:
        opts = {"turns": [TURN], "token_delay_s": TOKEN_DELAY_S, "max_model_len": int(context)}
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
        self.n |= {"big_sent": 0, "big_refused": 0}
        self.phase = "alone"  # or "beside_big": one more client sends big prompts meanwhile (--big-prompt-mb)
        self.added_s: list[float] = []
        self.added_by_phase: dict[str, list[float]] = {"alone": [], "beside_big": []}
        self.big_sessions: list[str] = []
        self._big: tuple[bytes, bytes, bytes] | None = None  # a big prompt's body: head, text, tail
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
        t0, text, tokens, done, phase = time.perf_counter(), [], 0, False, self.phase
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
        added = time.perf_counter() - t0 - tokens * TOKEN_DELAY_S
        self.added_s.append(added)
        if phase == self.phase:  # a turn that spans a change of phase counts in neither
            self.added_by_phase[phase].append(added)
        return "".join(text)

    async def malformed(self, http: aiohttp.ClientSession, token: str) -> None:
        self.n["bad"] += 1
        raw = self.rng.choice(BAD_BODIES)
        async with http.post(f"{self.url}/s/{token}/v1/chat/completions", data=raw,
                             headers={"Content-Type": "application/json"}) as r:  # fmt: skip
            self.n["bad_4xx" if 400 <= r.status < 500 else "bad_5xx"] += 1

    async def rounds(self, http: aiohttp.ClientSession, big_mb: float, rounds: int, seconds: float) -> None:
        """Alternate the phases: the sessions alone, then beside one client sending big prompts back to back."""
        length = seconds / (2 * rounds)
        for _ in range(rounds):
            self.phase = "alone"
            await asyncio.sleep(length)
            self.phase = "beside_big"
            end = time.monotonic() + length
            async with http.post(f"{self.url}/sessions", json={"task_id": "big"}, headers=self.auth) as r:
                token = (await r.json())["token"]
            self.big_sessions.append(token)
            while time.monotonic() < end:
                await self.big_prompt(http, token, big_mb)
            async with http.post(f"{self.url}/s/{token}/end", json={}, headers=self.auth) as r:
                await r.read()
        self.phase = "alone"

    async def big_prompt(self, http: aiohttp.ClientSession, token: str, mb: float) -> None:
        """One big prompt (distinct each time: an identical body is taken for a retry); it must be a 400."""
        self.n["big_sent"] += 1
        if self._big is None or len(self._big[1]) != int(mb * (1 << 20)):  # encoded once: this loop times others
            head, tail = json.dumps({"messages": [{"role": "user", "content": "\0"}], "max_tokens": 16}).split(
                "\\u0000"
            )
            size = int(mb * (1 << 20))  # code-like text, as a tool result holds it (no byte JSON escapes)
            self._big = (head.encode(), (CODE * (size // len(CODE) + 1))[:size], tail.encode())
        head, text, tail = self._big
        body = head + str(self.n["big_sent"]).encode() + text + tail
        async with http.post(f"{self.url}/s/{token}/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"}) as r:  # fmt: skip
            if r.status == 400:
                self.n["big_refused"] += 1
            else:
                self.fail(f"big prompt {r.status}: {(await r.text())[:200]}")

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
        big = [s.rounds(http, a.big_prompt_mb, a.rounds, a.seconds)] if a.big_prompt_mb > 0 else []
        await asyncio.gather(*(s.session(http) for _ in range(a.sessions)), *big)
    return s


def _trace_bytes(traces: Path, tokens: list[str]) -> int:
    """The bytes of the trace lines of these sessions, as written."""
    wanted, total = set(tokens), 0
    for line in traces.read_bytes().splitlines():
        if json.loads(line)["session"] in wanted:
            total += len(line) + 1
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model dir whose tokenizer the scripted engine uses")
    p.add_argument("--sessions", type=int, default=256, help="concurrent client sessions")
    p.add_argument("--seconds", type=float, default=600, help="how long new turns start")
    p.add_argument("--bad-share", type=float, default=0.05, help="share of malformed requests")
    p.add_argument("--hangup-share", type=float, default=0.05, help="share of streams the client cuts off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context", type=int, default=32768, help="the engine's context window, in tokens")
    p.add_argument("--big-prompt-mb", type=float, default=0, help="alternate rounds with a client sending prompts of "
                   "this many MB (0 = off)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="with --big-prompt-mb: rounds of (alone, beside big)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--serve", nargs=3, metavar=("MODEL", "TRACES", "CONTEXT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        _serve(*a.serve)
        return
    if not a.model:
        p.error("--model is required")
    with tempfile.TemporaryDirectory(prefix="hrl-soak-") as tmp:
        traces = Path(tmp) / "traces.jsonl"
        child = subprocess.Popen([sys.executable, __file__, "--serve", a.model, str(traces), str(a.context)],
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
        big_bytes = _trace_bytes(traces, s.big_sessions) if s.big_sessions and traces.exists() else 0
    ended = written - len(s.big_sessions)  # the big prompts' sessions are written too
    result = {
        "sessions": a.sessions, "seconds": round(wall, 1), **s.n, "traces_written": ended,
        "rss_mb_start": round(rss0, 1), "rss_mb_end": round(rss1, 1),
        "added_ms_p50": _pct(s.added_s, 0.5), "added_ms_p99": _pct(s.added_s, 0.99),
        "requests_per_s": round(s.n["requests"] / wall, 1), "error_samples": s.error_samples,
    }  # fmt: skip
    if a.big_prompt_mb > 0:
        alone, beside = (_pct(s.added_by_phase[k], 0.99) for k in ("alone", "beside_big"))
        result |= {
            "big_prompt_mb": a.big_prompt_mb, "turns_alone": len(s.added_by_phase["alone"]),
            "turns_beside_big": len(s.added_by_phase["beside_big"]),
            "added_ms_p50_alone": _pct(s.added_by_phase["alone"], 0.5),
            "added_ms_p50_beside_big": _pct(s.added_by_phase["beside_big"], 0.5),
            "added_ms_p99_alone": alone, "added_ms_p99_beside_big": beside, "p99_ratio": round(beside / alone, 2),
            "trace_bytes_per_refused": round(big_bytes / max(1, s.n["big_refused"]), 1),
        }  # fmt: skip
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>16}  {v}")
    big_ok = a.big_prompt_mb <= 0 or (result["p99_ratio"] <= 2 and result["trace_bytes_per_refused"] < 1024)
    sys.exit(1 if s.n["errors"] or s.n["bad_5xx"] or ended != s.n["ended"] or not big_ok else 0)


if __name__ == "__main__":
    main()
