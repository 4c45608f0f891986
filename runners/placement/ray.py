"""`--placement ray`: engine replicas, a node agent per node and a proxy shard per node, supervised by Ray.

What runs where (docs/ray.md has the diagram):

- **driver** (the `hrl rollout` / `hrl train` process): the task list, the trainer (in process, or its ranks as Ray
  actors with `placement.trainer: ray`: `hrl.train.ray_group`), the run directory
  (every finished trace comes back here and is written as with `--placement local`), and the control plane: a
  `ReplicaSet` over every replica that fans pause / publish / resume out, acknowledged and retried.
- **`EngineReplica` actors** (`placement.engine_replicas`, each in a placement group of `{GPU: tp}` when
  `placement.replica_gpus` is set): one engine server each. vLLM serves its own HTTP; an embedded or scripted
  engine is served by `runners.engines.remote`.
- **`NodeAgent` actors**, one per node (pinned to it): the node's proxy shard (a `ReplicaSet` in front of every
  replica, sticky by rendezvous hashing, so all shards place a session alike), its Docker daemon, its sandboxes and
  agent processes; it runs up to K episodes at once (`placement.episodes_per_node`). Agents reach the proxy on
  their own node: egress stays on the node.

Ray carries only control and finished traces: every token travels over HTTP from a replica to the shard that asked.
That HTTP crosses nodes, so it is closed: the driver makes a secret per run and hands it through Ray (actor
arguments) to every replica's `engine_app` and to the shards and control plane that call it; every route needs it.
What need not cross nodes stays on loopback: a vLLM replica's own server (its dev routes unpickle, load weights,
sleep) and each shard's proxy.
A node agent that dies takes its episodes with it: each becomes an `internal_error` trace at the driver and the
node's containers of the run (labelled `hrl.run=<run>.n<i>`) are removed by a task on that node. A replica that dies
is failed over by each shard (`runners.engines.replicas`).

Ray is imported only under `runners/placement/` (here, and the cluster's join) and by `hrl.train.ray_group` (the
trainer's ranks as actors, `placement.trainer: ray`), and only when the placement is `ray`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from hrl.config import PlacementConfig, RunConfig
from hrl.runners.durable import write_atomically
from hrl.runners.errors import PrerequisiteError, UsageError
from hrl.runners.placement.plan import replica_cpus
from hrl.runners.placement.ray_cluster import init_ray
from hrl.runners.rollouts.episodes import Episode, Rollouts, failed_trace
from hrl.runners.trace import Export, write_trace

if TYPE_CHECKING:
    from hrl.runners.engines.replicas import ReplicaSet

__all__ = ["RayPlacement", "ShardedPublisher", "ray_placement"]

Event = Callable[[str, dict[str, Any]], None]
log = logging.getLogger(__name__)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_KEEP_SHIPPED = 3


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise PrerequisiteError("--placement ray needs Ray", hint="pip install 'hrl[ray]'") from e
    return ray


def node_of_this_process() -> dict[str, Any]:
    """Where the calling process runs: Ray's node id and address, and its devices (the GPUs Ray gave it, else cpu)."""
    ray = _ray()
    ctx = ray.get_runtime_context()
    gpus = [str(g) for g in ray.get_gpu_ids()] if ctx.worker.mode == ray.WORKER_MODE else []
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "devices": [f"cuda:{g}" for g in gpus] or ["cpu"]}  # fmt: skip


