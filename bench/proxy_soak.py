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

With `--flood count_tokens|chat`, rounds alternate the same way, but the other client is one session sending
`--flood-parallel` requests of `--flood-mb` MB at once, back to back (Anthropic's /v1/messages/count_tokens, or
/v1/chat/completions), as an agent filling the proxy's tokenizer threads would. Reported: the others' median added
latency alone and beside the flood (`added_ms_p50_alone`, `added_ms_p50_beside_flood`, `p50_ratio`; goal ≤ 2.5),
and what the flood's requests got. A flood round ends when its last request is answered (the flood stops sending
after `--seconds` / (2 × `--rounds`), then waits for the proxy to work through what it queued), so no round alone
starts beside leftover work; the sessions run until the last round ends.

    python bench/proxy_soak.py --model DIR                       # 256 sessions for 600 s (the issue's figure)
    python bench/proxy_soak.py --model DIR --seconds 60 --json   # what CI runs (tests/runners/proxy/test_soak.py)
    python bench/proxy_soak.py --model DIR --sessions 64 --seconds 120 --big-prompt-mb 5 --bad-share 0 --hangup-share 0
    python bench/proxy_soak.py --model DIR --sessions 16 --seconds 60 --flood count_tokens --flood-parallel 200 \
        --flood-mb 1 --bad-share 0 --hangup-share 0
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
        self.n |= {"big_sent": 0, "big_refused": 0, "flood_sent": 0}
        # or "beside_big": one more client sends big prompts meanwhile (--big-prompt-mb); "beside_flood": one more
        # session floods (--flood), until the proxy has answered all it sent
        self.phase = "alone"
        self.added_s: list[float] = []
        self.added_by_phase: dict[str, list[float]] = {"alone": [], "beside_big": [], "beside_flood": []}
        self.big_sessions: list[str] = []
        self.flood_status: dict[str, int] = {}  # what the flood's requests got: HTTP status (or error) -> count
        self.flood_s: list[float] = []  # each flood request's wall time
        self.drain_s: list[float] = []  # per flood round: how long its answers took after it stopped sending
        self._big: tuple[tuple[float, int], bytes, bytes] | None = (
            None  # a big prompt's body: (MB, messages), head, tail
        )
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

    async def rounds(self, http: aiohttp.ClientSession, a: argparse.Namespace) -> None:
        """Alternate the phases: the sessions alone, then beside one client sending big prompts back to back
        (--big-prompt-mb) or one session flooding (--flood); the sessions stop when the last round ends."""
        length = a.seconds / (2 * a.rounds)
        for _ in range(a.rounds):
            self.phase = "alone"
            await asyncio.sleep(length)
            self.phase = "beside_flood" if a.flood else "beside_big"
            end = time.monotonic() + length
            async with http.post(f"{self.url}/sessions", json={"task_id": "big"}, headers=self.auth) as r:
                token = (await r.json())["token"]
            self.big_sessions.append(token)
            if a.flood:
                flood = (self.flood(http, token, a.flood, a.flood_mb, a.flood_messages, end)
                         for _ in range(a.flood_parallel))  # fmt: skip
                flooders = [asyncio.ensure_future(f) for f in flood]
                await asyncio.sleep(max(0.0, end - time.monotonic()))
                await asyncio.gather(*flooders)
                self.drain_s.append(time.monotonic() - end)
            else:
                while time.monotonic() < end:
                    await self.big_prompt(http, token, a.big_prompt_mb)
            async with http.post(f"{self.url}/s/{token}/end", json={}, headers=self.auth) as r:
                await r.read()
        self.phase = "alone"
        self.deadline = time.monotonic()

    def _prompt_body(self, mb: float, n: int, messages: int = 1) -> bytes:
        """A prompt of `mb` MB of code-like text (as a tool result holds it: no JSON escapes) in `messages` messages,
        starting with `n` (distinct bodies: an identical one is taken for a retry), encoded once: this loop times
        the others."""
        if self._big is None or self._big[0] != (mb, messages):
            size = int(mb * (1 << 20))
            text = (CODE.decode() * (size // len(CODE) + 1))[:size]
            step = -(-size // messages)
            msgs = [{"role": ("user", "assistant")[i % 2], "content": text[i * step : (i + 1) * step]}
                    for i in range(messages)]  # fmt: skip
            msgs[0]["content"] = "\0" + msgs[0]["content"]
            head, tail = json.dumps({"messages": msgs, "max_tokens": 16}).split("\\u0000")
            self._big = ((mb, messages), head.encode(), tail.encode())
        _, head, tail = self._big
        return head + str(n).encode() + tail

    async def big_prompt(self, http: aiohttp.ClientSession, token: str, mb: float) -> None:
        """One big prompt; it must be a 400."""
        self.n["big_sent"] += 1
        body = self._prompt_body(mb, self.n["big_sent"])
        async with http.post(f"{self.url}/s/{token}/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"}) as r:  # fmt: skip
            if r.status == 400:
                self.n["big_refused"] += 1
            else:
                self.fail(f"big prompt {r.status}: {(await r.text())[:200]}")

    async def flood(
        self, http: aiohttp.ClientSession, token: str, route: str, mb: float, messages: int, end: float
    ) -> None:
        """One of the flood's parallel senders: `mb` MB requests of one session back to back until `end`. Each
        must be answered, with a 200 (counted) or a 4xx (over a limit); anything else is an error."""
        path = "/v1/messages/count_tokens" if route == "count_tokens" else "/v1/chat/completions"
        while time.monotonic() < end:
            self.n["flood_sent"] += 1
            body, t0 = self._prompt_body(mb, self.n["flood_sent"], messages), time.perf_counter()
            try:
                async with http.post(f"{self.url}/s/{token}{path}", data=body,
                                     headers={"Content-Type": "application/json"}) as r:  # fmt: skip
                    await r.read()
                    status = str(r.status)
            except (TimeoutError, aiohttp.ClientError) as e:
                status = type(e).__name__
            self.flood_s.append(time.perf_counter() - t0)
            self.flood_status[status] = self.flood_status.get(status, 0) + 1
            if not (status == "200" or status.startswith("4")):
                self.fail(f"flood {status}")

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
    timeout = aiohttp.ClientTimeout(total=a.timeout)
    # the big prompts' client is another client, with connections of its own, as another agent's are; a flood waits
    # behind its own session's queue for as long as that takes
    big = a.big_prompt_mb > 0 or bool(a.flood)
    if big:
        s.deadline = float("inf")  # the sessions run until the last round ends
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                  timeout=aiohttp.ClientTimeout(total=3600)) as other:  # fmt: skip
        await asyncio.gather(*(s.session(http) for _ in range(a.sessions)), *([s.rounds(other, a)] if big else []))
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
    p.add_argument("--seconds", type=float, default=600, help="how long new turns start (with rounds: at least)")
    p.add_argument("--bad-share", type=float, default=0.05, help="share of malformed requests")
    p.add_argument("--hangup-share", type=float, default=0.05, help="share of streams the client cuts off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context", type=int, default=32768, help="the engine's context window, in tokens")
    p.add_argument("--big-prompt-mb", type=float, default=0, help="alternate rounds with a client sending prompts of "
                   "this many MB (0 = off)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="with --big-prompt-mb or --flood: rounds of (alone, beside)")
    p.add_argument("--flood", choices=["count_tokens", "chat"], help="alternate rounds with one session flooding "
                   "this route with parallel requests")  # fmt: skip
    p.add_argument("--flood-parallel", type=int, default=200, help="with --flood: requests in flight at once")
    p.add_argument("--flood-mb", type=float, default=1.0, help="with --flood: MB of prompt text per request")
    p.add_argument("--flood-messages", type=int, default=1, help="with --flood: messages that text is split into "
                   "(many short ones are slow to read: the dialect's parsing is Python per message)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=300, help="seconds a session waits for any one answer")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--serve", nargs=3, metavar=("MODEL", "TRACES", "CONTEXT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        _serve(*a.serve)
        return
    if not a.model:
        p.error("--model is required")
    if a.flood and a.big_prompt_mb > 0:
        p.error("--flood and --big-prompt-mb are two kinds of round: give one")
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
    if a.flood:
        alone, beside = (_pct(s.added_by_phase[k], 0.5) for k in ("alone", "beside_flood"))
        result |= {
            "flood": a.flood, "flood_parallel": a.flood_parallel, "flood_mb": a.flood_mb,
            "flood_messages": a.flood_messages,
            "flood_status": s.flood_status, "flood_ms_p50": _pct(s.flood_s, 0.5),
            "flood_ms_max": _pct(s.flood_s, 1.0), "turns_alone": len(s.added_by_phase["alone"]),
            "turns_beside_flood": len(s.added_by_phase["beside_flood"]),
            "flood_drain_s": [round(x, 1) for x in s.drain_s],
            "added_ms_p50_alone": alone, "added_ms_p50_beside_flood": beside, "p50_ratio": round(beside / alone, 2),
            "added_ms_p99_alone": _pct(s.added_by_phase["alone"], 0.99),
            "added_ms_p99_beside_flood": _pct(s.added_by_phase["beside_flood"], 0.99),
            "trace_bytes_per_flood_request": round(big_bytes / max(1, s.n["flood_sent"]), 1),
        }  # fmt: skip
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>16}  {v}")
    big_ok = a.big_prompt_mb <= 0 or (result["p99_ratio"] <= 2 and result["trace_bytes_per_refused"] < 1024)
    flood_ok = not a.flood or result["p50_ratio"] <= 2.5
    sys.exit(1 if s.n["errors"] or s.n["bad_5xx"] or ended != s.n["ended"] or not (big_ok and flood_ok) else 0)


if __name__ == "__main__":
    main()
