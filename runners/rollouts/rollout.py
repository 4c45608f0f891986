"""Rollouts with real agent CLIs: each episode runs one agent in a fresh sandbox against its own proxy session,
is scored by the task's verifier, and ends as exactly one trace — finished, or with a failure_reason.

`AgentRollouts` implements the training loop's `Rollouts` protocol; `hrl rollout` uses it directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from hrl.config import DEFAULT_VERIFIER, RolloutConfig
from hrl.errors import UsageError
from hrl.runners.agents import get_agent
from hrl.runners.agents.install import AgentInstall, install, install_mcp
from hrl.runners.agents.warm import start_warm_harness
from hrl.runners.live import phase
from hrl.runners.proxy.proxy import UnknownSessionError
from hrl.runners.proxy.session import Session
from hrl.runners.rollouts.agent_session import agent_session
from hrl.runners.rollouts.episodes import Episode, Rollouts
from hrl.runners.rollouts.turns import TurnScorer
from hrl.runners.serving.stack import Stack
from hrl.runners.tasks import make_verifier
from hrl.runners.tasks.harbor import task_version
from hrl.runners.tasks.harbor_verifier import as_harbor
from hrl.runners.tasks.regrade import archived
from hrl.runners.tasks.task import Task, snapshot_version
from hrl.runners.tasks.verifier import Verdict
from hrl.runners.tasks.workspace import WorkspaceError
from hrl.runners.trace import Export, write_trace
from hrl.sandboxes import SandboxError, get_backend
from hrl.sandboxes.pool import SandboxPool

__all__ = ["AgentRollouts", "HarnessMix", "RolloutConfig", "make_rollouts"]

Event = Callable[[str, dict[str, Any]], None]


def make_rollouts(
    stack: Stack,
    config: RolloutConfig,
    on_event: Event = lambda kind, data: None,
    verifier: dict[str, Any] | None = None,
    base_dir: str | None = None,
    export: Export | None = None,
) -> Any:
    """The rollouts for `config.agent`: a white-box Python agent (`python:MODULE:FUNCTION`, `FILE.py:FUNCTION`;
    relative files under `base_dir`, the recipe's folder), else an agent CLI in a sandbox. With several
    `config.agents`, a `HarnessMix` of one such rollouts per harness. `export`: each trace they write also goes
    there (the run's OTLP export, `Rollouts.export`)."""
    from hrl.runners.whitebox.harness import PythonRollouts, is_python_agent

    if len(config.harnesses) > 1:
        return HarnessMix(stack, config, on_event, verifier, base_dir, export)
    config = config.model_copy(update={"agent": config.harnesses[0], "agents": []})
    if is_python_agent(config.agent):
        return PythonRollouts(stack, config, on_event, verifier, base_dir, export)
    return AgentRollouts(stack, config, on_event, verifier, export)


class AgentRollouts(Rollouts):
    def __init__(
        self,
        stack: Stack,
        config: RolloutConfig,
        on_event: Event = lambda kind, data: None,
        verifier: dict[str, Any] | None = None,
        export: Export | None = None,
    ) -> None:
        """`verifier`: the recipe's verifier section ({name: tests, …TestVerifierConfig fields})."""
        self.stack, self.config, self.on_event, self.export = stack, config, on_event, export
        self.runner = get_agent(config.agent)
        self.run_id = config.model_copy().labelled()
        self.backend = get_backend(config.sandbox)
        options = dict(verifier or {})
        name = options.pop("name", DEFAULT_VERIFIER)
        if name == "miniwob":  # the CLI runs in the sandbox: the episode's browser endpoint is forwarded into it
            closed = self.backend.name == "docker" or self.backend.isolate
            if not closed:
                raise UsageError(
                    f"{config.agent} on browser tasks needs a sandbox with its own network: docker, or local where "
                    "bubblewrap runs (the browser's endpoint is forwarded into it)",
                    hint="use --sandbox docker",
                )
            if config.warm_sandboxes or config.reuse != "none":
                raise UsageError("browser tasks start a browser per episode in its own sandbox: rollout.warm_sandboxes "
                                 "and rollout.reuse do not apply", hint="set rollout.warm_sandboxes: 0 and "
                                 "rollout.reuse: none")  # fmt: skip
            options["agent_in_sandbox"] = True
        self.verifier = make_verifier(name, get_backend(config.sandbox), **{"run_id": self.run_id, **options})
        self.verifier_section = {"name": name, **options}  # archived with each episode, for `hrl regrade`
        if config.reuse == "group" and self.verifier.grades_container:
            raise UsageError(
                "rollout.reuse: group cannot go with a Harbor verifier that grades the agent's whole container "
                "(carry: container): what one episode left outside the workdir would be graded with the next",
                hint="set verifier.carry: workdir (only the workdir is graded), or rollout.reuse: none",
            )
        if config.turn_scores and not self.verifier.scores_turns:
            raise UsageError(
                f"rollout.turn_scores (train.credit: turn) needs a verifier that scores turns; {name} does not",
                hint="use -c train.credit=episode, or the tests verifier (verifier.name: tests)",
            )
        warm_harness = config.warm_harness and config.warm_sandboxes > 0 and config.reuse == "none"
        self.pool = SandboxPool(self.backend, self.run_id, warm=config.warm_sandboxes, reuse=config.reuse,
                                on_event=on_event, on_made=self._start_harness if warm_harness else None)  # fmt: skip
        self._install: AgentInstall | None = None
        # browser tasks: the install with the browser MCP server mounted, and the servers' argv in the sandbox
        self._browser: tuple[AgentInstall, dict[str, list[str]]] | None = None
        self._browser_lock = threading.Lock()
        self._versions: dict[str, str] = {}  # env.version of a task that is not an image's, by instance id

    async def _start_harness(self, sandbox: Any) -> None:
        """A sandbox made ahead starts the harness ahead too, where the runner can (runners/agents/warm.py)."""
        await start_warm_harness(sandbox, self.runner, self.prepare())

    def prepare(self) -> AgentInstall:
        """Install the agent CLI (cached) for the chosen sandbox, and the browser MCP server where every task is a
        browser's (MiniWoB++); call before the first episode (blocking: `hrl rollout` calls it off the event loop)."""
        if self._install is None:
            self._install = install(self.config.agent, "docker" if self.config.sandbox == "docker" else "local")
            if self.verifier.name == "miniwob":
                self._install_for(None)
        return self._install

    def _install_for(self, task: Task | None) -> tuple[AgentInstall, dict[str, list[str]]]:
        """The CLI's install and the MCP servers it is given for `task` (None: a browser task): a browser task's
        (MiniWoB++, a Harbor task that serves a web app) is the install with the browser MCP server, installed on
        first need. Blocking: episodes call it off the event loop."""
        inst = self.prepare()
        if (task is not None and not self.verifier.needs_browser(task)) or self.runner.drives_browser:
            return inst, {}
        with self._browser_lock:
            if self._browser is None:
                self._browser = self._with_browser_mcp(inst, "docker" if self.config.sandbox == "docker" else "local")
        return self._browser

    def _with_browser_mcp(
        self, inst: AgentInstall, target: Literal["docker", "local"]
    ) -> tuple[AgentInstall, dict[str, list[str]]]:
        """The browser MCP server installed beside the CLI (its mounts added), started by the CLI with the episode's
        browser endpoint as the sandbox sees it; screenshots as images only where the model takes them."""
        mcp = install_mcp(self.config.browser_mcp, target)
        port = self.verifier.config.cdp_port
        images = "allow" if self.stack.proxy.takes_images else "omit"
        argv = {mcp.name: [*mcp.argv, "--cdp-endpoint", f"http://127.0.0.1:{port}", "--image-responses", images]}
        have = {m.target for m in inst.mounts}
        return dataclasses.replace(inst, mounts=(*inst.mounts, *(m for m in mcp.mounts if m.target not in have))), argv

    def expect(self, episodes: int) -> None:
        self.pool.expect(episodes)

    async def close(self) -> None:
        """End the run's sandbox pool (every sandbox it still holds, ready or parked for a group, is closed), then
        what the verifier holds for the run (browsers an episode left, their socket folders)."""
        try:
            await self.pool.close()
        finally:
            await self.verifier.close()

    def _meta(self, ep: Episode, task: Task) -> dict[str, Any]:
        return {
            "task_id": task.instance_id,
            "group_id": ep.group_id,
            "agent": {"name": self.runner.name, "version": self.runner.version},
            "env": {"sandbox": self.config.sandbox, "image": self.verifier.sandbox_spec(task).image, "version": None},
            "model": {"name": self.stack.proxy.config.model_name},
            "metadata": {"episode": ep.key, "run": self.run_id},
        }

    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        task = ep.task if isinstance(ep.task, Task) else Task.model_validate(ep.task)
        inst, mcp = await asyncio.to_thread(self._install_for, task)  # a first browser task installs its MCP server
        session = self.stack.proxy.open_session(meta=self._meta(ep, task), version=ep.version)
        self.on_event("episode_start", {"episode": ep.key, "task": task.instance_id})
        outcome: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        try:
            outcome, extra = await self._run(ep, task, inst, session, mcp)
        except asyncio.CancelledError:
            self._end(session.token, trace_file, {"failure_reason": "cancelled"}, {})
            raise
        except (SandboxError, WorkspaceError, OSError) as e:
            outcome, extra = {"failure_reason": "sandbox_error"}, {"error": str(e)[:2000]}
        if "patch" in extra:  # the agent's diff, graded: archived with its task for `hrl regrade`
            extra = await archived(trace_file, task, self.verifier_section, extra)
        trace = self._end(session.token, trace_file, outcome, extra)
        self.on_event("episode_end", {"episode": ep.key, "reward": trace["reward"], "failure": trace["failure_reason"]})
        return trace

    async def _run(
        self, ep: Episode, task: Task, inst: AgentInstall, proxy_session: Session, mcp: dict[str, list[str]]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        cfg, token = self.config, proxy_session.token
        phase("sandbox")
        await self.verifier.provision(task)  # a Harbor task's image is built here (once per content hash)
        limits = {k: v for k, v in (("cpus", cfg.cpus), ("memory_mb", cfg.memory_mb)) if v}  # else the task's own
        # a verifier that makes something per episode for its sandbox (a browser's socket folder) does it here, once
        spec = self.verifier.episode_spec(task).model_copy(update=limits)
        budget = dict(task).get("agent_timeout_s") or cfg.time_budget_s  # a Harbor task's [agent] timeout_sec
        label = ep.key.replace("#", "-").replace(":", "-")
        t0 = time.monotonic()

        async def prepare(sandbox: Any) -> None:
            await self.verifier.prepare(sandbox, task)

        async with agent_session(self.stack, self.runner, inst, self.backend, spec, token, task.problem_statement,
                                 run_id=self.run_id, episode_id=label, proxy_port=cfg.proxy_port,
                                 options=cfg.agent_options, pool=self.pool, prepare=prepare,
                                 group=ep.group_id, mcp=mcp) as session:  # fmt: skip
            try:
                env = proxy_session.meta["env"]
                proxy_session.meta["env"] = {**env, "version": await self._env_version(task, spec.image)}
                infra = session.lease.metrics() if session.lease is not None else {}
                phase("agent")
                scorer = self._turn_scorer(session.sandbox, task, proxy_session)
                try:
                    result = await session.run(budget)
                    if scorer is not None:
                        await scorer.settle()
                finally:
                    proxy_session.on_call = None
                    if scorer is not None:
                        scorer.cancel()
                phase("grading")
                verdict = await self.verifier.verify(session.sandbox, task) if cfg.verify else Verdict(None)
            finally:  # what the verifier started for the episode (a browser) stops with it, verified or not
                await self.verifier.release(session.sandbox)
        outcome = verdict.trace_fields()
        last = self.stack.proxy.sessions[token].last_turn() if token in self.stack.proxy.sessions else None
        if last is not None and last.error is not None:
            outcome.pop("failure_reason", None)  # the engine failed the agent: the trace says engine_error/overflow
        elif result.failure_reason is not None:  # else the agent's own failure explains the episode first
            outcome["failure_reason"] = result.failure_reason
        extra = {
            "agent_exit_code": result.exit_code,
            "agent_s": result.duration_s,
            **_harness_start(self.stack.proxy.sessions.get(token), result.started_at),
            **({"harness_warm": True} if result.warm else {}),
            "episode_s": round(time.monotonic() - t0, 3),
            **infra,  # sandbox_acquire_s, sandbox_reset_s: infrastructure time apart from the agent's
            "agent_stdout_tail": result.stdout_tail[-2000:],
            "agent_stderr_tail": result.stderr_tail[-2000:],
            "patch": verdict.patch,  # cut to PATCH_INLINE in the trace, archived whole beside it (`archived`)
            **({"turn_scores": scorer.summary(verdict)} if scorer is not None else {}),
        }
        return outcome, extra

    def _turn_scorer(self, sandbox: Any, task: Task, proxy_session: Session) -> TurnScorer | None:
        """With `rollout.turn_scores` (train.credit: turn): the session's calls scored as they arrive."""
        if not self.config.turn_scores:
            return None
        scorer = TurnScorer(self.verifier, sandbox, task, self.config.turn_score_timeout_s)
        proxy_session.on_call = scorer.arrived
        return scorer

    async def _env_version(self, task: Task, image: str) -> str | None:
        """`env.version`, read once the episode's sandbox stands: a Harbor task's folder hash; else the image's digest
        (Docker: the ID its tag named then); else (a local sandbox) the task's repository snapshot hash."""
        if self.verifier.name != "harbor" and (digest := await self.backend.image_digest(image)) is not None:
            return digest
        if task.instance_id not in self._versions:  # a task's files do not change during a run: hashed once
            self._versions[task.instance_id] = await asyncio.to_thread(self._task_version, task)
        return self._versions[task.instance_id]

    def _task_version(self, task: Task) -> str:
        return task_version(as_harbor(task)) if self.verifier.name == "harbor" else snapshot_version(task)

    def _ended_early(self, token: str, extra: dict[str, Any]) -> dict[str, Any]:
        """The episode's trace when its session was ended by someone else: its calls, no reward, internal_error."""
        ended = self.stack.proxy.ended(token)
        if ended is None:
            raise RuntimeError(f"the proxy session of an episode vanished without a trace ({token[:6]}…)")
        meta = {**ended.get("metadata", {}), **extra, "error": "the proxy session ended before the episode did"}
        return {**ended, "status": "failed", "failure_reason": "internal_error", "reward": None, "success": None,
                "metadata": meta}  # fmt: skip

    def _end(self, token: str, trace_file: Path, outcome: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        try:
            trace = self.stack.proxy.end_session(token, **outcome, extra=extra)
        except UnknownSessionError:  # ended under the episode (the idle reaper): the harness failed, not the policy
            trace = self._ended_early(token, extra)
        write_trace(trace_file, trace, self.export)
        return trace


def _harness_start(session: Session | None, launched_at: float) -> dict[str, float]:
    """`harness_start_s`: from launching the agent CLI to the first model call its session recorded (the harness's
    start-up: its runtime, imports and config, before it asks the model anything); nothing without a call."""
    if session is None or not session.calls:
        return {}
    return {"harness_start_s": round(max(0.0, min(c.started_at for c in session.calls) - launched_at), 3)}


class HarnessMix(Rollouts):
    """Several harnesses behind one `Rollouts`: an episode runs under the harness it names (`Episode.agent`), with
    the same stack, sandbox backend, verifier settings and run id for all of them."""

    def __init__(
        self,
        stack: Stack,
        config: RolloutConfig,
        on_event: Event = lambda kind, data: None,
        verifier: dict[str, Any] | None = None,
        base_dir: str | None = None,
        export: Export | None = None,
    ) -> None:
        shared = config.model_copy()
        shared.labelled()
        self.harnesses, self.export = config.harnesses, export
        one = {name: shared.model_copy(update={"agent": name, "agents": []}) for name in self.harnesses}
        self.by_harness = {
            name: make_rollouts(stack, c, on_event, verifier, base_dir, export) for name, c in one.items()
        }

    def prepare(self) -> None:
        """Install (or load) every harness before the first episode."""
        for rollouts in self.by_harness.values():
            rollouts.prepare()

    def expect(self, episodes: int) -> None:
        for rollouts in self.by_harness.values():  # each runs at most all of them
            rollouts.expect(episodes)

    async def close(self) -> None:
        """Close each harness's rollouts (what they hold: a sandbox pool, the verifier's browsers)."""
        for rollouts in self.by_harness.values():
            await rollouts.close()

    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        if ep.agent not in self.by_harness:
            raise ValueError(f"episode {ep.key} names harness {ep.agent!r}, not one of {self.harnesses}")
        return await self.by_harness[ep.agent].episode(ep, trace_file)
