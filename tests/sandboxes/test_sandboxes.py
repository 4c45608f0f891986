"""Sandbox backends: round trips, timeouts that kill whole process trees, cleanup, prune, and (docker) proof that a
`proxy` container reaches the proxy's unix socket and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from hrl.errors import UnknownNameError
from hrl.sandboxes import SandboxError, SandboxSpec, get_backend
from hrl.sandboxes.base import Mount
from hrl.sandboxes.docker import KILL_GRACE_S as DOCKER_KILL_GRACE_S
from hrl.sandboxes.docker import DockerBackend
from hrl.sandboxes.local import KILL_GRACE_S as LOCAL_KILL_GRACE_S
from hrl.sandboxes.local import MARKER, LocalBackend

T = TypeVar("T")
IMAGE = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def make_tree(root: Path) -> Path:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "a.txt").write_text("alpha\n")
    (root / "src" / "pkg" / "b.py").write_text("print('beta')\n")
    (root / "src" / "link").symlink_to("a.txt")
    return root / "src"


async def round_trip(backend: Any, spec: SandboxSpec, tree: Path, rid: str) -> Any:
    """The same checks for every backend; returns the (closed) sandbox."""
    async with await backend.create(spec, rid, "ep-1") as sandbox:
        result = await sandbox.exec("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n"), result
        assert not result.timed_out
        assert result.duration_s > 0
        assert (await sandbox.exec(["sh", "-c", "pwd"])).stdout.strip().endswith("work")
        env = await sandbox.exec(["sh", "-c", 'echo "$A $B"'], env={"B": "call"})
        assert env.stdout == "spec call\n"
        await sandbox.write_file("sub/dir/x.sh", b"#!/bin/sh\necho run-me\n", mode=0o755)
        assert await sandbox.read_file(f"{spec.workdir}/sub/dir/x.sh") == b"#!/bin/sh\necho run-me\n"
        assert (await sandbox.exec(["./x.sh"], workdir=f"{spec.workdir}/sub/dir")).stdout == "run-me\n"
        await sandbox.copy_in(str(tree), f"{spec.workdir}/repo")
        assert await sandbox.read_file("repo/pkg/b.py") == b"print('beta')\n"
        assert await sandbox.read_file("repo/link") == b"alpha\n"
        assert (await sandbox.exec("cat repo/a.txt && test -L repo/link")).stdout == "alpha\n"
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("missing.txt")
        missing = await sandbox.exec(["no-such-program-hrl"])
        assert (missing.exit_code in (126, 127), missing.timed_out) == (True, False)
    await sandbox.close()  # idempotent
    with pytest.raises(SandboxError):
        await sandbox.exec("true")
    return sandbox


async def timeouts(backend: Any, spec: SandboxSpec, kill_grace_s: float) -> None:
    sleep = f"sleep {uuid.uuid4().int % 9000 + 1000}"  # a unique command line, to look for leftovers
    async with await backend.create(spec, run_id(), "ep-timeout") as sandbox:
        for cmd in (sleep, f"bash -c '{sleep} & {sleep}'", f"setsid {sleep} & {sleep}"):
            started = time.monotonic()
            result = await sandbox.exec(cmd, timeout_s=1)
            took = time.monotonic() - started
            assert (result.timed_out, result.exit_code) == (True, -1), (cmd, result)
            # not before the timeout; and before the grace for an escaped process that holds the output ran out
            # (the sleeps run for 1000 s or more)
            assert 1 - 1e-6 <= took < 1 + kill_grace_s, (cmd, took)
        # the echo must come before the kill: a sandboxed bash prints in ~20 ms idle and under 0.3 s on a loaded
        # core, so 3 s
        partial = await sandbox.exec(["bash", "-c", f"echo started; {sleep}"], timeout_s=3)
        assert (partial.stdout, partial.timed_out) == ("started\n", True)  # output before the kill is kept
        left = await sandbox.exec(f"ps -eo args | grep -c '^{sleep}$' || true", timeout_s=10)
        assert left.stdout.strip() == "0", left
        quick = await sandbox.exec("echo fast", timeout_s=30)
        assert (quick.exit_code, quick.stdout, quick.timed_out) == (0, "fast\n", False)


# --------------------------------------------------------------------------------------------------------------
# local
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def local(tmp_path: Path) -> LocalBackend:
    return LocalBackend(root=str(tmp_path / "sandboxes"))


@pytest.fixture
def unisolated(tmp_path: Path) -> LocalBackend:
    """Without bwrap, what a command leaves running outlives it (isolated, its pid namespace ends it at once):
    close() and prune() must kill it."""
    return LocalBackend(root=str(tmp_path / "sandboxes"), isolate=False)


def test_registry_builds_both_backends_lazily() -> None:
    assert get_backend("local").name == "local"
    assert get_backend("docker").name == "docker"  # connects only when used
    with pytest.raises(UnknownNameError, match="valid: docker, local"):
        get_backend("nope")


def test_hrls_cache_under_tmp_is_seen_read_only_and_the_rest_of_tmp_is_not(
    local: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$HRL_CACHE under /tmp (a fresh machine's cache, a CI scratch folder): a local sandbox's private /tmp used to
    hide it, so the agents installed there and the grading venv were "not found" (exit 127) in every local episode.
    It is bound back read-only at its path, and a PATH entry into it reaches the command untranslated; the rest of
    /tmp stays out of sight."""
    from hrl.sandboxes.local import bwrap_works

    assert bwrap_works(), "bubblewrap is needed (.ci/setup.sh installs it)"
    cache, other = tmp_path / "cache", tmp_path / "other"
    (cache / "bin").mkdir(parents=True)
    tool = cache / "bin" / "hrl-tool"
    tool.write_text("#!/bin/sh\necho from the cache\n")
    tool.chmod(0o755)
    other.mkdir()
    (other / "secret.txt").write_text("not yours")
    monkeypatch.setenv("HRL_CACHE", str(cache))

    async def main() -> list:
        async with await local.create(SandboxSpec(), run_id(), "e0") as sandbox:
            env = {"PATH": f"{cache / 'bin'}:/usr/bin:/bin"}
            return [await sandbox.exec("hrl-tool", env=env),
                    await sandbox.exec(f"touch {cache}/new 2>&1; echo $?"),
                    await sandbox.exec(f"cat {other}/secret.txt 2>&1; echo $?")]  # fmt: skip

    ran, wrote, peeked = run(main())
    assert (ran.exit_code, ran.stdout) == (0, "from the cache\n"), ran
    assert wrote.stdout.strip().endswith("1") and not (cache / "new").exists(), wrote
    assert "not yours" not in peeked.stdout and peeked.stdout.strip().endswith("1"), peeked


