"""One headless Chromium per episode, its task pages served on loopback, and a small CDP client.

`browser_episode(site_dir)` serves `site_dir` on 127.0.0.1 (a static file server in hrl's process), starts Chromium
with a remote-debugging endpoint (CDP) in a fresh profile, and yields a `Browser`: hrl's grader holds the browser's
own endpoint (`direct_url`), the agent's tools get `cdp_url`, a relay in front of it that refuses the commands that
could rewrite the task's code or files (`refusal`). Both see the same page. On exit the browser's whole process group is killed and the
profile removed, whatever happened.

What the browser reaches: hrl's own CDP session intercepts every request (`Fetch`) and fails those outside the
allowed origins (the task's server, and the proxy where given); non-loopback hosts also go to a dead proxy, so a
request the interception missed fails too. An agent's CDP session cannot turn hrl's interception off (CDP domains are
per session).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
from aiohttp import web

from hrl.runners.errors import HrlError, PrerequisiteError, UsageError
from hrl.sandboxes.base import SandboxBackend
from hrl.sandboxes.forward import TUNNEL_START

__all__ = [
    "BROWSER_FILE",
    "CDP",
    "CHROMIUM_FLAGS",
    "REFUSED_PREFIXES",
    "WHERE_HELP",
    "Browser",
    "BrowserError",
    "BrowserWhere",
    "EpisodeFolders",
    "InSandbox",
    "browser_episode",
    "check_where",
    "closes_browser",
    "find_chromium",
    "live_in_group",
    "open_tab",
    "provision_browser",
    "refusal",
    "sandbox_for",
    "tell_agent",
    "tunnel_endpoint",
    "wait_until",
]

# Without the networking flags Chromium's background connections are refused here and slow every start.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--proxy-server=http://127.0.0.1:9",  # loopback bypasses a proxy by default
)  # fmt: skip
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0


class BrowserError(HrlError):
    """The episode's browser could not be started or reached: an infrastructure failure, never a reward of 0."""