class _LoopThread:
    """An event loop on its own thread (a Ray actor's engine server lives there)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro: Any, timeout: float = 900) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def _on_loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return host == "localhost"


def _replica_engine_options(name: str, opts: dict[str, Any]) -> dict[str, Any]:
    """A replica's engine options: a vLLM server the actor starts listens on its node's loopback only (its API
    and dev routes have no auth; the shards reach it through `engine_app`). A host elsewhere is refused."""
    if name != "vllm" or opts.get("url"):
        return opts
    host = str(opts.get("host", "127.0.0.1"))
    if not _on_loopback(host):
        raise UsageError(
            f"under --placement ray a replica's vLLM server listens on loopback, not {host}: "
            "the shards reach it through the replica's authenticated server",
            hint="drop engine_options.host",
        )
    return {**opts, "host": host}


class EngineReplica:
    """One engine (a Ray actor) behind `engine_app`, on the node's address and open only to the run's secret: the
    version authority of its replica. A vLLM replica's server runs beside it on the node's loopback; the shards
    reach it through this face (versions, pause, `/metrics`)."""

    def __init__(self, model: str, engine: str, options: dict[str, Any], secret: SecretStr) -> None:
        self.model, self.engine_name, self.options = model, engine, options
        self._secret = secret  # from the driver, through Ray; never in an environment, a file or a trace
        self.thread = _LoopThread()
        self.engine: Any = None
        self.runner: Any = None
        self.weights: Path | None = None  # shipped checkpoints, on this node
        self.received = -1

    def start(self) -> str:
        from hrl.runners.engines import engine_kind, make_engine
        from hrl.runners.engines.remote import serve_engine

        host = _ray().util.get_node_ip_address()  # the shards on other nodes reach this server
        name, opts = engine_kind(self.engine_name, self.options)
        self.engine = make_engine(name, self.model, **_replica_engine_options(name, opts))
        self.runner, url = self.thread.run(serve_engine(self.engine, token=self._secret, host=host))
        return str(url)

    def where(self) -> dict[str, Any]:
        return node_of_this_process()

    def receive(self, version: int, files: dict[str, bytes], sha256: dict[str, str]) -> str:
        """A checkpoint shipped to this replica's node (`placement.weights: ship`): each file checked against the
        driver's sha256, a version older than one already here refused. Returns the folder to publish from; the
        last `_KEEP_SHIPPED` versions stay (an engine may read an adapter again later)."""
        import shutil
        import tempfile

        if version <= self.received:
            raise PrerequisiteError(f"replica got version {version} after version {self.received}: refused")
        if self.weights is None:
            self.weights = Path(tempfile.mkdtemp(prefix="hrl-weights-"))
        out = self.weights / f"v{version:06d}"
        for name, data in files.items():
            if hashlib.sha256(data).hexdigest() != sha256.get(name):
                raise PrerequisiteError(f"version {version}'s {name} arrived with another sha256 than it was sent")
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            write_atomically(out / name, data)
        if set(sha256) - set(files):
            raise PrerequisiteError(f"version {version} arrived without {sorted(set(sha256) - set(files))}")
        self.received = version
        for old in sorted(self.weights.iterdir())[:-_KEEP_SHIPPED]:
            shutil.rmtree(old, ignore_errors=True)
        return str(out)

    def stop(self) -> None:
        if self.runner is not None:
            self.thread.run(self.runner.cleanup(), 30)
        if self.engine is not None:
            self.thread.run(self.engine.close(), 60)
        if self.weights is not None:
            import shutil

            shutil.rmtree(self.weights, ignore_errors=True)


class NodeAgent:
    """A node's proxy shard, Docker and agents (a Ray actor pinned to its node); runs K episodes at once."""

    def __init__(self, index: int, k: int) -> None:
        self.index, self.sem = index, asyncio.Semaphore(max(1, k))
        self.exit: contextlib.AsyncExitStack | None = None
        self.rollouts: Any = None
        self.stack: Any = None
        self.trace_file: Path | None = None

    async def start(self, settings: RunConfig, model: str, replicas: dict[str, str], secret: SecretStr) -> str:
        """Stand the node's share of the run up as a local run whose engine is the set of replicas."""
        from hrl.runners.placement.local import local_placement
        from hrl.runners.scratch import scratch_dir

        self.exit = contextlib.AsyncExitStack()
        roll = settings.rollout.model_copy(update={"run_id": f"{settings.rollout.run_id}.n{self.index}"})
        here = await self.exit.enter_async_context(
            local_placement(
                settings,
                model,
                "replicas",
                harnesses=roll.harnesses,
                engine_options=_replica_set(replicas, settings, secret),
            )
        )
        self.stack = here.stack
        self.rollouts = await here.prepare(rollout=roll)
        self.trace_file = scratch_dir("node") / "traces.jsonl"  # the node's own copy; the driver writes the run's
        self.stack.proxy.keep_media(self.trace_file.parent / "media")  # the driver fetches them (`media`)
        return str(_ray().get_runtime_context().get_node_id())

    async def episode(self, ep: Episode) -> dict[str, Any]:
        from hrl.runners.rollouts.episodes import guarded_episode

        assert self.rollouts is not None, "NodeAgent.start first"
        assert self.trace_file is not None
        async with self.sem:
            return await guarded_episode(self.rollouts, ep, self.trace_file)

    def media(self, shas: list[str]) -> dict[str, bytes]:
        """The bytes of these images as this node's proxy kept them (those it has): the driver keeps them beside the
        run's traces, where training reads them."""
        folder = self.trace_file.parent / "media" if self.trace_file is not None else None
        found = [s for s in shas if folder is not None and _SHA256.fullmatch(s) and (folder / s).is_file()]
        return {s: (folder / s).read_bytes() for s in found if folder is not None}

    def describe(self) -> list[dict[str, Any]]:
        """This shard's view of the replicas: health, version, generations in flight (runners.engines.replicas)."""
        return list(self.stack.engine.describe()) if self.stack is not None else []

    async def sync(self) -> list[dict[str, Any]]:
        """Re-read every replica now (after the driver published to them): the shard adopts the new version and
        fences a replica that lags, without waiting for its next poll. Returns the shard's view."""
        return list(await self.stack.engine.refresh()) if self.stack is not None else []

    async def stop(self) -> None:
        if self.exit is not None:
            await self.exit.aclose()
            self.exit = None
        if self.trace_file is not None:
            import shutil

            shutil.rmtree(self.trace_file.parent, ignore_errors=True)