def test_local_round_trip_and_cleanup(local: LocalBackend, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "d.txt").write_text("mounted")
    spec = SandboxSpec(env={"A": "spec"}, mounts=[Mount(source=str(data), target="/work/data")])
    sandbox = run(round_trip(local, spec, make_tree(tmp_path), run_id()))
    assert not sandbox.root.exists()
    assert list(Path(local.root).iterdir()) == []


def test_local_paths_and_mounts(local: LocalBackend, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "d.txt").write_text("mounted")

    async def main() -> None:
        spec = SandboxSpec(env={"HOME": "/work/.home"}, mounts=[Mount(source=str(data), target="/work/data")])
        async with await local.create(spec, run_id(), "ep") as sandbox:
            assert sandbox.host_path("/work/x") == str(sandbox.root / "work" / "x")
            assert sandbox.host_path("/work/data/d.txt") == str(data / "d.txt")
            assert sandbox.host_path("/etc/hostname") == "/etc/hostname"  # no isolation: documented
            assert (await sandbox.exec("cat data/d.txt; echo; echo $HOME")).stdout == (
                f"mounted\n{sandbox.root / 'work' / '.home'}\n"
            )

    run(main())


def test_scratch_dirs_of_killed_processes_are_swept(tmp_path: Path) -> None:
    """A process killed with -9 cannot remove its scratch dirs; the next run's sweep does, and leaves live ones and
    sandbox roots (whose names can hold digits too) alone."""
    import sys

    from hrl.runners.scratch import scratch_dir, sweep_scratch

    code = "from hrl.runners.scratch import scratch_dir; print(scratch_dir('proxy'), flush=True); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})  # fmt: skip
    assert proc.stdout is not None
    orphan = Path(proc.stdout.readline().strip())
    live = scratch_dir("snapshot")  # this process's own, in the real TMPDIR
    (live / "f").write_text("x")
    sandbox_like = tmp_path / f"hrl-sbx-run-{dead_pid()}-abc"
    sandbox_like.mkdir()
    try:
        assert orphan.parent == tmp_path and orphan.is_dir()
        assert sweep_scratch(str(tmp_path)) == 0  # its owner is alive
        proc.kill()
        proc.wait()
        assert sweep_scratch(str(tmp_path)) == 1 and not orphan.exists()
        assert sandbox_like.is_dir()
        sweep_scratch()
        assert (live / "f").exists()
    finally:
        shutil.rmtree(live, ignore_errors=True)