def find_chromium() -> str:
    """The Chromium binary: $HRL_CHROMIUM, else chromium / chromium-browser / google-chrome on PATH."""
    for name in (os.environ.get("HRL_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    raise PrerequisiteError(
        "no Chromium found for browser tasks", hint="apt-get install chromium (or set HRL_CHROMIUM to the binary)"
    )


class CDP:
    """A Chrome DevTools Protocol connection (one websocket): `call(method, **params)`, events to `on(name, fn)`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, http: aiohttp.ClientSession) -> None:
        self._ws, self._http, self._ids = ws, http, itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._handlers: dict[str, list[Callable[[dict[str, Any], str | None], Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str) -> CDP:
        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(url, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=5))
        except (aiohttp.ClientError, OSError) as e:
            await http.close()
            raise BrowserError(f"cannot reach the browser's DevTools endpoint {url}: {e}") from e
        return cls(ws, http)

    def on(self, event: str, fn: Callable[[dict[str, Any], str | None], Any]) -> None:
        """Call `fn(params, session_id)` for every `event` (e.g. "Runtime.consoleAPICalled")."""
        self._handlers.setdefault(event, []).append(fn)

    async def call(self, method: str, session: str | None = None, timeout_s: float = CALL_TIMEOUT_S,
                   **params: Any) -> dict[str, Any]:  # fmt: skip
        """Send one command (to a target `session` when given) and return its result; raises BrowserError."""
        msg_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = fut
        msg = {"id": msg_id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        try:
            await self._ws.send_str(json.dumps(msg))
            reply = await asyncio.wait_for(fut, timeout_s)
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as e:
            raise BrowserError(f"the browser connection failed during {method}: {e}") from e
        except TimeoutError as e:
            raise BrowserError(f"the browser did not answer {method} within {timeout_s:.0f} s") from e
        finally:
            self._waiting.pop(msg_id, None)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')} ({reply['error'].get('data', '')})")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def _read(self) -> None:
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                if "id" in data and (fut := self._waiting.get(data["id"])) and not fut.done():
                    fut.set_result(data)
                for fn in self._handlers.get(data.get("method", ""), []):
                    fn(data.get("params", {}), data.get("sessionId"))
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("the browser closed the DevTools connection"))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._ws.close()
            await self._reader
        await self._http.close()


# CDP methods an agent's connection may not use: they would rewrite the task's own code or data (a live edit of its
# scripts, its closures' variables, a script of the agent's before the task's in the page's main world) or serve the
# page other files (request interception). Playwright and the MCP browser servers act without them.
REFUSED_PREFIXES = ("Debugger.", "Fetch.", "Network.setRequestInterception", "Network.setBypassServiceWorker",
                    "Page.setBypassCSP", "Target.exposeDevToolsProtocol", "Target.setRemoteLocations")  # fmt: skip


def refusal(method: str, params: dict[str, Any]) -> str | None:
    """Why an agent's CDP command is refused, or None to pass it to the browser."""
    if method.startswith(REFUSED_PREFIXES):
        return f"{method} is refused by hrl: it could rewrite the task's page or what it is served"
    if method == "Page.addScriptToEvaluateOnNewDocument" and not params.get("worldName"):
        return "Page.addScriptToEvaluateOnNewDocument is allowed only into an isolated world (give worldName)"
    return None


async def _relay_socket(request: web.Request, browser: Browser) -> web.WebSocketResponse:
    """One agent connection: every message passed on both ways, except the agent's refused commands, answered with
    a CDP error instead (`Browser.refused` counts them)."""
    agent = web.WebSocketResponse(max_msg_size=0)
    await agent.prepare(request)
    async with aiohttp.ClientSession() as http:
        try:
            upstream = await http.ws_connect(browser.direct_url, max_msg_size=0)
        except (aiohttp.ClientError, OSError):
            await agent.close()
            return agent

        async def down() -> None:
            async for msg in upstream:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    await agent.send_str(msg.data)
            await agent.close()

        pump = asyncio.create_task(down())
        try:
            async for msg in agent:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                command = json.loads(msg.data)
                why = refusal(str(command.get("method", "")), command.get("params") or {})
                if why is None:
                    await upstream.send_str(msg.data)
                    continue
                browser.refused.append(str(command.get("method")))
                answer = {"id": command.get("id"), "error": {"code": -32000, "message": why}}
                if "sessionId" in command:
                    answer["sessionId"] = command["sessionId"]
                await agent.send_str(json.dumps(answer))
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
            await upstream.close()
    return agent


async def _relay(browser: Browser, unix_socket: str | None = None) -> tuple[web.AppRunner, str]:
    """The agent's DevTools endpoint: a websocket relay on loopback in front of the browser's own, and where given
    on `unix_socket` too (what a sandbox reaches as 127.0.0.1:PORT through `SandboxSpec.forwards`). It answers
    `/json/version` as Chromium does, with the relay's own address as its client named it, so tools that take an
    http:// endpoint (Playwright's connectOverCDP, the MCP browser servers) find it."""
    app = web.Application()
    path = browser.direct_url.split("/devtools/", 1)[1]

    async def handle(request: web.Request) -> web.WebSocketResponse:
        return await _relay_socket(request, browser)

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"Browser": "Chromium (hrl relay)", "Protocol-Version": "1.3",
                                  "webSocketDebuggerUrl": f"ws://{request.host}/devtools/{path}"})  # fmt: skip

    app.router.add_get("/devtools/{path:.*}", handle)
    app.router.add_get("/json/version", version)
    app.router.add_get("/json/version/", version)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    if unix_socket is not None:
        await web.UnixSite(runner, unix_socket).start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"ws://127.0.0.1:{port}/devtools/{path}"


@dataclass
class Browser:
    """A started browser: its DevTools endpoint and the origin that serves the task's pages."""

    direct_url: str  # the browser's own endpoint: hrl's grader only
    site: str  # http://127.0.0.1:PORT: the task's pages
    pid: int
    allowed: tuple[str, ...] = ()
    blocked: list[str] = field(default_factory=list)  # requests hrl's interception failed (outside `allowed`)
    refused: list[str] = field(default_factory=list)  # the agent's CDP commands the relay refused
    cdp_url: str = ""  # ws://127.0.0.1:PORT/devtools/browser/ID: the relay, what the agent's browser tools connect to
    sandbox_id: str = ""  # the sandbox it runs in (pid 0), else "" (beside hrl, its process group `pid`)


