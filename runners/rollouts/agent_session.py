"""One agent CLI against one proxy session, written once for rollouts, `hrl agents doctor` and the demo's profile
capture: a sandbox whose network reaches only the proxy, the agent's context pointing at the session, and its run.

The caller keeps the sandbox for its own hooks around the run (lay out the task and verify it; read a file back).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hrl.config import PROXY_PORT
from hrl.runners.agents.base import AgentContext, AgentRunner
from hrl.runners.agents.install import AgentInstall
from hrl.runners.agents.run import AgentOutcome, new_home, run_agent
from hrl.sandboxes import Sandbox, SandboxBackend, SandboxSpec

if TYPE_CHECKING:
    from hrl.runners.serving.stack import Stack
    from hrl.sandboxes.pool import Lease, Prepare, SandboxPool

__all__ = ["PROXY_PORT", "AgentSession", "agent_session"]


@dataclass
class AgentSession:
    """A sandbox and the context of one agent run in it, against one proxy session."""

    sandbox: Sandbox
    context: AgentContext
    runner: AgentRunner
    install: AgentInstall
    lease: Lease | None = None  # from a pool: how the sandbox was had and what that cost

    async def run(self, time_budget_s: float = 0) -> AgentOutcome:
        """Run the agent once (time_budget_s: 0 = no limit); its failures are data in the outcome."""
        return await run_agent(self.sandbox, self.runner, self.context, self.install, time_budget_s=time_budget_s)


@contextlib.asynccontextmanager
async def agent_session(
    stack: Stack,
    runner: AgentRunner,
    install: AgentInstall,
    backend: SandboxBackend,
    spec: SandboxSpec,
    token: str,
    prompt: str,
    *,
    run_id: str,
    episode_id: str,
    proxy_port: int = PROXY_PORT,
    options: dict[str, Any] | None = None,
    pool: SandboxPool | None = None,
    prepare: Prepare | None = None,
    group: str | None = None,
    mcp: dict[str, list[str]] | None = None,
) -> AsyncIterator[AgentSession]:
    """A sandbox from `backend` made from `spec` plus the agent's mounts and the route to the proxy (docker: only the
    proxy's unix socket, as 127.0.0.1:`proxy_port`, for docker and for local sandboxes in a bubblewrap network
    namespace; an unisolated local sandbox: the host's network and the proxy's loopback URL), and
    the context that points `runner` at session `token` (base URL `/s/<token>`, API key `hrl-<token>`) with a
    fresh HOME in the spec's workdir. Labelled `run_id` / `episode_id`; removed on exit. With a `pool`, the sandbox
    is leased from it (pooled, or reused within `group` after a reset) and laid out by `prepare` (which the pool
    skips for a reused sandbox, whose reset restores that state); without one, `prepare` (if any) runs here.
    `mcp`: MCP servers the CLI is configured to start (name -> argv in the sandbox)."""
    closed = backend.name == "docker" or backend.isolate  # local: where bubblewrap runs
    spec = spec.model_copy(
        update={
            "network": "proxy" if closed else "host",
            "proxy_socket": stack.socket if closed else None,
            "proxy_port": proxy_port,
            "mounts": [*spec.mounts, *install.mounts],
        }
    )
    base = f"http://127.0.0.1:{proxy_port}" if closed else stack.url
    context = AgentContext(
        base_url=f"{base}/s/{token}", api_key=f"hrl-{token}", model=stack.proxy.config.model_name, prompt=prompt,
        home=new_home(), workdir=spec.workdir, install_dir=install.install_dir, options=dict(options or {}),
        vision=stack.proxy.takes_images, mcp=dict(mcp or {}),
    )  # fmt: skip
    if pool is not None:
        async with pool.lease(spec, episode_id, prepare=prepare or _nothing, group=group) as lease:
            yield AgentSession(lease.sandbox, context, runner, install, lease)
        return
    async with await backend.create(spec, run_id, episode_id) as sandbox:
        if prepare is not None:
            await prepare(sandbox)
        yield AgentSession(sandbox, context, runner, install)


async def _nothing(sandbox: Sandbox) -> None:
    """No layout: the sandbox as the backend made it."""