def test_local_timeouts_kill_process_trees(local: LocalBackend) -> None:
    run(timeouts(local, SandboxSpec(), LOCAL_KILL_GRACE_S))


def test_local_exec_cut_short_by_shutdown_logs_nothing(local: LocalBackend) -> None:
    """Ctrl-C or SIGTERM ends `hrl train` by cancelling every task at once, the output readers too: the reader group
    of an exec is then done, cancelled; nobody may leave it holding an exception that asyncio reports later, one
    traceback per running episode."""
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        async with await local.create(SandboxSpec(), run_id(), "ep") as sandbox:
            task = asyncio.ensure_future(sandbox.exec("sleep 30"))
            await asyncio.sleep(0.5)
            for t in asyncio.all_tasks():  # what asyncio.run does on the way out: all of them, readers first
                if t is not asyncio.current_task() and t is not task:
                    t.cancel()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        import gc

        gc.collect()
        await asyncio.sleep(0)

    run(main())
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))]


def test_local_close_kills_leftovers_and_exceptions_clean_up(unisolated: LocalBackend) -> None:
    local = unisolated
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with await local.create(SandboxSpec(), run_id(), "ep") as sandbox:
            seen["root"] = sandbox.root
            seen["pid"] = int((await sandbox.exec("setsid sleep 100 >/dev/null 2>&1 & echo $!")).stdout)
            assert is_running(seen["pid"])
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run(main())
    assert wait_gone(seen["pid"])
    assert not seen["root"].exists()


def test_local_prune(unisolated: LocalBackend) -> None:
    local = unisolated

    async def main() -> None:
        rid = run_id()
        sandboxes = [await local.create(SandboxSpec(), rid, f"ep-{i}") for i in range(2)]
        other = await local.create(SandboxSpec(), run_id(), "ep")
        pid = int((await sandboxes[0].exec("setsid sleep 100 >/dev/null 2>&1 & echo $!")).stdout)
        assert await local.prune(rid) == 2
        assert wait_gone(pid)
        assert not any(s.root.exists() for s in sandboxes)
        assert await local.prune() == 0  # `other` belongs to a live process
        info = json.loads((other.root / MARKER).read_text())
        info["pid"] = dead_pid()  # as if the creating process had crashed
        (other.root / MARKER).write_text(json.dumps(info))
        assert await local.prune() == 1
        for sandbox in [*sandboxes, other]:
            await sandbox.close()  # already gone: no error

    run(main())


# --------------------------------------------------------------------------------------------------------------
# docker
# --------------------------------------------------------------------------------------------------------------


