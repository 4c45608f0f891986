"""Writing a streamed call as SSE: the dialect's events, with text deltas coalesced under a bounded delay.

Each engine delta becomes text (incremental detokenization), is split into reasoning and visible text
(`StreamSplitter`) and encoded by the dialect. With coalescing on (`stream_coalesce_ms` > 0), the text that
arrives within that many milliseconds after the last write is held and sent as one event in one write; nothing is
held longer than that bound (a timer flushes it), and the first text and the end of the stream go out at once.
What the trace records is untouched: the call records every sampled id as it arrives, whatever is written when.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from hrl.runners.errors import ContextLengthError, EngineError
from hrl.runners.proxy.template import StreamSplitter, parser_of, reasoning_of

__all__ = ["CoalescingWriter", "write_stream"]


class CoalescingWriter:
    """Text pieces in, SSE writes out: at most one write per `delay_s` (0 = one per piece), or sooner when
    `max_tokens` sampled tokens are waiting; held text never waits longer than `delay_s`."""

    def __init__(self, resp: web.StreamResponse, enc: Any, call: Any, delay_s: float, max_tokens: int) -> None:
        self.resp, self.enc, self.rec, self.delay_s, self.max_tokens = resp, enc, call.record, delay_s, max_tokens
        self.loop = asyncio.get_running_loop()
        self.pending: list[tuple[str, str]] = []
        self.last_write = -1e9  # loop time of the last write
        self.flushed_at = 0  # tokens sampled at the last write
        self.timer: asyncio.TimerHandle | None = None
        self.flushing: asyncio.Task[None] | None = None

    async def _settle(self) -> None:
        """Wait for the timer's flush, if one is writing (keeps the order; raises what its write raised)."""
        if self.flushing is not None:
            flushing, self.flushing = self.flushing, None
            await flushing

    async def add(self, pieces: list[tuple[str, str]]) -> None:
        await self._settle()
        if not pieces:
            return
        self.pending += pieces
        now = self.loop.time()
        waited = now - self.last_write
        if waited >= self.delay_s or len(self.rec.response_ids) - self.flushed_at >= self.max_tokens > 0:
            await self.flush()
        elif self.timer is None:
            self.timer = self.loop.call_at(self.last_write + self.delay_s, self._due)

    def _due(self) -> None:
        self.timer = None
        if self.pending and self.flushing is None:
            self.flushing = self.loop.create_task(self.flush())

    def take(self) -> list[bytes]:
        """Encode what is held, one event per run of the same kind, and stop holding it."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        chunks: list[bytes] = []
        pending, self.pending = self.pending, []
        i = 0
        while i < len(pending):
            kind, j = pending[i][0], i
            while j < len(pending) and pending[j][0] == kind:
                j += 1
            text = "".join(p for _, p in pending[i:j])
            chunks += self.enc.reasoning(text) if kind == "reasoning" else self.enc.text(text)
            i = j
        return chunks

    async def flush(self) -> None:
        await self.write(self.take())

    async def write(self, chunks: list[bytes]) -> None:
        self.last_write, self.flushed_at = self.loop.time(), len(self.rec.response_ids)
        if chunks:
            await self.resp.write(b"".join(chunks))

    async def close(self) -> None:
        await self._settle()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def write_stream(resp: web.StreamResponse, proxy: Any, dialect: Any, call: Any, rid: str) -> None:
    """Stream one call to its end (or its error) in the dialect's events."""
    cfg = proxy.config
    tmpl = proxy.template
    split = StreamSplitter(bool(call.req.tools), parser_of(tmpl), call.req.tools, reasoning_of(tmpl))
    enc = dialect.encoder(call.req, rid)
    out = CoalescingWriter(resp, enc, call, cfg.stream_coalesce_ms / 1000, cfg.stream_coalesce_tokens)
    await resp.write(b"".join(enc.start()))
    try:
        try:
            async with contextlib.aclosing(proxy.stream(call)) as texts:
                async for text in texts:
                    await out.add(split.feed(text))
            await out.add(split.flush())
            await out.close()
            held = out.take()  # encoded before the dialect closes its blocks
            tail = held + enc.finish(proxy.finish(call))
        except (EngineError, ContextLengthError) as e:
            await out.close()
            tail = out.take() + enc.error(502, str(e))
        await out.write(tail)
    finally:
        await out.close()
    await resp.write_eof()
