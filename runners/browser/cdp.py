"""A small Chrome DevTools Protocol client (`CDP`), the commands an agent's connection may not send (`refusal`),
hrl's own session failing every request outside the task's origins (`guard`), and a tab opened and waited on."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from hrl.runners.browser.chromium import Browser, BrowserError

CALL_TIMEOUT_S = 30.0


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


async def guard(cdp: CDP, browser: Browser) -> None:
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