def containers(run: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=hrl.run={run}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.docker
def test_docker_cancel_while_creating_leaks_no_container() -> None:
    """Ctrl-C while the daemon creates the container: the create call runs on, so its container is removed once
    it exists. The create is slowed so that the cancel lands inside it every time."""
    backend = DockerBackend()
    rid = run_id()

    async def main() -> None:
        api = await backend.connect()
        real = api.create_container

        def slow_create(**config: Any) -> Any:
            time.sleep(0.5)
            return real(**config)

        api.create_container = slow_create  # type: ignore[method-assign]
        try:
            task = asyncio.create_task(backend.create(SandboxSpec(image=IMAGE, network="none"), rid, "ep"))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(1.5)  # time for a create still running on the pool to finish
        finally:
            del api.create_container

    run(main())
    assert containers(rid) == []


@pytest.mark.docker
def test_docker_round_trip_labels_and_cleanup(tmp_path: Path) -> None:
    backend = DockerBackend()
    spec = SandboxSpec(image=IMAGE, network="none", env={"A": "spec"}, labels={"team": "x"}, cpus=1, memory_mb=256)
    rid = run_id()
    run(round_trip(backend, spec, make_tree(tmp_path), rid))
    assert containers(rid) == []
    assert run(backend.prune(rid)) == 0

    async def labels_and_exception(rid: str) -> None:
        async with await backend.create(spec, rid, "ep-7") as sandbox:
            info = await backend.call(backend.api.inspect_container, sandbox.id)
            assert info["Config"]["Labels"] == {"hrl": "1", "hrl.run": rid, "hrl.episode": "ep-7", "team": "x"}
            assert (info["HostConfig"]["NanoCpus"], info["HostConfig"]["Memory"]) == (10**9, 256 << 20)
            assert (info["HostConfig"]["Init"], info["HostConfig"]["NetworkMode"]) == (True, "none")
            assert containers(rid) != []
            raise RuntimeError("boom")

    rid = run_id()
    with pytest.raises(RuntimeError, match="boom"):
        run(labels_and_exception(rid))
    assert containers(rid) == []


@pytest.mark.docker
def test_docker_timeouts_kill_process_trees() -> None:
    run(timeouts(DockerBackend(), SandboxSpec(image=IMAGE, network="none"), DOCKER_KILL_GRACE_S))


@pytest.mark.docker
def test_docker_prune_and_failures() -> None:
    backend = DockerBackend()

    async def main() -> None:
        rid = run_id()
        sandboxes = [await backend.create(SandboxSpec(image=IMAGE, network="none"), rid, f"ep-{i}") for i in range(2)]
        assert len(containers(rid)) == 2
        assert await backend.prune(rid) == 2
        assert containers(rid) == []
        for sandbox in sandboxes:
            await sandbox.close()  # the container is already gone: no error
        with pytest.raises(SandboxError, match="not found") as missing:
            await backend.create(SandboxSpec(image="hrl/no-such-image:none", network="none"), rid, "ep")
        assert "hrl sandbox build" in (missing.value.hint or "")
        bad_mount = SandboxSpec(image=IMAGE, network="none", mounts=[Mount(source="/nonexistent/hrl", target="/d")])
        with pytest.raises(SandboxError, match="cannot create"):
            await backend.create(bad_mount, rid, "ep")
        with pytest.raises(SandboxError, match="proxy_socket"):
            await backend.create(SandboxSpec(image=IMAGE, network="proxy"), rid, "ep")
        assert containers(rid) == []

    run(main())


# Runs inside the container: the proxy answers through the forwarder; every other address fails, and fast.
PROBE = r"""
import errno, json, socket, sys, time
proxy_port, host_port, other_port, host_ip = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def get(path):
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as s:
        s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.partition(b"\r\n\r\n")[2]

def attempt(address):
    started = time.monotonic()
    try:
        socket.create_connection(address, timeout=5).close()
        return "connected", time.monotonic() - started
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc)), time.monotonic() - started

report = {"interfaces": sorted(name for _, name in socket.if_nameindex())}
try:
    report["hello"] = get("/hello").decode()
    report["big"] = len(get("/big"))
except OSError as exc:
    report["hello"] = errno.errorcode.get(exc.errno, str(exc))
for name, address in {"host_lo": ("127.0.0.1", host_port), "other_lo": ("127.0.0.1", other_port),
                      "host_ip": (host_ip, host_port), "outside": ("1.1.1.1", 80)}.items():
    report[name] = attempt(address)
print(json.dumps(report))
"""


@contextlib.asynccontextmanager
async def host_servers(sock: str) -> AsyncIterator[tuple[int, int, list[str]]]:
    """An HTTP server on the unix socket, and two TCP listeners that record whoever connects."""
    app = web.Application()

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello from the unix socket")

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"x" * (1 << 20))

    app.router.add_get("/hello", hello)
    app.router.add_get("/big", big)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, sock).start()
    seen: list[str] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(str(writer.get_extra_info("peername")))
        writer.close()

    tcp = [await asyncio.start_server(record, "0.0.0.0", 0) for _ in range(2)]
    try:
        yield tcp[0].sockets[0].getsockname()[1], tcp[1].sockets[0].getsockname()[1], seen
    finally:
        for server in tcp:
            server.close()
        await runner.cleanup()