def _replica_set(urls: dict[str, str], settings: RunConfig, secret: SecretStr) -> dict[str, Any]:
    """`engine_options` of a ReplicaSet over the replicas' servers (the recipe's `routing:` section applied)."""
    specs = [{"name": n, "engine": "remote", "options": {"url": u, "token": secret}} for n, u in urls.items()]
    return {"replicas": specs, **settings.placement.routing}


def _prune_node(run_id: str) -> int:
    """Remove the containers of a node's share of a run (a task on that node, after its agent died)."""
    import docker

    client = docker.from_env()
    left = client.containers.list(all=True, filters={"label": f"hrl.run={run_id}"}, ignore_removed=True)
    for c in left:
        with contextlib.suppress(docker.errors.APIError):
            c.remove(force=True)
    return len(left)


@dataclass
class _Node:
    index: int
    node_id: str
    actor: Any
    k: int
    running: int = 0
    dead: str | None = None
    started: list[str] = field(default_factory=list)


class RayRollouts(Rollouts):
    """The `Rollouts` protocol over the node agents: an episode runs on the least busy live node; its trace comes
    back and is written here, by the driver. A node agent that dies ends its episodes as `internal_error` traces."""

    def __init__(self, nodes: list[_Node], run_id: str, on_event: Event, export: Export | None = None) -> None:
        self.nodes, self.run_id, self.on_event, self.export = nodes, run_id, on_event, export
        self.media_dir: Path | None = None  # where the run keeps its images (`ShardedPublisher.keep_media`)
        self._free = asyncio.Condition()
        self.lost_nodes: dict[int, str] = {}

    def prepare(self) -> None:  # each node agent prepared its own install at start
        return None

    async def _take(self) -> _Node | None:
        async with self._free:
            while True:
                live = [n for n in self.nodes if n.dead is None]
                if not live:
                    return None
                node = min(live, key=lambda n: n.running / n.k)
                if node.running < node.k:
                    node.running += 1
                    return node
                await self._free.wait()

    async def _give(self, node: _Node) -> None:
        async with self._free:
            node.running -= 1
            self._free.notify_all()

    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        ray = _ray()
        started = time.time()
        node = await self._take()
        if node is None:
            trace = failed_trace(ep, "internal_error", "every node agent of the Ray placement has died", started)
            return self._write(trace_file, trace)
        self.on_event("episode_start", {"episode": ep.key, "node": node.index})
        ref = node.actor.episode.remote(ep)
        try:
            trace: dict[str, Any] = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)
            trace = failed_trace(ep, "cancelled", "cancelled at the driver", started)
            self._write(trace_file, trace)
            raise
        except ray.exceptions.RayError as e:
            await self._lost(node, e)
            why = f"the node agent on node {node.index} ({node.node_id[:12]}) died under the episode: {e}"
            trace = failed_trace(ep, "internal_error", why[:2000], started)
        finally:
            await self._give(node)
        trace.setdefault("metadata", {})["node"] = node.index
        await self._fetch_media(node, trace)
        self._write(trace_file, trace)
        self.on_event("episode_end", {"episode": ep.key, "reward": trace["reward"], "failure": trace["failure_reason"]})
        return trace

    async def _fetch_media(self, node: _Node, trace: dict[str, Any]) -> None:
        """The images of a trace, from the node whose proxy shard kept them into `media_dir` (set by `keep_media`, as
        a local run's proxy keeps them), each checked against its sha256. One that cannot be had is logged; the
        step then leaves the trace out and counts it (`train/image_traces`), as for any image missing there."""
        if self.media_dir is None:
            return
        shas = {m["sha256"] for c in trace.get("calls") or [] for m in c.get("media") or [] if "sha256" in m}
        want = sorted(s for s in shas if not (self.media_dir / s).is_file())
        if not want:
            return
        try:
            got: dict[str, bytes] = await node.actor.media.remote(want)
        except Exception as e:  # a node gone after its episode: the trace is still written, its images missing
            log.warning("images of trace %s not fetched from node %d: %s", trace.get("trace_id"), node.index, e)
            return
        self.media_dir.mkdir(parents=True, exist_ok=True)
        for sha in want:
            data = got.get(sha)
            if data is None or hashlib.sha256(data).hexdigest() != sha:
                log.warning("image %s of trace %s: node %d %s", sha[:12], trace.get("trace_id"), node.index,
                            "does not have it" if data is None else "sent other bytes")  # fmt: skip
                continue
            write_atomically(self.media_dir / sha, data)

    def _write(self, trace_file: Path, trace: dict[str, Any]) -> dict[str, Any]:
        write_trace(trace_file, trace, self.export)
        return trace

    async def _lost(self, node: _Node, error: Exception) -> None:
        """Mark a node agent dead (once) and remove its containers with a task on its node."""
        if node.dead is not None:
            return
        node.dead = str(error)[:300]
        self.lost_nodes[node.index] = node.dead
        async with self._free:
            self._free.notify_all()
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        prune = ray.remote(num_cpus=0)(_prune_node).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
        )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(prune.remote(f"{self.run_id}.n{node.index}"), 120)


