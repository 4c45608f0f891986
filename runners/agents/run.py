"""The agent lifecycle, written once for every CLI: fresh HOME, config files, redirect env, headless command
under a time budget, exit code and output tails, classified into the trace's failure reasons.

An episode failure (timeout, crash, non-zero exit) is data in the returned `AgentOutcome`, never an exception;
only a broken sandbox raises (SandboxError).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import shlex
import time
import uuid
from dataclasses import dataclass

from hrl.runners.agents.base import AgentContext, AgentRunner
from hrl.runners.agents.install import AgentInstall
from hrl.sandboxes.base import Sandbox

__all__ = ["DOCKER_PATH", "AgentOutcome", "classify", "new_home", "run_agent"]

DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TAIL_CHARS = 8000


@dataclass
class AgentOutcome:
    exit_code: int  # -1 when killed by the time budget
    failure_reason: str | None  # None, agent_timeout, agent_crash, agent_exit, sandbox_error (trace FAILURE_REASONS)
    duration_s: float  # wall time of the CLI itself (config writing excluded)
    started_at: float  # epoch seconds when the CLI was launched
    stdout_tail: str
    stderr_tail: str
    warm: bool = False  # run through a launcher started ahead in a warm sandbox (runners/agents/warm.py)

    @property
    def ok(self) -> bool:
        return self.failure_reason is None


def new_home() -> str:
    """A fresh HOME path for one episode (outside the workdir, so the agent's state never mixes with the task's)."""
    return f"/tmp/hrl-home-{uuid.uuid4().hex[:12]}"


def classify(exit_code: int, timed_out: bool) -> str | None:
    """exit 0 → None; budget hit → agent_timeout; killed by a signal (negative, or a shell's 128+N) → agent_crash;
    any other non-zero exit → agent_exit."""
    if timed_out:
        return "agent_timeout"
    if exit_code == 0:
        return None
    if exit_code < 0 or 128 < exit_code <= 128 + 64:
        return "agent_crash"
    return "agent_exit"


def agent_env(runner: AgentRunner, ctx: AgentContext, install: AgentInstall) -> dict[str, str]:
    """HOME and XDG dirs inside the fresh HOME, the CLI's and node's bin dirs first on PATH, then the runner's env."""
    path = DOCKER_PATH if install.target == "docker" else os.environ.get("PATH", DOCKER_PATH)
    home = ctx.home
    return {
        "HOME": home,
        "XDG_CONFIG_HOME": f"{home}/.config",
        "XDG_DATA_HOME": f"{home}/.local/share",
        "XDG_STATE_HOME": f"{home}/.local/state",
        "XDG_CACHE_HOME": f"{home}/.cache",
        "TMPDIR": f"{home}/tmp",
        "PATH": ":".join([*install.path, path]),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        **runner.env(ctx),
    }


def agent_argv(runner: AgentRunner, ctx: AgentContext, through: list[str] | None = None) -> list[str]:
    """The runner's command with stdin closed (some CLIs wait for piped input), under a pseudo-tty if it needs one;
    `through`: a prefix that runs it (a warm launcher's client)."""
    cmd = [*(through or []), *runner.command(ctx)]
    if runner.needs_tty:  # `script` (util-linux) gives the CLI a terminal and passes its exit status through
        return ["script", "-qefc", shlex.join(cmd), "/dev/null"]
    return ["sh", "-c", 'exec "$@" </dev/null', runner.name, *cmd]


async def run_agent(
    sandbox: Sandbox,
    runner: AgentRunner,
    ctx: AgentContext,
    install: AgentInstall,
    *,
    time_budget_s: float = 0,
    keep_home: bool = False,
) -> AgentOutcome:
    """Run one headless episode of `runner` in `sandbox`. time_budget_s: 0 = no limit."""
    home = ctx.home
    files = {(p if p.startswith("/") else posixpath.join(home, p)): text for p, text in runner.files(ctx).items()}
    dirs = sorted({f"{home}/tmp", *(posixpath.dirname(p) for p in files)})
    prep = await sandbox.exec(["sh", "-c", 'rm -rf "$1" && mkdir -p "$@"', "_", home, *dirs], timeout_s=60)
    if prep.exit_code != 0:
        return AgentOutcome(prep.exit_code, "sandbox_error", 0.0, time.time(), "", f"cannot make HOME: {prep.stderr}")
    for path, text in files.items():
        await sandbox.write_file(path, text.encode(), 0o600)
    through = sandbox.hrl_warm.claim(runner) if sandbox.hrl_warm is not None else None
    started, started_at = time.monotonic(), time.time()
    stopping = False
    try:
        res = await sandbox.exec(
            agent_argv(runner, ctx, through),
            timeout_s=time_budget_s,
            env=agent_env(runner, ctx, install),
            workdir=ctx.workdir,
        )
    except asyncio.CancelledError:
        stopping = True  # the sandbox is closed whole next, HOME with it: one more command would only delay the stop
        raise
    finally:
        if not keep_home and not stopping:
            with contextlib.suppress(Exception):
                await sandbox.exec(["rm", "-rf", home], timeout_s=60)
    return AgentOutcome(
        exit_code=res.exit_code,
        failure_reason=classify(res.exit_code, res.timed_out),
        duration_s=round(time.monotonic() - started, 3),
        started_at=started_at,
        stdout_tail=res.stdout[-TAIL_CHARS:],
        stderr_tail=res.stderr[-TAIL_CHARS:],
        warm=through is not None,
    )
