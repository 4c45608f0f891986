"""The proxy's port is held from before the engine starts (bound; listening once the stack is up): a port that was
only picked (or checked), then closed, is free for whatever binds next during the engine's start. vLLM's own server, picking a free port for itself, took the
proxy's that way, and the proxy then failed with address in use."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest

from hrl.runners.errors import PortInUseError
from hrl.runners.serving.stack import serving


def _bind(port: int) -> int:
    """0 if 127.0.0.1:port can be bound (with SO_REUSEADDR, as servers bind), else the errno."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno or -1
    return 0


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


def test_nothing_started_with_the_engine_can_take_the_proxys_port(tiny_model: str):
    """While the engine starts the port is the proxy's and refuses connections (a client probing it for readiness
    sees it closed, as before it was held); once the stack is up it accepts them; then it is let go."""
    port, seen = _free(), []

    def starting(_: str) -> None:  # `say` runs as the engine's start begins
        seen.append((_bind(port), _connects(port)))

    async def main() -> str:
        async with serving(tiny_model, "scripted", port=port, say=starting) as stack:
            seen.append((_bind(port), await asyncio.to_thread(_connects, port)))
            return stack.url

    assert asyncio.run(main()) == f"http://127.0.0.1:{port}"
    assert seen == [(errno.EADDRINUSE, False), (errno.EADDRINUSE, True)]
    assert _bind(port) == 0  # and let go when the stack ends


def test_a_port_in_use_is_refused_before_the_engine_starts(tiny_model: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        taken = s.getsockname()[1]
        started: list[str] = []

        async def main() -> None:
            async with serving(tiny_model, "scripted", port=taken, say=started.append):
                pass

        with pytest.raises(PortInUseError, match=str(taken)):
            asyncio.run(main())
        assert started == []