class ShardedPublisher:
    """The driver's control plane: pause / publish / resume fan out to every replica (a `ReplicaSet`, acknowledged,
    retried, fencing what fails), and a publish then waits until every proxy shard has adopted the new version
    (`NodeAgent.sync`), so no episode of the next step starts on a shard still routing by the old one. A shard that
    does not answer is reported in `last_fanout["shards"]` (its node's episodes fail on their own)."""

    def __init__(
        self,
        control: ReplicaSet,
        agents: list[Any],
        rollouts: RayRollouts,
        sync_timeout_s: float = 60.0,
        *,
        replicas: dict[str, Any] | None = None,
        where: dict[str, Any] | None = None,
        settings: PlacementConfig | None = None,
    ) -> None:
        self.control, self.agents, self.rollouts, self.sync_timeout_s = control, agents, rollouts, sync_timeout_s
        self.engine = control  # what the loop reads of an engine: the ReplicaSet's last publish tier
        self.stats: dict[str, float] = {}  # no proxy runs in the driver: its queue and pause figures are the shards'
        self.replicas = replicas or {}  # name -> EngineReplica actor
        self.where = where or {}  # "driver" and each replica: node id, address, devices
        self.placement = settings or PlacementConfig()
        driver = self.where.get("driver", {}).get("node_id")
        elsewhere = any(w.get("node_id") != driver for n, w in self.where.items() if n != "driver")
        self.ship = self.placement.weights == "ship" or (self.placement.weights == "auto" and elsewhere)

    def placement_record(self, ranks: list[dict[str, Any]] | None, nproc: int) -> dict[str, Any]:
        """Where each piece of the run is (the run directory's placement.json): the driver, the trainer's ranks (as
        the Ray trainer placed them; else all on the driver's node), the engine replicas."""
        driver = self.where.get("driver", {})
        ranks = ranks or [{"rank": r, **driver} for r in range(nproc)]
        replicas = [{"replica": n, **w, "url": self.control.replicas[n].engine.url if n in self.control.replicas
                     else ""} for n, w in self.where.items() if n != "driver"]  # fmt: skip
        return {"driver": driver, "trainer": self.placement.trainer, "weights": "ship" if self.ship else "disk",
                "trainer_ranks": ranks, "replicas": replicas}  # fmt: skip

    async def _ship(self, path: str, version: int) -> dict[str, str]:
        """The checkpoint's files, put once in Ray's object store and written by each replica on its node: the path
        each replica publishes from. A replica it did not reach is left out (the publish fences it) and reported."""
        ray = _ray()
        files = await asyncio.to_thread(_checkpoint_files, Path(path))
        sha = {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}
        ref = ray.put(files)
        names_r = list(self.replicas)
        got = await asyncio.gather(*(self.replicas[n].receive.remote(version, ref, sha) for n in names_r),
                                   return_exceptions=True)  # fmt: skip
        paths = {n: p for n, p in zip(names_r, got, strict=True) if isinstance(p, str)}
        self.shipped = {"version": version, "bytes": sum(len(b) for b in files.values()), "acked": sorted(paths),
                        "failed": {n: f"{type(e).__name__}: {e}"[:300] for n, e in zip(names_r, got, strict=True)
                                   if not isinstance(e, str)}}  # fmt: skip
        return paths

    def take_cpu_per_token(self) -> float | None:
        """None: no proxy runs in the driver; each shard measures its own CPU per token."""
        return None

    def keep_media(self, folder: str | Path) -> None:
        """Keep the run's images in `folder`, as a local proxy does: each episode's are fetched from its node."""
        self.rollouts.media_dir = Path(folder)

    async def pause(self) -> None:
        await self.control.pause()

    async def resume(self) -> None:
        await self.control.resume()

    @property
    def last_fanout(self) -> dict[str, Any]:
        """The replica set's report of its last fan-out (a publish's with the shards' in `shards`)."""
        return self.control.last_fanout

    async def publish(self, path: str, kind: Any, version: int | None = None) -> int:
        target = self.control.version + 1 if version is None else version
        paths = await self._ship(path, target) if self.ship and self.replicas else None
        target = await self.control.publish(path, kind, target, paths=paths)
        if paths is not None:
            self.control.last_fanout["shipped"] = self.shipped
        views = await asyncio.gather(
            *(asyncio.wait_for(a.sync.remote(), self.sync_timeout_s) for a in self.agents), return_exceptions=True
        )
        acked, failed = [], {}
        for i, view in enumerate(views):
            if isinstance(view, BaseException):
                failed[i] = f"{type(view).__name__}: {view}"[:300]
            elif any(r["version"] == target and r["healthy"] and not r["fenced"] for r in view):
                acked.append(i)
            else:
                failed[i] = f"serves no replica at version {target}: {[(r['name'], r['version']) for r in view]}"
        self.control.last_fanout["shards"] = {"acked": acked, "failed": failed}
        return target