async def _serve(site_dir: Path, unix_socket: str | None = None) -> tuple[web.AppRunner, str]:
    """The task's pages, static, on a fresh loopback port (its origin returned), or on `unix_socket` (no origin: a
    sandbox reaches it through a forward)."""
    app = web.Application()
    app.router.add_static("/", site_dir, show_index=False, follow_symlinks=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    if unix_socket is not None:
        await web.UnixSite(runner, unix_socket).start()
        return runner, ""
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


IDLE_TUNNELS = 16  # the sandbox keeps six open; more are refused (something else in it connecting)
TUNNEL_WAIT_S = 10.0


@contextlib.asynccontextmanager
async def tunnel_endpoint(unix_socket: str) -> AsyncIterator[str]:
    """The host's end of a sandbox's exposed port (`SandboxSpec.exposes`): listens on `unix_socket`, where the
    sandbox keeps connections open, and on 127.0.0.1:PORT, whose every connection is carried over one of them to the
    port inside (hrl's first byte on it tells the sandbox to connect). Yields http://127.0.0.1:PORT."""
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    writers: set[asyncio.StreamWriter] = set()

    async def arrived(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if idle.qsize() >= IDLE_TUNNELS:
            writer.close()
            return
        writers.add(writer)
        idle.put_nowait((reader, writer))

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        while True:
            try:
                far_reader, far_writer = await asyncio.wait_for(idle.get(), TUNNEL_WAIT_S)
            except TimeoutError:  # nothing in the sandbox holds the tunnel: the app is unreachable
                writer.close()
                return
            if not (far_reader.at_eof() or far_writer.is_closing()):
                break
            far_writer.close()  # one the sandbox closed while it waited
        try:
            far_writer.write(TUNNEL_START)
            await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))
        finally:
            far_writer.close()
            writer.close()
            writers.discard(far_writer)
            writers.discard(writer)

    handlers: set[asyncio.Task[None]] = set()
    unix = await asyncio.start_unix_server(arrived, path=unix_socket)
    tcp = await asyncio.start_server(_tracked(client, handlers), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{tcp.sockets[0].getsockname()[1]}"
    finally:
        for server in (tcp, unix):
            server.close()
        for w in list(writers):
            w.close()
        await _cancel(handlers)
        await asyncio.to_thread(Path(unix_socket).unlink, missing_ok=True)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]


def _tracked(handler: Handler, tasks: set[asyncio.Task[None]]) -> Handler:
    """`handler` with each connection's task kept in `tasks` while it runs (cancelled when its server ends)."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(reader, writer)
        except asyncio.CancelledError:  # its server ended: asyncio would log a cancelled connection as an error
            pass
        finally:
            tasks.discard(task)

    return run


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _start_chromium(profile: Path) -> tuple[asyncio.subprocess.Process, str]:
    # Chromium keeps its singleton socket in $TMPDIR (org.chromium.Chromium.*), which a killed browser never removes:
    # inside the profile, it goes with the profile.
    (tmp := profile / "tmp").mkdir(exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0", "about:blank",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # its own process group: killed whole on exit (the renderers and the zygote too)
        env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    port_file = profile / "DevToolsActivePort"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while loop.time() < deadline:
        if port_file.is_file() and len(lines := port_file.read_text().split("\n")) >= 2 and lines[1]:
            return proc, f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
        if proc.returncode is not None:
            raise BrowserError(f"Chromium exited at start (exit {proc.returncode})")
        await asyncio.sleep(0.05)
    _kill_group(proc.pid)
    raise BrowserError(f"Chromium did not open its DevTools endpoint within {START_TIMEOUT_S:.0f} s")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def live_in_group(pgid: int) -> list[int]:
    """The processes of group `pgid` still running (zombies left for a parent that never reaps them do not count)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, …
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                live.append(int(stat.parent.name))
    return live


