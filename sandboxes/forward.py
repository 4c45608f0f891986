"""Scripts the docker backend runs inside a container (stdlib only; `python3` or POSIX `sh`).

`FORWARDER` lets a `network_mode=none` container reach exactly one thing, the hrl proxy: it listens on
127.0.0.1:PORT (and [::1]:PORT when the container has IPv6 loopback) and relays every TCP connection to the
proxy's unix socket, bind-mounted into the container. It binds first, then forks into the background and the
parent exits 0, so the port accepts connections as soon as the starting exec returns; a failure to bind exits 1
with the reason on stderr. Unix sockets carry no packets out of the container: the container still has no
network interface besides `lo`.

`TUNNEL` is the other direction, a port inside that hrl reaches (`SandboxSpec.exposes`: a task's web app, for the
episode's browser on the host): it keeps a few connections open to a unix socket hrl listens on, bind-mounted into
the container, and when hrl sends the first byte on one, connects to 127.0.0.1:PORT inside and relays the two.
The container connects out, as with the forwarder: hrl never connects to a socket the container could have made (a
symlink placed there could lead hrl's connection anywhere on the host).

`KILL_TREE` kills every process whose environment carries `<MARK>=<token>` (the docker backend sets it on each
exec), which catches children that left the process group (setsid, daemonising) as long as they kept their
environment.
"""

from __future__ import annotations

__all__ = ["FORWARDER", "FORWARDER_PATH", "KILL_TREE", "TUNNEL", "TUNNEL_PATH", "TUNNEL_START"]

FORWARDER_PATH = "/usr/local/lib/hrl/forward.py"
TUNNEL_PATH = "/usr/local/lib/hrl/tunnel.py"
TUNNEL_START = b"\x01"  # hrl's first byte on an idle tunnel: connect to the port and relay

_PIPE = r"""async def pipe(reader, writer, other):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except Exception:
        writer.close()
        other.close()
"""

FORWARDER = r'''"""hrl proxy forwarder: 127.0.0.1:PORT -> unix socket SOCKET. Usage: forward.py SOCKET PORT"""
import os, socket, sys  # asyncio is imported after the fork: the starting exec returns sooner

SOCKET, PORT = sys.argv[1], int(sys.argv[2])


@PIPE@

async def relay(client_reader, client_writer):
    try:
        upstream_reader, upstream_writer = await asyncio.wait_for(asyncio.open_unix_connection(SOCKET), 10)
    except Exception:
        client_writer.close()
        return
    await asyncio.gather(
        pipe(client_reader, upstream_writer, client_writer), pipe(upstream_reader, client_writer, upstream_writer)
    )
    client_writer.close()
    upstream_writer.close()


async def serve(listeners):
    servers = [await asyncio.start_server(relay, sock=listener) for listener in listeners]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def listen(family, host):
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, PORT))
    listener.listen(256)
    return listener


listeners = [listen(socket.AF_INET, "127.0.0.1")]
try:
    listeners.append(listen(socket.AF_INET6, "::1"))
except OSError:
    pass
if os.fork():
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
import asyncio

asyncio.run(serve(listeners))
'''

FORWARDER = FORWARDER.replace("@PIPE@", _PIPE)

TUNNEL = r'''"""hrl app tunnel: each connection hrl starts on unix socket SOCKET -> 127.0.0.1:PORT inside.
Usage: tunnel.py SOCKET PORT"""
import os, sys

SOCKET, PORT = sys.argv[1], int(sys.argv[2])
IDLE = 6  # connections kept open to hrl, waiting for its first byte (a browser opens up to six per origin)


@PIPE@

async def tunnel(slots):
    try:
        hrl_reader, hrl_writer = await asyncio.open_unix_connection(SOCKET)
    except OSError:
        await asyncio.sleep(0.5)
        slots.release()
        return
    try:
        start = await hrl_reader.readexactly(1)
    except Exception:
        start = b""
    slots.release()  # used or gone: another waits in its place
    if start != b"\x01":
        hrl_writer.close()
        await asyncio.sleep(0.1)
        return
    try:
        app_reader, app_writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", PORT), 10)
    except Exception:
        hrl_writer.close()
        return
    await asyncio.gather(pipe(hrl_reader, app_writer, hrl_writer), pipe(app_reader, hrl_writer, app_writer))
    hrl_writer.close()
    app_writer.close()


async def serve():
    slots, running = asyncio.Semaphore(IDLE), set()
    while True:
        await slots.acquire()
        task = asyncio.ensure_future(tunnel(slots))
        running.add(task)  # held: a task only asyncio knows of is collected with the idle connection it waits on
        task.add_done_callback(running.discard)


if os.fork():  # hrl may listen on SOCKET only later: the tunnel connects as soon as it does
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
import asyncio

asyncio.run(serve())
'''

TUNNEL = TUNNEL.replace("@PIPE@", _PIPE)  # one relay loop, in both scripts

# sh -c KILL_TREE _ MARK TOKEN: SIGKILL every process whose environment has MARK=TOKEN, until none is left.
KILL_TREE = r"""
for _ in 1 2 3 4 5 6 7 8 9 10; do
  pids=$(grep -lsxzF -- "$1=$2" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
  [ -z "$pids" ] && exit 0
  kill -9 $pids 2>/dev/null
  sleep 0.05
done
exit 1
"""
