"""Online training: the async loop fed by sessions that clients run anywhere (`hrl train --serve`, docs/online.md).

`ExternalProducer` stands where the async loop's `_Producer` launches episodes: it starts nothing, and takes the
final traces `hrl.runners.online.OnlineSessions` hands over (rewarded, or scored), group by group, into the step's
trace file and the trainer's next batch. Everything else (staleness, versions, publishing while clients keep
calling, checkpoints, `--resume`, held-out evaluation) is the async loop's. A trace without a group of its own in
the batch is baselined by `online.baseline` (`lone_advantages`): the batch's lone traces, or a running mean reward
per task.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from hrl.runners.online import OnlineSessions
from hrl.runners.rundir import RunDir
from hrl.runners.trace import write_trace
from hrl.train.advantages import lone_advantages
from hrl.train.async_loop import Producer
from hrl.train.loop import LoopConfig
from hrl.train.sampler import TaskStats

if TYPE_CHECKING:
    from hrl.config import RunConfig

__all__ = ["ExternalProducer", "TaskBaseline", "train_online"]


class TaskBaseline:
    """A running mean reward per task id (the plain mean of its first 1 / (1 − decay) traces, then an exponential
    one, so it follows a policy that learns), from the traces of earlier steps
    only, so a trace is never its own baseline. A task seen fewer than `min_seen` times has none (its trace takes the
    batch's): one or two earlier rewards of a 0/1 task are a worse baseline than the batch (bench/online_baseline.py)."""

    def __init__(self, decay: float = 0.9, min_seen: int = 4) -> None:
        self.decay, self.min_seen = decay, min_seen
        self.mean: dict[str, float] = {}
        self.seen: dict[str, int] = {}

    def of(self, traces: list[dict[str, Any]]) -> dict[str, float]:
        """{trace id: its task's running mean} for the traces whose task was seen `min_seen` times before."""
        return {
            t["trace_id"]: self.mean[k] for t in traces if self.seen.get(k := str(t.get("task_id")), 0) >= self.min_seen
        }

    def observe(self, traces: list[dict[str, Any]]) -> None:
        for t in traces:
            if t.get("reward") is not None and t.get("task_id") is not None:
                key, r = str(t["task_id"]), float(t["reward"])
                n = self.seen[key] = self.seen.get(key, 0) + 1
                step = max(1.0 / n, 1.0 - self.decay)  # the plain mean at first, then an exponential one
                self.mean[key] = self.mean.get(key, 0.0) + step * (r - self.mean.get(key, 0.0))


class ExternalProducer(Producer):
    """The async loop's producer for traffic from outside: `take(n)` waits for ≥ n final traces in whole groups."""

    def __init__(self, sessions: OnlineSessions, cfg: LoopConfig, run: RunDir) -> None:
        self.sessions, self.cfg, self.run = sessions, cfg, run
        self.running: set[Any] = set()  # nothing runs here: the clients run their own agents
        self.dropped: set[str] = set()
        self.dropped_traces = 0
        self.started = 0  # final traces received (the loop's `async/started`)
        self.stats = TaskStats(cfg.success_reward)
        self.ready: list[list[dict[str, Any]]] = []
        self.changed = asyncio.Event()
        self.step = run.state()["iteration"]  # the step whose batch is being gathered: final traces are filed there
        self.baseline = TaskBaseline() if sessions.cfg.baseline == "task" else None
        if self.baseline is not None:  # a resumed run goes on from the means of the traces it has
            self.baseline.observe(run.all_traces())
        self._batch_baselines: dict[str, float] = {}
        sessions.deliver = self.receive
        self._held = bool(self.run.state()["checkpoint"])
        if self._held:  # a resumed run: no client is served the base weights before its policy is published
            sessions.proxy.pause()

    def policy_ready(self) -> None:
        """The trainer published the run's policy (`train_async` calls this once): clients are served from now on."""
        if self._held:
            self.sessions.proxy.resume()
            self._held = False

    def receive(self, traces: list[dict[str, Any]]) -> None:
        """A final group (or one late trace) from the clients: into the step's trace file, then the buffer."""
        for t in traces:
            write_trace(self.run.trace_file(self.step), t)
        self.started += len(traces)
        self.stats.observe(traces)
        self.ready.append(traces)
        self.changed.set()

    def buffered(self) -> int:
        return sum(len(g) for g in self.ready)

    async def loop(self) -> None:
        """Serve the clients' sessions: their sweeper (overdue rewards, forgotten sessions) runs for the run."""
        self.sessions.start()
        await asyncio.Event().wait()

    async def take(self, n: int) -> list[dict[str, Any]]:
        while self.buffered() < n:
            self.changed.clear()
            await self.changed.wait()
        out: list[dict[str, Any]] = []
        while self.ready and len(out) < n:
            out += self.ready.pop(0)
        self.step += 1
        if self.baseline is not None:
            self._batch_baselines = self.baseline.of(out)
            self.baseline.observe(out)  # after its own baselines were read: no trace is its own baseline
        return out

    @property
    def advantages(self) -> Any:
        return partial(lone_advantages, kind=self.cfg.advantage, baselines=self._batch_baselines or None)

    def metrics(self, trained: list[dict[str, Any]]) -> dict[str, float]:
        """The clients' counts (online/…) and the step's traces by how they came."""
        how = Counter(
            "off_policy" if (t["metadata"].get("online") or {}).get("off_policy") else "on_time" for t in trained
        )
        return self.sessions.metrics() | {f"online/trained_{k}": float(how[k]) for k in ("on_time", "off_policy")}

    async def stop(self) -> None:
        await self.sessions.close()


def _scorer(cfg: RunConfig, spec: str) -> Any:
    """`online.scorer` loaded now, so a wrong name stops the run before anything starts."""
    if not spec:
        return None
    from hrl.runners.whitebox.harness import load_function

    return load_function(spec, cfg.recipe_dir or None)


async def train_online(
    settings: RunConfig,
    run: RunDir,
    address: tuple[str, int],
    include_unchecked: bool,
    on_event: Callable[[str, dict[str, Any]], None],
    say: Callable[[str], object],
) -> list[dict[str, Any]]:
    """`hrl train --serve`: the proxy listens on `address`; clients with the run's keys (`hrl keys add`) open
    sessions, run their agents against them anywhere, and end and reward them; the async loop trains on the final
    traces (`ExternalProducer`). Where it serves and what a step waits for are said to `say`; the step history."""
    import secrets

    from hrl.runners.errors import UsageError
    from hrl.runners.live import live_status
    from hrl.runners.placement import write_control_token
    from hrl.runners.placement.local import local_placement
    from hrl.runners.tasks.task_checks import heldout_for_run
    from hrl.train.async_loop import train_async

    online_cfg, async_cfg, loop_cfg = settings.online, settings.async_, settings.loop()
    if not async_cfg.enabled or settings.placement.kind != "local":
        raise UsageError("an online run (--serve) trains with the async loop, in this process",
                         hint="drop -c async.enabled=false and --placement ray")  # fmt: skip
    scorer = _scorer(settings, online_cfg.scorer)
    held = heldout_for_run(settings.eval_tasks, run.path, include_unchecked, say)
    heldout = [t.model_dump() for t in held] if held else None
    control = secrets.token_urlsafe(32)
    write_control_token(run.path / "control-token", control)

    def clients(proxy: Any) -> OnlineSessions:
        return OnlineSessions(proxy, online_cfg, run.path, async_cfg.max_staleness, scorer)

    host, port = address
    online = {"host": host, "port": port, "control_token": control, "clients": clients}
    async with local_placement(settings, settings.model, settings.engine, say=say, online=online) as here:
        if heldout:
            await here.prepare()  # the recipe's agent, for the held-out evaluations only
        stack = here.stack
        keys = stack.clients.keys
        say(f"serving clients at {stack.url} (POST /sessions with a client key; {len(keys.names())} keys in "
            f"{keys.path}; add one: hrl keys add NAME --run-dir {run.path})")  # fmt: skip
        say(f"each step waits for {async_cfg.batch_traces} final traces (async.batch_traces): sessions ended "
            "with a reward, or scored by online.scorer")  # fmt: skip
        producer = ExternalProducer(stack.clients, loop_cfg, run)
        with live_status(run.path, lambda: stack.proxy.engine.version):
            return await train_async([], loop_cfg, async_cfg, run, stack.proxy, here.rollouts, on_event,
                                     heldout, producer=producer)  # fmt: skip
