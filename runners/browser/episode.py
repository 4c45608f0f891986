"""An episode's browser: where it runs (beside hrl, or in a sandbox of its own with no network), the per-episode
folders of the sockets its sandbox reaches, `browser_episode` (the browser started, hrl's CDP connection to it and
the agent's relay), and `tell_agent` (where the agent's tools connect)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
import re
import shlex
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from hrl.runners.browser.cdp import CDP, guard
from hrl.runners.browser.chromium import CHROMIUM_FLAGS, Browser, BrowserError, find_chromium, reap, start_chromium
from hrl.runners.browser.relay import devtools_url, relay, serve, tunnel_endpoint, unix_relay
from hrl.runners.errors import UsageError
from hrl.sandboxes.base import SandboxBackend


class EpisodeFolders:
    """One folder per episode, 0700 under a temporary folder of the run's (only hrl, and root in a container, opens
    it): where the sockets an episode's sandbox reaches live (its browser endpoint, its app's tunnel), so that no
    other episode's sandbox sees them. `forget` removes one when its episode ends; `close` removes them all."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.root: Path | None = None

    def make(self) -> Path:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix=self.prefix))
        return Path(tempfile.mkdtemp(dir=self.root))

    def forget(self, socket_path: str | None) -> None:
        """Remove the folder of `socket_path` if it is one of these."""
        if self.root is not None and socket_path and Path(socket_path).parent.parent == self.root:
            shutil.rmtree(Path(socket_path).parent, ignore_errors=True)

    def close(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


@dataclass
class InSandbox:
    """Run the episode's Chromium in a sandbox of its own instead of beside hrl: a docker container of hrl's browser
    image (`hrl/browser:bookworm`), or a local bubblewrap sandbox (the host's Chromium, the host's files read-only).
    It has no network: it sees the task's site as http://127.0.0.1:`site_port` (forwarded from a unix socket hrl
    serves), and hrl reaches its DevTools endpoint through the sandbox's tunnel (`SandboxSpec.exposes`). Chromium
    runs with --no-sandbox, so a page that breaks out of its renderer is then in that sandbox, not in hrl's
    process's reach."""

    backend: SandboxBackend  # docker, or local where bubblewrap runs
    run_id: str
    episode_id: str
    site_port: int = 8000
    image: str = ""  # docker: default hrl's browser image


SANDBOX_CDP_PORT = 9223  # Chromium's DevTools port inside its own sandbox
PROFILE = "/tmp/hrl-chromium-profile"  # in the browser's sandbox (a local sandbox's /tmp is its own)
BrowserWhere = Literal["auto", "sandbox", "host"]
WHERE_HELP = (
    "Where the episode's Chromium runs: sandbox = a sandbox of its own with no network (docker: a container of hrl's "
    "browser image; local: bubblewrap), so a page that breaks out of the renderer stays in it; host = beside hrl; "
    "auto = sandbox where the run's sandbox backend can close one (docker, or local with bubblewrap), else host."
)


def closes_browser(backend: SandboxBackend | None) -> bool:
    """The backend can run a browser in a sandbox of its own (docker; local where bubblewrap runs)."""
    return backend is not None and (backend.name == "docker" or backend.isolate)


def sandbox_for(
    where: BrowserWhere, backend: SandboxBackend | None, run_id: str, name: str, site_port: int = 8000
) -> InSandbox | None:
    """A verifier's `browser` setting for one episode: where its Chromium runs (None: beside hrl)."""
    if where == "host" or backend is None or not closes_browser(backend):  # the verifiers refuse `sandbox` there
        return None
    episode = re.sub(r"[^a-zA-Z0-9_.-]+", "-", name)[:40] + f"-browser-{uuid.uuid4().hex[:6]}"
    return InSandbox(backend, run_id or "hrl-browser", episode, site_port)


def check_where(where: BrowserWhere, backend: SandboxBackend | None) -> None:
    """UsageError for `browser: sandbox` on a backend that cannot close one."""
    if where == "sandbox" and not closes_browser(backend):
        raise UsageError(
            "verifier.browser: sandbox runs each episode's browser in a sandbox of its own: it needs the docker "
            "sandbox, or a local one where bubblewrap runs",
            hint="use --sandbox docker (or install bubblewrap), or verifier.browser: auto",
        )


async def provision_browser(where: BrowserWhere, backend: SandboxBackend | None) -> None:
    """Build hrl's browser image if the episodes' browsers run in docker containers and it is not here (once)."""
    if where != "host" and backend is not None and backend.name == "docker":
        from hrl.runners.tasks.sandbox_images import ensure_browser_image

        await asyncio.to_thread(ensure_browser_image)


@contextlib.asynccontextmanager
async def browser_episode(site: str | Path, also_allow: tuple[str, ...] = (), unix_socket: str | None = None,
                          sandbox: InSandbox | None = None) -> AsyncIterator[tuple[Browser, CDP]]:  # fmt: skip
    """Serve the folder `site` (or take `site` as the origin that serves the task, `http://127.0.0.1:PORT`), start
    Chromium (beside hrl, or in a sandbox of its own: `sandbox`), and yield (the browser, hrl's own CDP
    connection to it). `also_allow`: URL prefixes besides the site that the browser may reach. `unix_socket`: the
    agent's relay listens there too (a sandbox's forwarded endpoint). Raises BrowserError."""
    cdp: CDP | None = None
    relay_runner: web.AppRunner | None = None
    start = _in_sandbox(site, sandbox) if sandbox is not None else _on_host(site)
    async with start as (direct_url, origin, pid, box):
        try:
            cdp = await CDP.connect(direct_url)
            browser = Browser(direct_url, origin, pid, allowed=(origin + "/", *also_allow), sandbox_id=box)
            await guard(cdp, browser)
            relay_runner, browser.cdp_url = await relay(browser, unix_socket)
            yield browser, cdp
        finally:
            if relay_runner is not None:
                await relay_runner.cleanup()
            if cdp is not None:
                await cdp.close()


@contextlib.asynccontextmanager
async def _on_host(site: str | Path) -> AsyncIterator[tuple[str, str, int, str]]:
    """Chromium beside hrl: (its DevTools endpoint, the site's origin, its process group, no sandbox)."""
    profile = Path(tempfile.mkdtemp(prefix="hrl-chromium-"))
    runner: web.AppRunner | None = None
    proc: asyncio.subprocess.Process | None = None
    try:
        if (origin := str(site)).startswith("http://"):
            origin = origin.rstrip("/")
        else:
            runner, origin = await serve(Path(site))
        proc, direct_url = await start_chromium(profile)
        yield direct_url, origin, proc.pid, ""
    finally:
        try:
            if proc is not None:
                await reap(proc)
        finally:
            if runner is not None:
                await runner.cleanup()
            shutil.rmtree(profile, ignore_errors=True)


@contextlib.asynccontextmanager
async def _in_sandbox(site: str | Path, where: InSandbox) -> AsyncIterator[tuple[str, str, int, str]]:
    """Chromium in a sandbox of its own: (its DevTools endpoint through the tunnel, the site's origin as the sandbox
    sees it, no process group of hrl's, the sandbox's id: its processes go with it)."""
    from hrl.runners.tasks.sandbox_images import BROWSER_IMAGE
    from hrl.sandboxes import SandboxError, SandboxSpec

    folder = Path(tempfile.mkdtemp(prefix="hrl-browser-"))  # 0700: only hrl, and root in a container, opens it
    stack = contextlib.AsyncExitStack()
    try:
        site_socket = str(folder / "site.sock")
        if str(site).startswith("http://"):  # an origin hrl reaches (a Harbor app's tunnel): relayed
            await stack.enter_async_context(unix_relay(site_socket, str(site)))
        else:
            runner, _ = await serve(Path(site), site_socket)
            stack.push_async_callback(runner.cleanup)
        docker = where.backend.name == "docker"
        spec = SandboxSpec(image=where.image or BROWSER_IMAGE, workdir="/work", network="none",
                           forwards={where.site_port: site_socket},
                           exposes={SANDBOX_CDP_PORT: str(folder / "cdp.sock")},
                           labels={"hrl.browser": "1"})  # fmt: skip
        try:
            box = await stack.enter_async_context(await where.backend.create(spec, where.run_id, where.episode_id))
        except SandboxError as e:
            raise BrowserError(f"the browser's sandbox did not start: {e}") from e
        endpoint = await stack.enter_async_context(tunnel_endpoint(str(folder / "cdp.sock")))
        # one long-running command: a local sandbox ends what a command leaves running, and its network namespace
        # (where the tunnel listens) is that command's own
        argv = [
            "chromium" if docker else find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={PROFILE}",
            "--remote-debugging-address=127.0.0.1", f"--remote-debugging-port={SANDBOX_CDP_PORT}", "about:blank",
        ]  # fmt: skip
        command = " ".join(shlex.quote(a) for a in argv)
        running = asyncio.ensure_future(box.exec(["sh", "-c", f"exec {command} > /tmp/chromium.log 2>&1"]))
        stack.push_async_callback(_stop, running)
        yield await devtools_url(endpoint, box, running), f"http://127.0.0.1:{where.site_port}", 0, box.id
    finally:
        await stack.aclose()
        shutil.rmtree(folder, ignore_errors=True)


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


BROWSER_FILE = "browser.json"  # in the agent's workdir: where its browser tools connect, and the task's page


async def tell_agent(sandbox: Any, browser: Browser, page_url: str, forwarded_port: int | None) -> None:
    """Write `browser.json` ({cdp_url, page_url}) into the sandbox's workdir: the agent's relay as the agent reaches
    it (127.0.0.1:`forwarded_port` inside a sandbox it is forwarded into, else the host's loopback)."""
    cdp_url = browser.cdp_url
    if forwarded_port is not None:
        cdp_url = f"ws://127.0.0.1:{forwarded_port}/devtools/{cdp_url.split('/devtools/', 1)[1]}"
    info = {"cdp_url": cdp_url, "page_url": page_url}
    await sandbox.write_file(posixpath.join(sandbox.workdir, BROWSER_FILE), json.dumps(info).encode())