async def _reap(proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> None:
    """Kill the browser's process group and wait until none of it runs; raises BrowserError past `timeout_s`."""
    _kill_group(proc.pid)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    with contextlib.suppress(ProcessLookupError, TimeoutError):
        await asyncio.wait_for(proc.wait(), timeout_s)
    while (left := live_in_group(proc.pid)) and loop.time() < deadline:
        _kill_group(proc.pid)
        await asyncio.sleep(0.05)
    if left:
        raise BrowserError(f"browser processes {left} survived SIGKILL for {timeout_s:.0f} s")


async def _guard(cdp: CDP, browser: Browser) -> None:
    """Fail every request outside `browser.allowed`, from hrl's own session, for every page the browser opens."""

    async def decide(params: dict[str, Any], session: str | None) -> None:
        url = params["request"]["url"]
        with contextlib.suppress(BrowserError):
            if url.startswith((*browser.allowed, "data:", "about:")):
                await cdp.call("Fetch.continueRequest", session, requestId=params["requestId"])
            else:
                browser.blocked.append(url[:200])
                await cdp.call(
                    "Fetch.failRequest", session, requestId=params["requestId"], errorReason="BlockedByClient"
                )

    async def attached(params: dict[str, Any], session: str | None) -> None:
        child = params["sessionId"]
        with contextlib.suppress(BrowserError):
            await cdp.call("Fetch.enable", child, patterns=[{"urlPattern": "*"}])
            await cdp.call("Runtime.runIfWaitingForDebugger", child)

    cdp.on("Fetch.requestPaused", lambda p, s: asyncio.ensure_future(decide(p, s)))
    cdp.on("Target.attachedToTarget", lambda p, s: asyncio.ensure_future(attached(p, s)))
    await cdp.call("Target.setAutoAttach", autoAttach=True, waitForDebuggerOnStart=True, flatten=True,
                   filter=[{"type": "page"}, {"type": "iframe"}, {"type": "worker"}])  # fmt: skip


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
        from hrl.runners.tasks.image import ensure_browser_image

        await asyncio.to_thread(ensure_browser_image)


@contextlib.asynccontextmanager
async def browser_episode(site: str | Path, also_allow: tuple[str, ...] = (), unix_socket: str | None = None,
                          sandbox: InSandbox | None = None) -> AsyncIterator[tuple[Browser, CDP]]:  # fmt: skip
    """Serve the folder `site` (or take `site` as the origin that serves the task, `http://127.0.0.1:PORT`), start
    Chromium (beside hrl, or in a sandbox of its own: `sandbox`), and yield (the browser, hrl's own CDP
    connection to it). `also_allow`: URL prefixes besides the site that the browser may reach. `unix_socket`: the
    agent's relay listens there too (a sandbox's forwarded endpoint). Raises BrowserError."""
    cdp: CDP | None = None
    relay: web.AppRunner | None = None
    start = _in_sandbox(site, sandbox) if sandbox is not None else _on_host(site)
    async with start as (direct_url, origin, pid, box):
        try:
            cdp = await CDP.connect(direct_url)
            browser = Browser(direct_url, origin, pid, allowed=(origin + "/", *also_allow), sandbox_id=box)
            await _guard(cdp, browser)
            relay, browser.cdp_url = await _relay(browser, unix_socket)
            yield browser, cdp
        finally:
            if relay is not None:
                await relay.cleanup()
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
            runner, origin = await _serve(Path(site))
        proc, direct_url = await _start_chromium(profile)
        yield direct_url, origin, proc.pid, ""
    finally:
        try:
            if proc is not None:
                await _reap(proc)
        finally:
            if runner is not None:
                await runner.cleanup()
            shutil.rmtree(profile, ignore_errors=True)


@contextlib.asynccontextmanager
async def _in_sandbox(site: str | Path, where: InSandbox) -> AsyncIterator[tuple[str, str, int, str]]:
    """Chromium in a sandbox of its own: (its DevTools endpoint through the tunnel, the site's origin as the sandbox
    sees it, no process group of hrl's, the sandbox's id: its processes go with it)."""
    from hrl.runners.tasks.image import BROWSER_IMAGE
    from hrl.sandboxes import SandboxError, SandboxSpec

    folder = Path(tempfile.mkdtemp(prefix="hrl-browser-"))  # 0700: only hrl, and root in a container, opens it
    stack = contextlib.AsyncExitStack()
    try:
        site_socket = str(folder / "site.sock")
        if str(site).startswith("http://"):  # an origin hrl reaches (a Harbor app's tunnel): relayed
            await stack.enter_async_context(_unix_relay(site_socket, str(site)))
        else:
            runner, _ = await _serve(Path(site), site_socket)
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
        yield await _devtools_url(endpoint, box, running), f"http://127.0.0.1:{where.site_port}", 0, box.id
    finally:
        await stack.aclose()
        shutil.rmtree(folder, ignore_errors=True)


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def _devtools_url(endpoint: str, box: Any, running: asyncio.Future[Any]) -> str:
    """The browser's own DevTools websocket, as hrl reaches it (`endpoint`: the tunnel's origin)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while loop.time() < deadline and not running.done():
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                async with http.get(f"{endpoint}/json/version") as r:
                    path = (await r.json())["webSocketDebuggerUrl"].split("/devtools/", 1)[1]
                    return f"ws://{endpoint.removeprefix('http://')}/devtools/{path}"
            await asyncio.sleep(0.1)
    log = await box.exec(["sh", "-c", "tail -c 1500 /tmp/chromium.log"], timeout_s=30)
    why = "exited" if running.done() else f"did not open its DevTools endpoint within {START_TIMEOUT_S:.0f} s"
    raise BrowserError(f"Chromium {why}: {log.stdout}")


@contextlib.asynccontextmanager
async def _unix_relay(path: str, origin: str) -> AsyncIterator[None]:
    """Each connection on unix socket `path` relayed to `origin` (http://HOST:PORT)."""
    host, port = origin.removeprefix("http://").rstrip("/").rsplit(":", 1)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            far_reader, far_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))
        finally:
            far_writer.close()
            writer.close()

    handlers: set[asyncio.Task[None]] = set()
    server = await asyncio.start_unix_server(_tracked(relay, handlers), path=path)
    try:
        yield
    finally:
        server.close()
        await _cancel(handlers)