@dataclass
class RayPlacement:
    rollouts: RayRollouts
    publisher: ShardedPublisher  # pause / publish / resume fan out from here, to the replicas and then the shards
    replicas: dict[str, Any]  # name -> EngineReplica actor handle
    urls: dict[str, str]
    agents: list[Any]
    started_ray: bool

    async def run(self, episodes: list[Episode], trace_file: Path, concurrency: int) -> list[dict[str, Any]]:
        """The run's episodes over the node agents, each trace written here as it comes back."""
        from hrl.runners.rollouts.episodes import run_episodes

        return await run_episodes(self.rollouts, episodes, trace_file, concurrency)


def _checkpoint_files(folder: Path) -> dict[str, bytes]:
    """What a replica loads of a checkpoint, by relative name: every file but the optimizer's state."""
    files = sorted(f for f in folder.rglob("*") if f.is_file() and not f.name.startswith("optimizer"))
    return {str(f.relative_to(folder)): f.read_bytes() for f in files}


def _driver_node(ray: Any) -> dict[str, Any]:
    return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "devices": []}  # fmt: skip


async def _replica_resources(pcfg: PlacementConfig, groups: list[Any]) -> dict[str, Any]:
    """Ray options of one engine replica: its CPUs, or with `replica_gpus` a placement group of its GPUs and CPUs,
    ready (and added to `groups`, which `_stop` removes)."""
    if not pcfg.replica_gpus:
        return {"num_cpus": pcfg.replica_cpus}
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cpus = replica_cpus(pcfg)
    pg = placement_group([{"GPU": pcfg.replica_gpus, "CPU": cpus}])
    await pg.ready()
    groups.append(pg)
    return {"num_gpus": pcfg.replica_gpus, "num_cpus": cpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(pg)}  # fmt: skip


