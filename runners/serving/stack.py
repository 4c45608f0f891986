"""The serving stack a rollout or training run needs: an engine, the recording proxy in front of it, and the
proxy's HTTP server on a loopback port plus a private unix socket (docker sandboxes reach only that socket)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hrl.runners.engines import Engine, make_engine
from hrl.runners.models import split_adapter
from hrl.runners.proxy.proxy import Proxy, ProxyConfig
from hrl.runners.proxy.server import bound_socket, build_app, run_server
from hrl.runners.proxy.template import ChatTemplate
from hrl.runners.scratch import scratch_dir, sweep_scratch
from hrl.runners.trace import TraceWriter

__all__ = ["Stack", "serving"]


@dataclass
class Stack:
    engine: Engine
    proxy: Proxy
    url: str  # http://127.0.0.1:PORT, for local sandboxes and tools on the host
    socket: str  # unix socket path, for docker sandboxes (mount its directory)
    control_token: str | None = None  # opens the HTTP control routes (white-box agents register sub-agents there)
    clients: Any = None  # an online run's OnlineSessions: client keys open sessions on the HTTP routes


@contextlib.asynccontextmanager
async def serving(
    model: str,
    engine: str = "embedded",
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    model_name: str | None = None,
    engine_options: dict[str, Any] | None = None,
    proxy_options: dict[str, Any] | None = None,
    traces: TraceWriter | None = None,
    control_token: str | None = None,
    clients: Callable[[Proxy], Any] | None = None,
    say: Callable[[str], object] = lambda _: None,
) -> AsyncIterator[Stack]:
    """Start engine, proxy and server; on exit end every open session (so nothing is lost) and stop them all.
    `model` may be a LoRA checkpoint (peft adapter dir): its base is served with the adapter published as policy 1.
    With `traces`, the proxy writes each ended session there too (`proxy.end_session` returns it either way).
    `control_token` opens the HTTP control routes (sessions, publish, pause) to whoever sends it; without one they
    stay closed (rollouts drive the proxy in process). `clients(proxy)`: an online run's client sessions
    (`hrl.runners.online.OnlineSessions`), whose client keys open sessions over HTTP. `say` gets one line of progress once the model's files are read and the (slow) engine start begins."""
    path, adapter = split_adapter(model)
    # Held from now on (bound; listening once the server is up), so nothing started meanwhile (the engine's own
    # server, other runs) can take the port.
    listener = bound_socket(host, port)
    port = int(listener.getsockname()[1])
    with contextlib.closing(listener):
        eng = make_engine(engine, path, **(engine_options or {}))
        sock_dir = await _socket_dir()
        sock = str(sock_dir / "proxy.sock")
        proxy = Proxy(
            eng, ChatTemplate(path), ProxyConfig(model_name=model_name or model, **(proxy_options or {})), traces
        )
        server: asyncio.Task[None] | None = None
        try:
            lora = f" with the LoRA adapter {adapter} as policy 1" if adapter else ""
            say(f"starting the {eng.name} engine for {path}{lora} …")
            await eng.start()
            if adapter:
                await eng.publish(adapter, "lora")
            ready = asyncio.Event()
            online = clients(proxy) if clients is not None else None
            app = build_app(proxy, control_token, online)
            server = asyncio.create_task(run_server(app, host, port, ready, unix_socket=sock, sock=listener))
            await _listening(server, ready)
            proxy.start_reaper()
            yield Stack(eng, proxy, f"http://{host}:{port}", sock, control_token, online)
        finally:
            try:
                await _stop(proxy, server, eng)
            finally:  # the socket goes whatever the engine's stop does (fails, is cut short by a second stop)
                shutil.rmtree(sock_dir, ignore_errors=True)


async def _socket_dir() -> Path:
    """A fresh private folder for the proxy's unix socket, open to the sandboxes' users (what killed runs left in
    TMPDIR is swept first)."""
    await asyncio.to_thread(sweep_scratch)
    sock_dir = scratch_dir("proxy")
    await asyncio.to_thread(sock_dir.chmod, 0o755)
    return sock_dir


async def _listening(server: asyncio.Task[None], ready: asyncio.Event) -> None:
    """Wait until the server listens (`ready`); raises why it could not, if it ended first."""
    done, _ = await asyncio.wait([server, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
    if server in done:
        server.result()


async def _stop(proxy: Proxy, server: asyncio.Task[None] | None, engine: Engine) -> None:
    """Close the proxy (its open sessions end), stop its server, then the engine."""
    proxy.close()
    if server is not None:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await server
    await engine.close()