async def open_tab(cdp: CDP) -> str:
    """A fresh tab, the browser's only one (Chromium's first is closed, so an agent's tools act on this one from
    their first call), with hrl's CDP session attached; the session id."""
    created = await cdp.call("Target.createTarget", url="about:blank")
    for other in (await cdp.call("Target.getTargets"))["targetInfos"]:
        if other["type"] == "page" and other["targetId"] != created["targetId"]:
            await cdp.call("Target.closeTarget", targetId=other["targetId"])
    return str((await cdp.call("Target.attachToTarget", targetId=created["targetId"], flatten=True))["sessionId"])


async def wait_until(cdp: CDP, tab: str, expression: str, what: str, timeout_s: float = 30.0) -> None:
    """Until `expression` is true in the tab's main world (a read, polled); BrowserError naming `what` past
    `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        reply = await cdp.call("Runtime.evaluate", tab, expression=expression, returnByValue=True)
        if reply.get("result", {}).get("value") is True:
            return
        await asyncio.sleep(0.05)
    raise BrowserError(f"{what} did not load within {timeout_s:.0f} s")


BROWSER_FILE = "browser.json"  # in the agent's workdir: where its browser tools connect, and the task's page


async def tell_agent(sandbox: Any, browser: Browser, page_url: str, forwarded_port: int | None) -> None:
    """Write `browser.json` ({cdp_url, page_url}) into the sandbox's workdir: the agent's relay as the agent reaches
    it (127.0.0.1:`forwarded_port` inside a sandbox it is forwarded into, else the host's loopback)."""
    cdp_url = browser.cdp_url
    if forwarded_port is not None:
        cdp_url = f"ws://127.0.0.1:{forwarded_port}/devtools/{cdp_url.split('/devtools/', 1)[1]}"
    info = {"cdp_url": cdp_url, "page_url": page_url}
    await sandbox.write_file(posixpath.join(sandbox.workdir, BROWSER_FILE), json.dumps(info).encode())
