"""Several engine replicas behind one proxy: sticky placement, admission by pressure, failover, control fan-out.

`ReplicaSet` is an `Engine` over N replica engines (each its own server: a vLLM URL, or an engine exposed by
`runners.engines.remote`). The proxy hands it each generation with the call it serves, and it:

- places the session on a replica by its routing policy (`routing.py`): by default `cache_aware`, the session
  stays where it was first placed (the least-loaded replica) until that replica is more than `move_threshold`
  requests busier than the least-loaded one, then moves (counted: `moves`, and the trace's `replica_moves`);
  `hrw` pins it to its rendezvous-hash owner, `round_robin` spreads its calls. Sub-agent / compaction sessions
  (children: `ChildSession.root`) follow their parent;
- admits a generation only while its replica is under budget (`max_inflight` requests in flight, and, on vLLM,
  `max_kv_cache_usage` and `max_waiting` read from its `/metrics`); over budget the request waits here, the
  agent stays blocked on its HTTP call, never a 429;
- skips unhealthy replicas, and when one dies under a generation, continues it on another (the policy's next pick)
  from the tokens already sampled: the call and the trace record the switch (`replica_switches`), nothing is lost;
- fans pause, publish and resume out to every replica, each acknowledged and retried; a replica that still
  fails is fenced (no new generation goes to it) until a later publish brings it to the agreed version, so no
  trace mixes tokens of replicas that disagree on what a version number means. `last_fanout` reports each step.

Each call records its replica (`replica` in the trace's call), each trace the one that served it (`env.replica`).
`take_stats` reports the routing counters and each replica's prefix-cache hit rate (absent where its engine keeps
no prefix-cache counters: the embedded engine has no prefix cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from hrl.runners.engines.base import Engine, ImageInput, PublishKind, SamplingParams, TokenDelta
from hrl.runners.engines.routing import Router, RoutingConfig, hrw_rank
from hrl.runners.errors import ContextLengthError, EngineError

if TYPE_CHECKING:
    from hrl.runners.engines.base import Routed

__all__ = ["Replica", "ReplicaSet", "ReplicaSetConfig", "RoutingConfig", "hrw_rank", "parse_vllm_metrics"]


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """vLLM's Prometheus `/metrics`: the KV-cache use (0–1), running and waiting requests, prefix-cache counters
    (summed over label sets; names with or without the `vllm:` prefix, old and new spellings)."""
    want = {
        "kv_cache_usage_perc": "kv_cache_usage",
        "gpu_cache_usage_perc": "kv_cache_usage",
        "cpu_cache_usage_perc": "kv_cache_usage",
        "num_requests_waiting": "waiting",
        "num_requests_running": "running",
        "prefix_cache_queries_total": "prefix_queries",
        "prefix_cache_hits_total": "prefix_hits",
    }
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(" ")
        base = name.split("{", 1)[0].removeprefix("vllm:")
        key = want.get(base)
        if key is None:
            continue
        with contextlib.suppress(ValueError):
            value = float(rest.split()[0])
            out[key] = max(out.get(key, 0.0), value) if key == "kv_cache_usage" else out.get(key, 0.0) + value
    return out


class ReplicaSpec(BaseModel):
    name: str = Field("", description="Its name in routing and traces; default r0, r1, ….")
    engine: str = Field("scripted", description="embedded | vllm | scripted | remote | an http:// vLLM URL.")
    options: dict[str, Any] = Field(default_factory=dict, description="That engine's options (e.g. url for remote).")


class ReplicaSetConfig(RoutingConfig):
    """`engine: replicas` (`engine_options` of a recipe): one proxy in front of several engine servers."""

    model: str = Field(description="The served model (each replica serves it).")
    replicas: list[ReplicaSpec] = Field(default_factory=list, description="The engine replicas, in order.")


@dataclass
class Replica:
    """One engine server and what the router knows of it."""

    name: str
    engine: Engine
    healthy: bool = True
    fenced: bool = False  # a publish failed on it: no new generation until a publish reaches it
    version: int = 0
    inflight: int = 0
    served: int = 0  # generations admitted
    metrics: dict[str, float] = field(default_factory=dict)
    external: int = 0  # requests its engine ran or queued beyond ours at the last poll (another shard's)

    @property
    def load(self) -> int:
        """Requests on it now as far as this router knows: ours in flight, plus the others last seen."""
        return self.inflight + self.external

    def over_budget(self, cfg: RoutingConfig) -> bool:
        if cfg.max_inflight and self.inflight >= cfg.max_inflight:
            return True
        if self.metrics.get("kv_cache_usage", 0.0) >= cfg.max_kv_cache_usage and self.inflight > 0:
            return True
        return bool(cfg.max_waiting and self.metrics.get("waiting", 0.0) >= cfg.max_waiting and self.inflight > 0)


async def _probe(engine: Engine) -> tuple[bool, dict[str, float]]:
    """Is the replica alive, and its vLLM metrics when it has them."""
    try:
        ok = bool(await engine.health())
    except Exception:
        return False, {}
    metrics: dict[str, float] = {}
    if ok:
        with contextlib.suppress(Exception):
            metrics = await engine.read_metrics()
    return ok, metrics


class ReplicaSet(Engine):
    """An `Engine` over several replicas (see the module doc). `routes = True` tells the proxy to pass the call."""

    name = "replicas"
    routes = True

    def __init__(self, config: ReplicaSetConfig, engines: dict[str, Engine] | None = None) -> None:
        """The replicas are `engines` when given (tests, the Ray placement), else built from `config.replicas`."""
        if engines is None:
            from hrl.runners.engines import make_engine

            engines = {
                spec.name or f"r{i}": make_engine(spec.engine, config.model, **spec.options)
                for i, spec in enumerate(config.replicas)
            }
        if not engines:
            raise ValueError("a replica set needs at least one replica (engine_options.replicas)")
        self.replicas = {n: Replica(n, e) for n, e in engines.items()}
        self.config = config
        self._changed = asyncio.Condition()
        self._serving: dict[str, Replica] = {}  # request id -> the replica generating it now
        self._aborted: set[str] = set()
        self._watch: asyncio.Task[None] | None = None
        self.last_fanout: dict[str, Any] = {}
        self.switches = 0  # generations moved off a dead replica
        self.waits = 0  # generations that waited for their replica's budget
        self.router = Router(config)
        self._marks: dict[str, tuple[float, float]] = {}  # replica -> prefix (queries, hits) at the last take_stats
        self._taken = (0, 0, 0)  # moves, rehomes, switches at the last take_stats

    # ---- the Engine protocol -------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        live = [r.version for r in self.replicas.values() if not r.fenced]
        return max(live) if live else max(r.version for r in self.replicas.values())

    @property
    def max_model_len(self) -> int:
        lens = [int(r.engine.max_model_len or 0) for r in self.replicas.values()]
        return min((n for n in lens if n), default=0)

    @property
    def continues_in_place(self) -> bool:
        return all(r.engine.continues_in_place for r in self.replicas.values())

    @property
    def takes_images(self) -> bool:
        """Every replica takes images (a call with images may land on, or fail over to, any of them)."""
        return all(r.engine.takes_images for r in self.replicas.values())

    @property
    def images_refused(self) -> str | None:
        return next((why for r in self.replicas.values() if (why := r.engine.images_refused)), None)

    def loaded_versions(self) -> list[int]:
        sets = [set(r.engine.loaded_versions()) for r in self.usable()]
        return sorted(set.intersection(*sets)) if sets else []

    async def start(self) -> None:
        await asyncio.gather(*(r.engine.start() for r in self.replicas.values()))
        for r in self.replicas.values():
            r.version = r.engine.version
        if len({r.version for r in self.replicas.values()}) > 1:  # e.g. attached to servers of another run
            top = max(r.version for r in self.replicas.values())
            for r in self.replicas.values():
                r.fenced = r.version != top
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        await asyncio.gather(*(r.engine.close() for r in self.replicas.values()), return_exceptions=True)

    async def abort(self, request_id: str) -> None:
        replica = self._serving.get(request_id)
        if replica is not None:
            self._aborted.add(request_id)
            await replica.engine.abort(request_id)

    async def pause(self) -> None:
        await self._fan_out("pause", lambda r: r.engine.pause())

    async def resume(self) -> None:
        await self._fan_out("resume", lambda r: r.engine.resume())

    def check_publish(self, kind: PublishKind) -> None:
        """Raise now when any replica's server cannot take a `kind` publish."""
        for r in self.replicas.values():
            r.engine.check_publish(kind)

    async def publish(
        self, path: str, kind: PublishKind, version: int | None = None, paths: dict[str, str] | None = None
    ) -> int:
        """Publish to every replica as one version number; fence the ones that still fail after the retries.
        `paths`: each replica's own copy of the checkpoint (shipped to its node); one missing from it is fenced."""
        target = self.version + 1 if version is None else version

        async def one(r: Replica) -> None:
            if paths is not None and r.name not in paths:
                raise EngineError(f"version {target}'s checkpoint did not reach replica {r.name}'s node")
            got = await r.engine.publish(paths[r.name] if paths is not None else path, kind, target)
            r.version, r.fenced = got, got != target

        report = await self._fan_out("publish", one, every=True)
        self.last_publish_tier = next(
            (r.engine.last_publish_tier for r in self.replicas.values() if r.name in report["acked"]),
            "",
        )
        return target

    # ---- routing -------------------------------------------------------------------------------------------
    def usable(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.healthy and not r.fenced]

    def owner(self, key: str) -> Replica | None:
        """A session key's HRW owner: the first usable replica in its rendezvous order (the `hrw` policy's pick)."""
        ranked = hrw_rank(key, [r.name for r in self.usable()])
        return self.replicas[ranked[0]] if ranked else None

    def _loads(self) -> dict[str, int]:
        return {r.name: r.load for r in self.usable()}

    async def _admit(self, key: str, call: Routed | None = None) -> Replica:
        """Wait until the session's replica is under budget (or another takes the session over); count it in."""
        waited = False
        async with self._changed:
            while True:
                loads = self._loads()
                name = self.router.pick(key, loads)
                replica = self.replicas[name] if name is not None else None
                if replica is not None and not replica.over_budget(self.config):
                    moved_from = self.router.placed(key, replica.name, loads)
                    if moved_from is not None and call is not None:
                        call.moved(moved_from, replica.name, {n: loads[n] for n in (moved_from, replica.name)})
                    replica.inflight += 1
                    replica.served += 1
                    self.waits += waited
                    return replica
                waited = True
                with contextlib.suppress(TimeoutError):  # metrics and health change without a notify
                    await asyncio.wait_for(self._changed.wait(), self.config.poll_s)

    async def _release(self, replica: Replica) -> None:
        async with self._changed:
            replica.inflight -= 1
            self._changed.notify_all()

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        version: int | None = None,
        call: Routed | None = None,
        images: list[ImageInput] | None = None,
    ) -> AsyncIterator[TokenDelta]:
        """Generate on the call's replica; if that replica dies mid-way, go on from the sampled tokens on the next
        (with images, that replica expands them again: its first delta's prompt holds the tokens sampled so far)."""
        with_images: dict[str, Any] = {"images": images} if images else {}
        key = call.sticky_key if call is not None else request_id
        sampled: list[int] = []
        lost: tuple[str, str] | None = None  # (replica, error) of a failover under way
        while True:
            replica = await self._admit(key, call)
            if call is not None:
                call.ran_on(replica.name)
                if lost is not None:
                    call.switched(lost[0], replica.name, len(sampled), lost[1])
            self._serving[request_id] = replica
            left = params.max_tokens - len(sampled)
            try:
                async for delta in replica.engine.generate(request_id, prompt_ids + sampled,
                                                           replace(params, max_tokens=left), version=version,
                                                           **with_images):  # fmt: skip
                    if delta.finish_reason == "abort" and request_id not in self._aborted:
                        raise EngineError(f"replica {replica.name} aborted the generation")
                    sampled += delta.token_ids
                    yield delta
                return
            except ContextLengthError:
                raise
            except (EngineError, OSError) as e:
                if request_id in self._aborted or not await self._lost(replica):
                    raise  # the call's own failure, on a live replica
                if not self.usable():
                    raise EngineError(f"every engine replica is down (the last, {replica.name}: {e})") from e
                self.switches += 1
                lost = (replica.name, str(e))
            finally:
                self._serving.pop(request_id, None)
                self._aborted.discard(request_id)
                await self._release(replica)

    async def _lost(self, replica: Replica) -> bool:
        """After an error: is the replica gone? (probed now; a dead one is skipped until it answers again)"""
        ok, _ = await _probe(replica.engine)
        if not ok:
            async with self._changed:
                replica.healthy = False
                self._changed.notify_all()
        return not ok

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_s)
            await self.refresh()

    async def refresh(self) -> list[dict[str, Any]]:
        """Probe every replica now (health, vLLM metrics, the version it serves) and fence laggards; the periodic
        watch does this every `poll_s`, and a driver that published to the replicas itself calls it on each shard
        so the new version is adopted before the next step (`runners.placement`). Returns `describe()`."""
        probes = await asyncio.gather(*(_probe(r.engine) for r in self.replicas.values()))
        async with self._changed:
            for r, (ok, metrics) in zip(self.replicas.values(), probes, strict=True):
                r.healthy, r.metrics = ok, metrics or r.metrics
                if metrics:  # what its engine holds beyond our in-flight generations: another shard's
                    busy = metrics.get("running", 0.0) + metrics.get("waiting", 0.0)
                    r.external = max(0, int(busy) - r.inflight)
                if ok:  # published elsewhere (the driver fans out to the replicas itself)
                    r.version = max(r.version, r.engine.version)
            self._fence_laggards()
            self._changed.notify_all()
        return self.describe()

    def _fence_laggards(self) -> None:
        """A healthy replica behind the newest version another one holds serves no new generation until it
        catches up: a session never moves from v to an older v-1 or mixes what two replicas call one version."""
        top = max((r.version for r in self.replicas.values() if r.healthy), default=0)
        for r in self.replicas.values():
            r.fenced = r.version < top

    # ---- control-plane fan-out -----------------------------------------------------------------------------
    async def _fan_out(self, step: str, do: Callable[[Replica], Awaitable[Any]], every: bool = False) -> dict[str, Any]:
        """Run `do` on every replica at once (on every healthy one, or all with `every`); retry failures; fence
        what still fails. Raises EngineError when no replica acknowledged."""
        targets = [r for r in self.replicas.values() if every or r.healthy]
        failed: dict[str, str] = {}

        async def one(r: Replica) -> bool:
            for attempt in range(self.config.publish_retries + 1):
                try:
                    await do(r)
                    failed.pop(r.name, None)
                    return True
                except Exception as e:
                    failed[r.name] = f"{type(e).__name__}: {e}"[:300]
                    await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
            return False

        oks = await asyncio.gather(*(one(r) for r in targets))
        acked = [r.name for r, ok in zip(targets, oks, strict=True) if ok]
        if step == "publish":
            for r, ok in zip(targets, oks, strict=True):
                r.fenced = r.fenced or not ok
            if acked:
                self._fence_laggards()
        self.last_fanout = {"step": step, "acked": acked, "failed": dict(failed), "at": time.time()}
        async with self._changed:
            self._changed.notify_all()
        if not acked:
            raise EngineError(f"{step} failed on every engine replica: {failed}")
        return self.last_fanout

    def describe(self) -> list[dict[str, Any]]:
        """Each replica's state, for logs and tests; `prefix_hit_rate` None where its engine keeps no counters."""
        return [
            {"name": r.name, "healthy": r.healthy, "fenced": r.fenced, "version": r.version, "inflight": r.inflight,
             "external": r.external, "served": r.served, **r.metrics, "prefix_hit_rate": _hit_rate(r.metrics)}
            for r in self.replicas.values()
        ]  # fmt: skip

    def take_stats(self) -> dict[str, float]:
        """The routing metrics since the last call: `routing/moves` (cache_aware sessions moved for load),
        `routing/rehomes` (re-placed off a dead or fenced replica), `routing/switches` (generations failed over
        mid-way), and `routing/<replica>/prefix_hit_rate` (prefix-cache hits over queries, in tokens, from the
        counters its engine reports at the last poll). A replica without such counters, or with no query since the
        last call, has no rate: absent, never 0; so are the counts of a set that routed nothing (the Ray driver's)."""
        out: dict[str, float] = {}
        if any(r.served for r in self.replicas.values()):  # a set that routes (not the Ray driver's control set)
            counts = (self.router.moves, self.router.rehomes, self.switches)
            out = {f"routing/{k}": float(now - then)
                   for k, now, then in zip(("moves", "rehomes", "switches"), counts, self._taken, strict=True)}  # fmt: skip
            self._taken = counts
        for r in self.replicas.values():
            if "prefix_queries" not in r.metrics:
                continue
            mark = (r.metrics["prefix_queries"], r.metrics.get("prefix_hits", 0.0))
            queries0, hits0 = self._marks.get(r.name, (0.0, 0.0))
            if mark[0] < queries0:  # the server restarted: its counters began again
                queries0, hits0 = 0.0, 0.0
            if mark[0] > queries0:
                out[f"routing/{r.name}/prefix_hit_rate"] = round((mark[1] - hits0) / (mark[0] - queries0), 4)
            self._marks[r.name] = mark
        return out


def _hit_rate(metrics: dict[str, float]) -> float | None:
    """Prefix-cache hits over queries since the engine started; None without counters or queries."""
    queries = metrics.get("prefix_queries", 0.0)
    return round(metrics.get("prefix_hits", 0.0) / queries, 4) if queries else None
