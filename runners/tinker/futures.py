"""The Tinker SDK's futures: every slow call answers `{request_id}` at once, and the SDK polls
`/api/v1/retrieve_future` for the result. A poll here waits (long-poll) until the result is in or `wait_s` passed,
then answers `try_again`, so the SDK, which polls again at once, neither spins nor times out (it waits 45 s).

A result is kept `keep_s` after it is ready: a poll whose answer was lost in transit is answered again, and a result
nobody fetches does not stay for ever."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from hrl.runners.errors import ClientError

__all__ = ["Failed", "Futures", "Outcome", "Proto"]


@dataclass(frozen=True)
class Proto:
    """A result the SDK reads as protobuf (ForwardBackwardOutput, SampleResponse)."""

    body: bytes


@dataclass(frozen=True)
class Failed:
    """A request that failed: the SDK raises `RequestFailedError` with `error`; `category` user or server."""

    error: str
    category: str = "user"


Outcome = dict[str, Any] | Proto | Failed  # a JSON result, a protobuf one, or a failure


@dataclass
class _Entry:
    owner: str
    task: asyncio.Task[Outcome]
    done_at: float | None = None

    def __post_init__(self) -> None:
        self.task.add_done_callback(lambda _: setattr(self, "done_at", time.monotonic()))


class Futures:
    """Results of the requests in flight and recently done, each readable by the client key that made it only."""

    def __init__(self, wait_s: float = 25.0, keep_s: float = 600.0) -> None:
        self.wait_s, self.keep_s = wait_s, keep_s
        self._entries: dict[str, _Entry] = {}
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)  # ids of one server start never collide with an earlier start's

    def submit(self, owner: str, work: Awaitable[Outcome]) -> str:
        """Run `work` (a coroutine) as a task; its request id. A ClientError it raises becomes a user failure, any
        other exception a server one."""
        self._prune()
        request_id = f"{self._prefix}-{next(self._ids)}"
        self._entries[request_id] = _Entry(owner, asyncio.ensure_future(_settled(work)))
        return request_id

    async def retrieve(self, owner: str, request_id: str) -> Outcome | None:
        """The outcome of `request_id`, or None when it is still running after `wait_s` (the SDK asks again)."""
        entry = self._entries.get(request_id)
        if entry is None or entry.owner != owner:
            raise ClientError(404, f"no request {request_id} (unknown, of another key, or expired)")
        done, _ = await asyncio.wait({entry.task}, timeout=self.wait_s)
        return entry.task.result() if done else None

    def cancel(self, owner: str, request_id: str) -> None:
        entry = self._entries.get(request_id)
        if entry is not None and entry.owner == owner:
            entry.task.cancel()

    async def close(self) -> None:
        for entry in self._entries.values():
            entry.task.cancel()
        await asyncio.gather(*(e.task for e in self._entries.values()), return_exceptions=True)

    def _prune(self) -> None:
        now = time.monotonic()
        for rid in [r for r, e in self._entries.items() if e.done_at is not None and now - e.done_at > self.keep_s]:
            del self._entries[rid]


async def _settled(work: Awaitable[Outcome]) -> Outcome:
    try:
        return await work
    except ClientError as e:
        return Failed(str(e), "user")
    except asyncio.CancelledError:
        return Failed("cancelled", "user")
    except Exception as e:
        return Failed(f"{type(e).__name__}: {e}", "server")