def host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: picks the route, sends nothing
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


@pytest.fixture
def socket_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="hrl-sock-")  # short: unix socket paths are limited to ~107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.docker
def test_docker_proxy_network_reaches_only_the_proxy(socket_dir: str) -> None:
    backend, sock, rid = DockerBackend(), str(Path(socket_dir) / "proxy.sock"), run_id()

    async def main() -> dict[str, dict[str, Any]]:
        async with host_servers(sock) as (host_port, other_port, seen):
            specs = {
                net: SandboxSpec(image=IMAGE, network=net, proxy_socket=sock, proxy_port=8123)
                for net in ("proxy", "none")
            }
            reports = {}
            for net, spec in specs.items():
                async with await backend.create(spec, rid, f"ep-{net}") as sandbox:
                    args = ["python3", "-c", PROBE, "8123", str(host_port), str(other_port), host_ip()]
                    result = await sandbox.exec(args, timeout_s=60)
                    assert result.exit_code == 0, result
                    reports[net] = json.loads(result.stdout)
            assert seen == []  # no connection reached the host's TCP listeners
            return reports

    reports = run(main())
    assert containers(rid) == []
    proxy, none = reports["proxy"], reports["none"]
    assert (proxy["hello"], proxy["big"]) == ("hello from the unix socket", 1 << 20), proxy
    assert none["hello"] == "ECONNREFUSED", none
    for report in (proxy, none):
        assert report["interfaces"] == ["lo"], report
        expected = {
            "host_lo": "ECONNREFUSED",
            "other_lo": "ECONNREFUSED",
            "host_ip": "ENETUNREACH",
            "outside": "ENETUNREACH",
        }
        if host_ip() == "127.0.0.1":  # no outward address on this host
            expected["host_ip"] = "ECONNREFUSED"
        for name, error in expected.items():
            outcome, seconds = report[name]
            assert outcome == error, (name, report)  # refused by the container's own lo, or no route at all
            # at once: under the 1 s a lost SYN waits before its first retransmission, so nothing was sent anywhere
            assert seconds < 1, (name, report)


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------


def is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_gone(pid: int, timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while is_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    return proc.pid


FETCH = """import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/hello", timeout=10).read().decode())"""


@pytest.mark.docker
@pytest.mark.parametrize("backend_name", ["docker", "local"])
def test_a_forwarded_socket_is_reached_at_its_port_and_no_other_port_is(backend_name: str,
                                                                               socket_dir: str) -> None:  # fmt: skip
    """`SandboxSpec.forwards` (an episode's browser endpoint): a host unix socket served as 127.0.0.1:PORT in a
    sandbox with no network (docker, and local under bubblewrap); a port nothing forwards is refused."""
    from hrl.sandboxes.local import bwrap_works

    if backend_name == "local" and not bwrap_works():
        pytest.fail("bubblewrap is needed (.ci/setup.sh installs it)")
    sock, rid = str(Path(socket_dir) / "cdp.sock"), run_id()
    backend = DockerBackend() if backend_name == "docker" else LocalBackend()
    spec = SandboxSpec(image=IMAGE, network="none", forwards={9333: sock})

    async def main() -> tuple[Any, Any]:
        async with host_servers(sock), await backend.create(spec, rid, "ep-fwd") as sandbox:
            python = "python3" if backend_name == "docker" else sys.executable
            fetched = await sandbox.exec([python, "-c", FETCH, "9333"], timeout_s=60)
            other = await sandbox.exec([python, "-c", FETCH, "9334"], timeout_s=60)  # nothing else forwarded
            return fetched, other

    fetched, other = run(main())
    assert (fetched.exit_code, fetched.stdout.strip()) == (0, "hello from the unix socket"), fetched
    assert other.exit_code != 0 and "Connection refused" in other.stderr, other
    assert containers(rid) == []
