"""A Python agent as a harness: `--agent python:MODULE:FUNCTION` (or `path/to/file.py:FUNCTION`).

The function is `async def run(task, session) -> float | None` (in subprocess mode a plain `def` works too). Each
episode registers one proxy session, hands the agent a `WhiteboxSession` bound to it (`session.openai()`,
`session.base_url`, `session.child(...)`, `session.reward(...)`), and ends as exactly one trace, like a CLI
episode. Where the recipe has a verifier, it scores the episode (an agent's own reward is kept in the metadata as
`agent_reward`, never trained on); where it has none, the agent's float (or `session.reward`) is the reward, which
the harness records. The agent holds its session's agent key (sub-agents of its own tree), never the control
token, and a subprocess agent gets an allowlist of the host's environment:

- `verifier: {name: python, function: verify.py:score}`: `score(task, answer) -> float | (float, info) |
  (float, info, success)` (sync or async), `answer` being the last reply of a trainable agent of the episode;
  `success` (the trace's: the task's own pass/fail beside a maybe shaped reward) is the third item, else
  `info["success"]`, else `reward == 1` for a reward of 0 or 1 and null for any other;
- any other verifier (`tests`): the episode gets a sandbox laid out with the task (`session.sandbox`, to run the
  agent's tools in), which the verifier then grades.

`rollout.mode`: `subprocess` (`python -m hrl.runners.whitebox.worker` with OPENAI_BASE_URL / OPENAI_API_KEY /
OPENAI_MODEL set; plain or async functions), `inprocess` (on hrl's event loop), or `auto` (default; `resolve_mode`).
Where bubblewrap runs, the subprocess runs as a local sandbox's command does: the host's files read-only, a private
temp folder, its own network namespace where the proxy's data plane (relayed from its unix socket) is the one thing
it reaches. An in-process agent shares hrl's process (its memory, vLLM's socket): trusted code only, whose tools
run model-written code in `session.sandbox`, never in the agent's own process.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hrl.config import DEFAULT_VERIFIER
from hrl.runners.errors import UsageError
from hrl.runners.live import phase
from hrl.runners.proxy.proxy import UnknownSessionError
from hrl.runners.rollouts.episodes import Episode, Rollouts
from hrl.runners.serving.stack import Stack
from hrl.runners.tasks.regrade import archived
from hrl.runners.tasks.task import Task
from hrl.runners.tasks.verifier import Verifier
from hrl.runners.trace import Export, binary_success, write_trace
from hrl.runners.whitebox.client import WhiteboxSession
from hrl.runners.whitebox.interpreter import AgentPython, agent_python, check_python, closed_mounts

__all__ = [
    "AgentLoadError",
    "PythonRollouts",
    "is_python_agent",
    "load_function",
    "needs_sandbox",
    "resolve_mode",
    "sandbox_of",
    "split_spec",
]

RESULT_MARK = "HRL_RESULT "  # the subprocess worker's last stdout line: HRL_RESULT {"reward": …}
RELAY_PORT = 8000  # where a namespaced subprocess agent finds the proxy (its own loopback)
Event = Callable[[str, dict[str, Any]], None]


class AgentLoadError(UsageError):
    """A `python:` agent or verifier function cannot be loaded; the message names it."""


def is_python_agent(agent: str) -> bool:
    return agent.startswith("python:") or agent.partition(":")[0].endswith(".py")


def resolve_mode(mode: str, agent: str, verifier: dict[str, Any] | None, python: str = "") -> tuple[str, str]:
    """(`inprocess` | `subprocess`, why) for `rollout.mode`. An agent in a Python of its own (`python`,
    `rollout.python`) runs in a subprocess. `auto`: a subprocess in its own namespace where bubblewrap runs (closed
    like a local sandbox), unless the episode hands the agent a sandbox to run its tools in (`session.sandbox` lives
    in hrl's process); else in process."""
    if python.strip():
        if mode == "inprocess":
            raise UsageError(f"rollout.python {python!r} runs the agent in an interpreter of its own, which "
                             "rollout.mode: inprocess cannot", hint="set rollout.mode: subprocess (or auto)")  # fmt: skip
        return "subprocess", f"in its own Python (rollout.python: {python})"
    if mode != "auto":
        return mode, f"rollout.mode: {mode}"
    if needs_sandbox(agent, verifier):
        return "inprocess", "its tools run in session.sandbox, which lives in hrl's process"
    from hrl.sandboxes.local import LocalBackend

    if not LocalBackend().isolate:
        return "inprocess", "bubblewrap does not run here, so a subprocess would not be closed either"
    return "subprocess", "closed in its own namespace (bubblewrap)"


def needs_sandbox(agent: str, verifier: dict[str, Any] | None) -> bool:
    """Whether an episode of `agent` runs in a sandbox: a CLI always does; a white-box agent only when its verifier
    grades one (a Python-function verifier scores the answer alone)."""
    return not (is_python_agent(agent) and (verifier or {}).get("name", DEFAULT_VERIFIER) == "python")


def sandbox_of(rollout: Any, verifier: dict[str, Any] | None) -> str:
    """Where a run's episodes run, in words: a white-box agent gets a sandbox only with a verifier that grades one,
    and runs in process or in a subprocess (and why)."""
    agent = rollout.agent
    if not is_python_agent(agent):
        return str(rollout.sandbox)
    mode, why = resolve_mode(rollout.mode, agent, verifier, rollout.python)
    where = str(rollout.sandbox) if needs_sandbox(agent, verifier) else "none"
    if where != "none" and mode == "inprocess":
        return where
    return f"{where} (agent {'in process' if mode == 'inprocess' else 'in a subprocess'}: {why})"


def split_spec(spec: str, base_dir: str | Path | None = None) -> tuple[str | Path, str]:
    """(module name or file path, function name) of `MODULE:FUNCTION`, `python:MODULE:FUNCTION` or `FILE.py:FUNCTION`
    (a relative file under `base_dir` when it is there, else the cwd). Raises AgentLoadError."""
    where, _, name = spec.removeprefix("python:").rpartition(":")
    if not where or not name or not name.isidentifier():
        raise AgentLoadError(f"{spec!r} is not MODULE:FUNCTION or FILE.py:FUNCTION",
                             hint="e.g. --agent python:my_pkg.agent:run or --agent agents/react.py:run")  # fmt: skip
    if not where.endswith(".py"):
        return where, name
    path = Path(where).expanduser()
    if not path.is_absolute() and base_dir is not None and (Path(base_dir) / path).is_file():
        path = Path(base_dir) / path
    if not path.is_file():
        raise AgentLoadError(f"no agent file {path} (from {spec!r})", hint="check the path (relative: to the cwd, or "
                             "to the recipe's folder)")  # fmt: skip
    return path, name


def load_function(spec: str, base_dir: str | Path | None = None) -> Callable[..., Any]:
    """The function a spec names (see `split_spec`), imported. Raises AgentLoadError."""
    where, name = split_spec(spec, base_dir)
    try:
        if isinstance(where, Path):
            path = where
            loader = importlib.util.spec_from_file_location(f"hrl_agent_{abs(hash(str(path.resolve())))}", path)
            if loader is None or loader.loader is None:
                raise FileNotFoundError(f"cannot load {path}")
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as e:
        raise AgentLoadError(f"cannot load {spec!r}: {type(e).__name__}: {e}",
                             hint="check the module path and that its imports are installed") from e  # fmt: skip
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AgentLoadError(f"{where} has no function {name!r}", hint=f"define `async def {name}(task, session)`")
    return fn  # type: ignore[no-any-return]


def _private_roots() -> list[Path]:
    """What a closed subprocess's namespace hides of the host (`LocalBackend.private_roots`)."""
    from hrl.sandboxes.local import LocalBackend

    return LocalBackend().private_roots()


def _namespaced() -> bool:
    """Whether a subprocess agent runs in a namespace of its own here (bubblewrap), not on the host's network."""
    from hrl.sandboxes.local import LocalBackend

    return bool(LocalBackend().isolate)


async def _browser_of(sandbox: Any) -> dict[str, str]:
    """The episode's browser as the verifier told the agent (`browser.json` in the sandbox's workdir): its DevTools
    endpoint (hrl's relay: on the host's loopback, or forwarded into the agent's namespace) and the task's page."""
    from hrl.runners.browser import BROWSER_FILE

    raw = await sandbox.read_file(f"{sandbox.workdir.rstrip('/')}/{BROWSER_FILE}")
    return {k: str(v) for k, v in json.loads(raw).items()}


def _absolute(path: str) -> str:
    return str(Path(path).absolute())


def agent_env() -> dict[str, str]:
    """The host variables a subprocess agent sees: a local sandbox's allowlist (`sandboxes.local.HOST_ENV` and
    $HRL_SANDBOX_ENV_PASSTHROUGH), nothing that authenticates; the harness adds the session's own variables."""
    from hrl.sandboxes.local import LocalBackend, host_env

    return host_env(LocalBackend(isolate=False).env_allow)


async def call_maybe_async(fn: Callable[..., Any], *args: Any) -> Any:
    out = fn(*args)
    return await out if inspect.isawaitable(out) else out


class PythonRollouts(Rollouts):
    """`Rollouts` for a white-box Python agent: one episode = one proxy session (+ its children) → one trace."""

    def __init__(
        self,
        stack: Stack,
        config: Any,
        on_event: Event = lambda kind, data: None,
        verifier: dict[str, Any] | None = None,
        base_dir: str | None = None,
        export: Export | None = None,
    ) -> None:
        self.stack, self.config, self.on_event, self.base_dir = stack, config, on_event, base_dir
        self.export = export
        self.spec = config.agent
        self.fn: Callable[..., Any] | None = None
        options = dict(verifier or {"name": "python"})
        self.verifier_name = options.pop("name", DEFAULT_VERIFIER)
        self.verifier_options = options
        self.score: Callable[..., Any] | None = None
        self.verifier: Verifier | None = None
        self.mode, self.mode_reason = resolve_mode(config.mode, self.spec, verifier or {"name": "python"},
                                                   config.python)  # fmt: skip
        self.python: AgentPython | None = None  # the subprocess's interpreter, found by `prepare`
        self.mounts: list[str] = []  # what the subprocess's namespace binds in read-only (`closed_mounts`)

    def prepare(self) -> None:
        """Load the agent (in-process mode) and the verifier; raises AgentLoadError naming what is wrong."""
        if self.mode == "subprocess":
            split_spec(self.spec, self.base_dir)  # a wrong spec fails here, not in every episode's process
            if self.python is None:
                python = agent_python(self.config.python)
                check_python(python, self.spec, self.base_dir)
                target, _ = split_spec(self.spec, self.base_dir)
                self.mounts = closed_mounts(python, target, self.base_dir, _private_roots())
                self.python = python
        elif self.fn is None:
            self.fn = load_function(self.spec, self.base_dir)
        if self.verifier_name == "python" and self.score is None and self.verifier_options.get("function"):
            self.score = load_function(self.verifier_options["function"], self.base_dir)
        elif self.verifier_name != "python" and self.verifier is None:
            from hrl.runners.tasks import make_verifier
            from hrl.sandboxes import get_backend

            backend = get_backend(self.config.sandbox)
            options = dict(self.verifier_options)
            if self.verifier_name == "miniwob" and self.mode == "subprocess" and _namespaced():
                options["agent_in_sandbox"] = True  # the browser's endpoint forwarded into the agent's namespace
            self.verifier = make_verifier(self.verifier_name, backend, run_id=self.config.run_id or "hrl-python",
                                          **options)  # fmt: skip

    async def close(self) -> None:
        """What the verifier holds for the run: browsers an episode left, their socket folders."""
        if self.verifier is not None:
            await self.verifier.close()

    def _meta(self, ep: Episode, task: Task) -> dict[str, Any]:
        return {
            "task_id": task.instance_id,
            "group_id": ep.group_id,
            "agent": {"name": f"python:{self.spec.removeprefix('python:')}", "version": self.mode},
            "env": {"sandbox": "none" if self.verifier is None else self.config.sandbox},
            "model": {"name": self.stack.proxy.config.model_name},
            "metadata": {"episode": ep.key, "run": self.config.run_id},
        }

    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        self.prepare()
        task = ep.task if isinstance(ep.task, Task) else Task.model_validate(ep.task)
        proxy = self.stack.proxy
        opened = proxy.open_session(meta=self._meta(ep, task), version=ep.version)
        token = opened.token  # the agent gets this session's agent key; hrl ends the episode in process
        ws = WhiteboxSession(self.stack.url, token, proxy.config.model_name, opened.issue_agent_key(), task=task)
        ws.options = dict(self.config.agent_options)
        self.on_event("episode_start", {"episode": ep.key, "task": task.instance_id})
        t0 = time.monotonic()
        try:
            outcome, extra = await self._run(task, ws, ep.key.replace("#", "-").replace(":", "-"))
        except asyncio.CancelledError:
            self._end(token, trace_file, {"failure_reason": "cancelled"}, {})
            raise
        extra["episode_s"] = round(time.monotonic() - t0, 3)
        if "patch" in extra:  # graded by the tests: the diff and the task archived for `hrl regrade`
            section = {"name": self.verifier_name, **self.verifier_options}
            extra = await archived(trace_file, task, section, extra)
        trace = self._end(token, trace_file, outcome, extra)
        self.on_event("episode_end", {"episode": ep.key, "reward": trace["reward"], "failure": trace["failure_reason"]})
        return trace

    async def _run(self, task: Task, ws: WhiteboxSession, label: str) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.verifier is None:
            phase("agent")
            return await self._attempt(task, ws)
        from hrl.sandboxes import SandboxError, get_backend

        spec = self.verifier.episode_spec(task)
        phase("sandbox")
        try:
            backend = get_backend(self.config.sandbox)
            async with await backend.create(spec, self.config.run_id or "hrl-python", label) as sandbox:
                try:
                    await self.verifier.prepare(sandbox, task)
                    ws.sandbox = sandbox
                    if self.verifier.needs_browser(task):
                        ws.browser = await _browser_of(sandbox)
                    phase("agent")
                    outcome, extra = await self._attempt(task, ws)
                    if outcome.get("failure_reason") is None:  # the hidden tests decide, whatever the agent said
                        phase("grading")
                        verdict = await self.verifier.verify(sandbox, task)
                        outcome, extra = verdict.trace_fields(), {**extra, "patch": verdict.patch}
                finally:  # what the verifier started for the episode (a browser) stops with it, verified or not
                    await self.verifier.release(sandbox)
        except (SandboxError, OSError) as e:
            return {"failure_reason": "sandbox_error"}, {"error": str(e)[:2000]}
        return outcome, extra

    async def _attempt(self, task: Task, ws: WhiteboxSession) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run the agent within the time budget. The reward: the recipe's verifier's where it has one (a python
        `function`, or the tests, which `_run` runs after this); the agent's own (returned, or given to
        `session.reward`) only where the recipe has none, recorded here by the harness. An agent's reward beside a
        verifier is kept as `agent_reward` in the trace's metadata, never as the reward."""
        budget = self.config.time_budget_s or None
        try:
            async with asyncio.timeout(budget):
                returned = await (
                    self._subprocess(task, ws) if self.mode == "subprocess" else self._inprocess(task, ws)
                )
        except TimeoutError:
            return {"failure_reason": "agent_timeout"}, {}
        except Exception as e:
            detail = "".join(traceback.format_exception(e))[-4000:]
            return {"failure_reason": "agent_crash"}, {"error": f"{type(e).__name__}: {e}", "traceback": detail}
        reward = ws.reward_value if returned is None else float(returned)
        info = ws.reward_info if returned is None else {}
        if self.score is not None or self.verifier is not None:
            extra = {} if reward is None else {"agent_reward": reward}
            if reward is not None and info:  # what the agent said with it (kept, like its reward, never trained on)
                extra["agent_reward_info"] = info
            if self.score is None:
                return {}, extra
            phase("grading")
            outcome, more = await self._verify(task, ws)
            return outcome, {**extra, **more}
        return {"reward": reward, "reward_info": info}, {}

    async def _inprocess(self, task: Task, ws: WhiteboxSession) -> Any:
        assert self.fn is not None
        try:
            with ws._current():
                return await call_maybe_async(self.fn, task, ws)
        finally:
            await ws._close_clients()

    async def _subprocess(self, task: Task, ws: WhiteboxSession) -> Any:
        assert self.python is not None
        paths = list(self.python.paths)  # hrl's own path, or hrl's package alone beside the agent's interpreter
        cmd = [self.python.python, "-m", "hrl.runners.whitebox.worker", self.spec, _absolute(self.base_dir or ".")]
        from hrl.sandboxes.local import LocalBackend

        backend = LocalBackend()
        if backend.isolate:  # bubblewrap: closed like a local sandbox, the proxy's data plane its only way out
            code, out, err = await self._in_namespace(backend, cmd, task, ws, paths)
        else:
            env = {**agent_env(), **ws.env(), "PYTHONPATH": os.pathsep.join(paths)}
            proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE, env=env)  # fmt: skip
            try:
                raw_out, raw_err = await proc.communicate(task.model_dump_json().encode())
            except BaseException:
                proc.kill()
                await proc.wait()
                raise
            code, out, err = proc.returncode, raw_out.decode(errors="replace"), raw_err.decode(errors="replace")
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_MARK)]
        if code != 0 or not lines:
            raise RuntimeError(f"the agent process exited {code}: {err[-2000:]}")
        result = json.loads(lines[-1][len(RESULT_MARK) :])
        if result.get("reward") is not None:  # given to session.reward in the agent's process
            ws.reward(result["reward"], result.get("reward_info"))
        return result.get("returned")

    async def _in_namespace(
        self, backend: Any, cmd: list[str], task: Task, ws: WhiteboxSession, paths: list[str]
    ) -> tuple[int | None, str, str]:
        """Run the worker as a local sandbox runs a command: its own mount, pid and network namespaces (the host's
        files read-only, a private temp folder, hrl's state folder emptied, no host port, no engine socket), the
        proxy reached through the unix-socket relay on 127.0.0.1:RELAY_PORT, the task handed over in a file."""
        from hrl.sandboxes import Mount, SandboxSpec

        mounts = [Mount(source=p, target=p) for p in self.mounts]
        episode = ws.sandbox  # a browser task's: its endpoint is forwarded in here too
        forwards = dict(episode.spec.forwards) if episode is not None else {}
        spec = SandboxSpec(workdir="/work", network="proxy", proxy_socket=self.stack.socket, proxy_port=RELAY_PORT,
                           mounts=mounts, forwards=forwards)  # fmt: skip
        async with await backend.create(spec, self.config.run_id or "hrl-python", f"agent-{ws.token[:8]}") as box:
            await box.write_file("/work/task.json", task.model_dump_json().encode())
            env = {**ws.env(url=f"http://127.0.0.1:{RELAY_PORT}"), "PYTHONPATH": os.pathsep.join(paths),
                   "HRL_TASK_FILE": "/work/task.json"}  # fmt: skip
            res = await box.exec(cmd, env=env)
        return (None if res.timed_out else res.exit_code), res.stdout, res.stderr

    async def _verify(self, task: Task, ws: WhiteboxSession) -> tuple[dict[str, Any], dict[str, Any]]:
        assert self.score is not None
        session = self.stack.proxy.sessions.get(ws.token)
        answer = session.last_reply if session is not None else ""
        try:
            out = await call_maybe_async(self.score, task, answer)
        except Exception as e:
            return {"failure_reason": "verifier_error"}, {"error": f"{type(e).__name__}: {e}"}
        reward, info, *said = out if isinstance(out, tuple) else (out, {})  # (reward, info, success): success said
        success = said[0] if said else binary_success(float(reward), info)
        if success is not None and not isinstance(success, bool):
            return {"failure_reason": "verifier_error"}, {"error": f"score returned success {success!r}, not a bool"}
        return {"reward": float(reward), "reward_info": dict(info or {}), "success": success}, {}

    def _end(self, token: str, trace_file: Path, outcome: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        proxy = self.stack.proxy
        try:
            trace = proxy.end_session(token, **outcome, extra=extra)
        except UnknownSessionError:  # ended under the episode (the idle reaper, or the agent itself)
            ended = proxy.ended(token)
            if ended is None:
                raise RuntimeError(f"the proxy session of an episode vanished without a trace ({token[:6]}…)") from None
            trace = {**ended, "status": "failed", "failure_reason": "internal_error", "reward": None, "success": None}
        write_trace(trace_file, trace, self.export)
        return trace
