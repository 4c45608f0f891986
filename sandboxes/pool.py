"""A per-run sandbox pool: sandboxes made before episodes ask for them, and (optionally) one group's sandboxes reused.

- `warm` N > 0: the pool keeps up to N sandboxes created and ready for the spec most recently asked for, refilled in
  the background. An episode that finds none ready while some are being made for its spec (and not already awaited
  by other episodes) waits for one of them instead of making its own beside them: the run's first batch makes N
  sandboxes, not 2N at once. An episode whose spec (image, workdir, env, mounts, network, proxy socket, limits, hidden paths:
  everything but `labels`, which only name what a sandbox is for) equals a ready sandbox's takes it, any other makes
  its own. A pooled sandbox carries the run's labels like any other, so `hrl sandbox prune` removes what a crashed
  run left; `close()` removes every sandbox the pool still holds at the end of the run.
- `reuse="group"`: an episode's sandbox is parked for the other episodes of its group (same task, same spec, never
  another group's or run's). The next one takes it after a reset (`hrl.sandboxes.reset`: every process the previous
  episode left killed, HOME and the temp folder back as they were, the workdir restored from the snapshot taken right
  after the first episode's `prepare`) and a check that everything an episode could have written or left running
  hashes as the first episode's starting state did (docker: whatever the daemon finds changed outside the workdir
  and /tmp, and every process but the snapshot's, too). A mismatch closes that sandbox, counts `reset_mismatch`,
  and the episode gets a fresh one. Episodes of a group that run at once each get their own sandbox (none waits for
  another's); what the group parks is reused by the later ones.
- `warm=0, reuse="none"` (the defaults): every episode creates its sandbox and closes it, as without a pool.

Grading never runs in a pooled or reused sandbox: the test verifier grades in a fresh sandbox of its own (and
`AgentRollouts` refuses reuse with a Harbor verifier that would grade the agent's whole container).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from hrl.sandboxes.base import Sandbox, SandboxBackend, SandboxError, SandboxSpec
from hrl.sandboxes.reset import ExecReset, LocalReset, Reset, reset_for

__all__ = ["ExecReset", "Lease", "LocalReset", "Reset", "SandboxPool", "spec_key"]

Prepare = Callable[[Sandbox], Awaitable[None]]
PARKED_MAX = 16  # sandboxes parked for groups at once; the least recently used group's are closed beyond it


def spec_key(spec: SandboxSpec) -> str:
    """What makes two specs interchangeable: every field but `labels`, dict order aside."""
    return json.dumps(spec.model_dump(exclude={"labels"}), sort_keys=True, default=str)


@dataclass
class Lease:
    """One episode's sandbox and what getting it cost (the infrastructure time apart from the agent's)."""

    sandbox: Sandbox
    acquire_s: float = 0.0  # asking to holding the task's start state: (create | pooled) + prepare, or reset + check
    reset_s: float | None = None  # the reset + check of a reused sandbox; None when it was not reused
    source: Literal["created", "pooled", "reused"] = "created"
    baseline: str = ""  # reuse: the state hash the group's first episode started from
    mismatches: int = 0  # reused sandboxes closed on the way here, their reset not hashing as the baseline

    def metrics(self) -> dict[str, float]:
        """The trace metadata fields: sandbox_acquire_s, and sandbox_reset_s where the sandbox was reused."""
        out = {"sandbox_acquire_s": round(self.acquire_s, 3)}
        if self.reset_s is not None:
            out["sandbox_reset_s"] = round(self.reset_s, 3)
        if self.mismatches:
            out["sandbox_reset_mismatch"] = self.mismatches
        return out


@dataclass
class _Parked:
    sandbox: Sandbox
    baseline: str
    reset: Reset


@dataclass
class SandboxPool:
    """Sandboxes for one run's episodes (see the module doc). `lease` is the one way in; `close` ends the pool."""

    backend: SandboxBackend
    run_id: str
    warm: int = 0
    reuse: Literal["none", "group"] = "none"
    on_event: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    reset_factory: Callable[[Sandbox], Reset] = reset_for
    on_made: Callable[[Sandbox], Awaitable[None]] | None = None  # run on each sandbox made ahead (warm)
    counts: Counter[str] = field(default_factory=Counter)  # created, pooled, reused, reset_mismatch, ...
    _ready: dict[str, list[Sandbox]] = field(default_factory=dict)
    _making: dict[str, set[asyncio.Task[None]]] = field(default_factory=dict)
    _specs: OrderedDict[str, SandboxSpec] = field(default_factory=OrderedDict)  # by recency, latest last
    _parked: OrderedDict[tuple[str, str], list[_Parked]] = field(default_factory=OrderedDict)
    _closing: set[asyncio.Task[None]] = field(default_factory=set)
    _closed: bool = False
    _made: int = 0
    _left: int | None = None  # leases still to come (`expect`); None: not known, the pool keeps `warm` ahead
    _waiting: Counter[str] = field(default_factory=Counter)  # leases waiting for a sandbox being made, by spec
    _changed: asyncio.Condition | None = None  # a sandbox made ahead is ready, or its making ended

    @contextlib.asynccontextmanager
    async def lease(
        self, spec: SandboxSpec, episode_id: str, *, prepare: Prepare, group: str | None = None
    ) -> AsyncIterator[Lease]:
        """A sandbox made for `spec`, prepared (`prepare` lays out the task: skipped for a reused sandbox, whose
        reset restores that state); closed or parked for `group` on exit. An episode that ends in an exception
        never parks its sandbox."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed (the run has ended)")
        key, started = spec_key(spec), time.monotonic()
        if self._left is not None:
            self._left = max(0, self._left - 1)  # this lease's, fresh or reused
        mismatched = self.counts["reset_mismatch"]
        lease = await self._reused(key, group, started) if self.reuse == "group" and group else None
        if lease is None:
            lease = await self._fresh(spec, key, episode_id, started)
            lease.mismatches = self.counts["reset_mismatch"] - mismatched
            try:
                await prepare(lease.sandbox)
                if self.reuse == "group" and group:
                    reset = self.reset_factory(lease.sandbox)
                    await reset.snapshot(lease.sandbox)
                    await reset.restore(lease.sandbox)  # the start state as a reset leaves it: HOME, tmp empty
                    lease.baseline = await reset.state(lease.sandbox)
            except BaseException:
                await _close_quietly(lease.sandbox)
                raise
            lease.acquire_s = time.monotonic() - started  # the layout included: what a reset stands in for
        try:
            yield lease
        except BaseException:
            await _close_quietly(lease.sandbox)
            raise
        if self.reuse == "group" and group and not self._closed and lease.baseline:
            await self._park(key, group, lease)
        else:
            await close_sandbox(lease.sandbox)

    def expect(self, leases: int) -> None:
        """At most `leases` more leases will come (a run's episodes left): the pool makes no more ahead than they
        take. Without it, each lease's replacement is made until the pool closes: at a run's end `warm` sandboxes
        (and their harnesses, started ahead) nobody leases."""
        self._left = max(0, leases)

    async def close(self) -> None:
        """Stop refilling and close every sandbox the pool holds (ready or parked). Idempotent."""
        self._closed = True
        making = [t for tasks in self._making.values() for t in tasks]
        for task in making:
            task.cancel()
        await asyncio.gather(*making, *self._closing, return_exceptions=True)
        await self._announce()  # leases still waiting for a sandbox made ahead: none will come
        held = [s for ready in self._ready.values() for s in ready]
        held += [p.sandbox for parked in self._parked.values() for p in parked]
        self._ready.clear()
        self._parked.clear()
        await asyncio.gather(*(_close_quietly(s) for s in held))

    async def settle(self) -> None:
        """Wait until the sandboxes being made in the background are ready (or failed): after this, a lease for
        the latest spec finds up to `warm` ready."""
        while making := [t for tasks in self._making.values() for t in tasks]:
            await asyncio.gather(*making, return_exceptions=True)

    @property
    def held(self) -> int:
        """Sandboxes the pool holds now, ready or parked (none once closed)."""
        return sum(map(len, self._ready.values())) + sum(map(len, self._parked.values()))

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- warm pool ---

    async def _fresh(self, spec: SandboxSpec, key: str, episode_id: str, started: float) -> Lease:
        if self.warm > 0:
            self._specs[key] = spec
            self._specs.move_to_end(key)
            self._top_up()
            while True:
                if ready := self._ready.get(key):
                    sandbox = ready.pop()
                    self.counts["pooled"] += 1
                    self._top_up()
                    return Lease(sandbox, time.monotonic() - started, source="pooled")
                # sandboxes for this spec are being made that no other lease waits for: wait for one rather than
                # make one more beside them (the first batch of a run would make twice as many at once)
                if self._closed or len(self._making.get(key, ())) <= self._waiting[key]:
                    break
                await self._wait_for(key)
        sandbox = await self.backend.create(spec, self.run_id, episode_id)
        self.counts["created"] += 1
        return Lease(sandbox, time.monotonic() - started, source="created")

    async def _wait_for(self, key: str) -> None:
        """Until a sandbox made ahead is ready or one being made is done (made, failed or cancelled)."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        self._waiting[key] += 1
        try:
            async with self._changed:
                await self._changed.wait()
        finally:
            self._waiting[key] -= 1

    async def _announce(self) -> None:
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()

    def _top_up(self) -> None:
        """Start making sandboxes for the latest spec until `warm` are ready or being made; room is taken from
        older specs' ready sandboxes first (they are closed)."""
        if self._closed or not self._specs:
            return
        key = next(reversed(self._specs))
        making = self._making.setdefault(key, set())
        ahead = self.warm if self._left is None else min(self.warm, self._left)  # no more than the leases to come
        while len(self._ready.get(key, [])) + len(making) < ahead:
            total = sum(map(len, self._ready.values())) + sum(map(len, self._making.values()))
            if total >= self.warm and not self._evict_other(key):
                break
            task = asyncio.ensure_future(self._make(key, self._specs[key]))
            making.add(task)
            task.add_done_callback(making.discard)
            task.add_done_callback(self._made_one)

    def _made_one(self, task: asyncio.Task[None]) -> None:
        """A making ended (its sandbox ready, failed or cancelled): the leases waiting look again."""
        if self._changed is not None:
            announce = asyncio.ensure_future(self._announce())
            self._closing.add(announce)
            announce.add_done_callback(self._closing.discard)

    def _evict_other(self, keep: str) -> bool:
        for key in self._specs:  # least recent first
            if key != keep and self._ready.get(key):
                task = asyncio.ensure_future(_close_quietly(self._ready[key].pop()))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
                return True
        return False

    async def _make(self, key: str, spec: SandboxSpec) -> None:
        self._made += 1
        try:
            sandbox = await self.backend.create(spec, self.run_id, f"pool-{self._made}")
        except SandboxError as exc:  # the episode that asks next makes its own, and says why if it fails too
            self.counts["pool_error"] += 1
            self.on_event("sandbox_pool_error", {"error": str(exc)[:500]})
            return
        self.counts["created"] += 1
        self.counts["warmed"] += 1
        if self._closed:
            await _close_quietly(sandbox)
            return
        if self.on_made is not None:
            try:
                await self.on_made(sandbox)
            except (SandboxError, OSError) as exc:  # the sandbox still serves, without what on_made adds
                self.counts["pool_error"] += 1
                self.on_event("sandbox_pool_error", {"error": f"after making a sandbox: {exc}"[:500]})
            except BaseException:  # cancelled (the pool closing): the sandbox is nobody's yet, so it is closed here
                await _close_quietly(sandbox)
                raise
        self._ready.setdefault(key, []).append(sandbox)

    # --- reuse per group ---

    async def _reused(self, key: str, group: str, started: float) -> Lease | None:
        while parked := self._parked.get((key, group)):
            entry = parked.pop()
            if not parked:
                del self._parked[(key, group)]
            began = time.monotonic()
            try:
                await entry.reset.kill(entry.sandbox)
                await entry.reset.restore(entry.sandbox)
                now = await entry.reset.state(entry.sandbox)
            except (SandboxError, OSError) as exc:
                now = f"error: {exc}"
            except BaseException:  # cancelled mid-reset: the sandbox is no longer parked, so no one else closes it
                await _close_quietly(entry.sandbox)
                raise
            if now == entry.baseline:
                self.counts["reused"] += 1
                done = time.monotonic()
                return Lease(entry.sandbox, done - started, done - began, "reused", entry.baseline)
            self.counts["reset_mismatch"] += 1
            self.on_event("reset_mismatch", {"group": group, "sandbox": entry.sandbox.id})
            await _close_quietly(entry.sandbox)
        return None

    async def _park(self, key: str, group: str, lease: Lease) -> None:
        """Keep the sandbox for the group's next episode: its processes are ended now (the rest of the reset
        waits for the next episode), and beyond PARKED_MAX the least recently used group's are closed."""
        reset = self.reset_factory(lease.sandbox)
        try:
            await reset.kill(lease.sandbox)
        except (SandboxError, OSError):
            await _close_quietly(lease.sandbox)
            return
        except BaseException:
            await _close_quietly(lease.sandbox)
            raise
        if self._closed:  # the run ended while the processes were being killed
            await _close_quietly(lease.sandbox)
            return
        self._parked.setdefault((key, group), []).append(_Parked(lease.sandbox, lease.baseline, reset))
        self._parked.move_to_end((key, group))
        while sum(map(len, self._parked.values())) > PARKED_MAX:
            oldest = next(iter(self._parked))
            for entry in self._parked.pop(oldest):
                await _close_quietly(entry.sandbox)


async def _close_quietly(sandbox: Sandbox) -> None:
    await close_sandbox(sandbox, quietly=True)


async def close_sandbox(sandbox: Sandbox, quietly: bool = False) -> None:
    """Close a sandbox and stop what was started in it ahead (a warm harness's launcher), in that order: the close
    kills the launcher off the event loop and its command then ends by itself, where stopping the command first
    would kill it on the event loop (a local sandbox scans /proc), one warm sandbox after another at a run's stop."""
    warm = sandbox.hrl_warm
    try:
        if not quietly:
            await sandbox.close()
            return
        with contextlib.suppress(SandboxError, OSError):
            await sandbox.close()
    finally:
        if warm is not None:
            await warm.stop()