def _node_agents(ray: Any, pcfg: PlacementConfig, concurrency: int, agents: list[Any]) -> tuple[list[_Node], int]:
    """A node agent pinned to each live node (the first `placement.nodes`), and k, the episodes each runs at once
    (`episodes_per_node`, else a share of `concurrency`); each actor joins `agents` as it is made."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [n for n in ray.nodes() if n.get("Alive")]
    alive = alive[: pcfg.nodes or None]
    k = pcfg.episodes_per_node or max(1, -(-concurrency // len(alive)))
    agent_cls = ray.remote(NodeAgent)
    nodes = []
    for i, n in enumerate(alive):
        strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        actor = agent_cls.options(num_cpus=0, max_concurrency=max(8, 2 * k), max_restarts=0,
                                  scheduling_strategy=strategy).remote(i, k)  # fmt: skip
        agents.append(actor)
        nodes.append(_Node(i, n["NodeID"], actor, k))
    return nodes, k


def _node_settings(settings: RunConfig, nodes: int) -> RunConfig:
    """What each node agent stands up: the run's settings with its share of `rollout.warm_sandboxes`. The run's pool
    is sized for the episodes of an iteration (or of the run), which the nodes share out: a sandbox made ahead on one
    node serves no episode on another, so each node making the whole pool made `nodes` times too many (each with its
    harness started ahead: mini-swe-agent's imports, seconds of CPU each)."""
    warm = settings.rollout.warm_sandboxes
    if warm <= 0 or nodes <= 1:
        return settings
    rollout = settings.rollout.model_copy(update={"warm_sandboxes": -(-warm // nodes)})
    return settings.model_copy(update={"rollout": rollout})


@contextlib.asynccontextmanager
async def ray_placement(
    settings: RunConfig,
    model: str,
    engine: str,
    concurrency: int,
    on_event: Event = lambda kind, data: None,
    say: Callable[[str], object] = lambda _: None,
    export: Export | None = None,
) -> AsyncIterator[RayPlacement]:
    """Start replicas and node agents on Ray; on exit stop them all (and Ray, if started here).
    `settings` says what to start (rollout, proxy, verifier, engine_options, placement). `export`: where each trace the
    driver writes also goes (the run's OTLP exporter's `export_written`)."""
    ray = _ray()
    pcfg = settings.placement
    started = init_ray(ray, pcfg, say)  # main thread: SIGTERM/SIGINT stop Ray's start or join there
    secret = SecretStr(secrets.token_urlsafe(32))  # the replicas' servers answer only to it; Ray carries it
    replicas: dict[str, Any] = {}
    agents: list[Any] = []
    groups: list[Any] = []
    try:
        from hrl.runners.engines import engine_kind
        from hrl.runners.engines.replicas import ReplicaSet, ReplicaSetConfig

        kind, options = engine_kind(engine, dict(settings.engine_options))
        _replica_engine_options(kind, options)  # refused here, before any actor starts
        replica_cls = ray.remote(EngineReplica)
        for i in range(pcfg.engine_replicas):
            opts = await _replica_resources(pcfg, groups)
            replicas[f"r{i}"] = replica_cls.options(**opts).remote(model, engine, dict(settings.engine_options), secret)
        say(f"starting {len(replicas)} {kind} engine replica(s) on Ray …")
        urls = dict(zip(replicas, await asyncio.gather(*(r.start.remote() for r in replicas.values())), strict=True))
        where = dict(zip(replicas, await asyncio.gather(*(r.where.remote() for r in replicas.values())), strict=True))
        where["driver"] = _driver_node(ray)
        nodes, k = _node_agents(ray, pcfg, concurrency, agents)
        say(f"starting {len(nodes)} node agent(s) with a proxy shard each, {k} episodes at once per node …")
        if (most := len(nodes) * k) != concurrency:  # the run's episodes at once and the nodes' slots disagree: said
            say(f"episodes at once: {min(most, concurrency)} ({len(nodes)} node(s) × {k} = {most} slots, the run's "
                f"concurrency {concurrency}; the smaller holds: raise -c train.concurrency or "
                "placement.episodes_per_node)")  # fmt: skip
        each = _node_settings(settings, len(nodes))
        await asyncio.gather(*(n.actor.start.remote(each, model, urls, secret) for n in nodes))
        control = ReplicaSet(ReplicaSetConfig(model=model, **_replica_set(urls, settings, secret)))
        await control.start()
        rollouts = RayRollouts(nodes, settings.rollout.run_id, on_event, export)
        try:
            publisher = ShardedPublisher(control, agents, rollouts, replicas=replicas, where=where, settings=pcfg)
            yield RayPlacement(rollouts, publisher, replicas, urls, agents, started)
        finally:
            await control.close()
    finally:
        await _stop(ray, agents, replicas, groups, started)


async def _stop(ray: Any, agents: list[Any], replicas: dict[str, Any], groups: list[Any], started: bool) -> None:
    """Stop the node agents (their shards end open sessions; sandboxes close), then the replicas, then Ray."""
    for refs in ([a.stop.remote() for a in agents], [r.stop.remote() for r in replicas.values()]):
        for ref in refs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ref, 120)
    for actor in [*agents, *replicas.values()]:
        with contextlib.suppress(Exception):
            ray.kill(actor)
    for pg in groups:
        with contextlib.suppress(Exception):
            ray.util.remove_placement_group(pg)
    if started:
        await asyncio.to_thread(ray.shutdown)
