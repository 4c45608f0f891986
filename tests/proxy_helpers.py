"""Run the real recording proxy (real HTTP, real template and tokenizer) in a background thread for tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

from hrl.runners.engines import make_engine
from hrl.runners.proxy.proxy import Proxy, ProxyConfig
from hrl.runners.proxy.server import build_app, run_server
from hrl.runners.proxy.template import ChatTemplate
from hrl.runners.trace import TraceWriter


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CONTROL_TOKEN = "test-control-token-0123456789abcdef"


class RunningProxy:
    def __init__(self, proxy: Proxy, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.proxy, self.url, self.loop = proxy, url, loop
        self.control = {"Authorization": f"Bearer {CONTROL_TOKEN}"}  # headers for the control routes

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run fn(*args) on the proxy's event loop thread (the proxy is not thread-safe)."""

        async def run() -> Any:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def call_async(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Start coroutine fn(*args) on the proxy's loop; returns a concurrent Future."""
        return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self.loop)

    def end(self, token: str, **outcome: Any) -> dict[str, Any]:
        return self.call(self.proxy.end_session, token, **outcome)


@contextlib.contextmanager
def running_proxy(
    model: str,
    engine: str = "scripted",
    traces: str | None = None,
    engine_options: dict[str, Any] | None = None,
    **config: Any,
) -> Iterator[RunningProxy]:
    """The real proxy on a loopback port. Tests name ad-hoc session tokens, so sessions open on first use unless
    `open_sessions=False` is passed; the control routes take `RunningProxy.control` as headers."""
    config = {"open_sessions": True, **config}
    loop = asyncio.new_event_loop()
    port = free_port()
    eng = make_engine(engine, model, **(engine_options or {}))
    proxy = Proxy(eng, ChatTemplate(model), ProxyConfig(**config), TraceWriter(traces) if traces else None)
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        await eng.start()
        ev = asyncio.Event()
        state["task"] = asyncio.current_task()
        server = asyncio.create_task(run_server(build_app(proxy, CONTROL_TOKEN), "127.0.0.1", port, ev))
        await ev.wait()
        ready.set()
        try:
            await server
        finally:
            proxy.close()
            await eng.close()

    def thread() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(main())

    t = threading.Thread(target=thread, daemon=True)
    t.start()
    assert ready.wait(120), "proxy did not start"
    try:
        yield RunningProxy(proxy, f"http://127.0.0.1:{port}", loop)
    finally:
        loop.call_soon_threadsafe(state["task"].cancel)
        t.join(30)
