"""What carries a browser's traffic: the agent's CDP relay (refused commands answered, not passed), the task's
pages served, a sandbox's exposed port reached from the host (`tunnel_endpoint`), a unix socket relayed to an
origin, and the DevTools endpoint of a browser in a sandbox, found through its tunnel."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from hrl.runners.browser.cdp import refusal
from hrl.runners.browser.chromium import START_TIMEOUT_S, Browser, BrowserError
from hrl.sandboxes.forward import TUNNEL_START


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


async def relay(browser: Browser, unix_socket: str | None = None) -> tuple[web.AppRunner, str]:
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


async def serve(site_dir: Path, unix_socket: str | None = None) -> tuple[web.AppRunner, str]:
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


async def devtools_url(endpoint: str, box: Any, running: asyncio.Future[Any]) -> str:
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
async def unix_relay(path: str, origin: str) -> AsyncIterator[None]:
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
