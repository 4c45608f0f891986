"""Docker sandboxes: one long-running container per episode (`sleep infinity` under docker-init), commands run
with `docker exec`, files move as in-memory tar archives, and the container is force-removed on close.

Every container carries the labels `hrl=1`, `hrl.run=<run id>`, `hrl.episode=<episode id>`, so `prune` can remove
what a crashed run left. Network: `none` and `proxy` containers get `network_mode=none` (only `lo`); `proxy` adds a
read-only bind mount of the proxy socket's directory at /run/hrl and a relay from 127.0.0.1:proxy_port to that
socket (`hrl.sandboxes.forward`), run as root so that it may open a socket only its owner may (0600). `host` shares
the host's network (installs only: no isolation).

What a container holds: its image, spec.env (nothing of the host's environment), spec.mounts, and the proxy
socket's directory; nothing else of the host's files. Commands run as the image's user (root in hrl's images).

The Docker SDK is synchronous: API calls run on this backend's own thread pool, and each running exec's output is
read on a thread of its own, so long commands never starve the calls that time them out, nor asyncio's executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import io
import os
import posixpath
import re
import socket
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
from docker.types import Mount as DockerMount
from docker.utils.socket import frames_iter

from hrl.sandboxes.base import ExecResult, Sandbox, SandboxBackend, SandboxError, SandboxSpec, SandboxUnavailableError
from hrl.sandboxes.forward import FORWARDER, FORWARDER_PATH, KILL_TREE, TUNNEL, TUNNEL_PATH

__all__ = ["DockerBackend", "DockerSandbox"]

T = TypeVar("T")
PROXY_DIR = "/run/hrl"
FORWARDS_DIR = "/run/hrl-forwards"  # spec.forwards: each socket's folder at FORWARDS_DIR/<port>
EXPOSES_DIR = "/run/hrl-exposes"  # spec.exposes: each socket's folder at EXPOSES_DIR/<port>
EXEC_MARK = "HRL_EXEC"  # set on every exec; KILL_TREE finds a command's whole tree by it
KILL_GRACE_S = 10.0  # after a timeout kill, how long to wait for the output stream to close
BUILD_HINT = "build the base image with `hrl sandbox build` (or .ci/setup.sh); there is no registry to pull from"
PULL_HINT = (
    "pull or `docker load` it on this machine, or set `verifier.image_registry: HOST:PORT` to take the images "
    "from a local registry; the task is not trained on until its image is here"
)
DAEMON_HINT = "start dockerd (see .ci/setup.sh), or use `--sandbox local` for development"


class DockerBackend(SandboxBackend):
    """Creates `DockerSandbox`es. `api_timeout_s` bounds every Docker API call except an exec's output stream,
    which `exec(timeout_s=...)` bounds; `max_output_bytes` caps what is kept of each of stdout and stderr."""

    name = "docker"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_timeout_s: float = 60.0,
        max_workers: int = 16,
        max_output_bytes: int = 16 << 20,
        pids_limit: int = 0,
        pull_timeout_s: float = 1800.0,
    ) -> None:
        self.base_url = base_url
        self.pull_timeout_s = pull_timeout_s
        self.api_timeout_s = api_timeout_s
        self.max_output_bytes = max_output_bytes
        self.pids_limit = pids_limit
        self._max_workers = max_workers
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="hrl-docker")
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()
        self._pulls: dict[str, asyncio.Lock] = {}

    @property
    def api(self) -> docker.APIClient:
        with self._lock:
            if self._client is None:
                host = {"DOCKER_HOST": self.base_url} if self.base_url else None  # None: $DOCKER_HOST or the default
                try:
                    self._client = docker.from_env(
                        environment=host, timeout=int(self.api_timeout_s), max_pool_size=self._max_workers
                    )
                except docker.errors.DockerException as exc:
                    raise SandboxUnavailableError(f"cannot reach the Docker daemon: {exc}", hint=DAEMON_HINT) from exc
            return self._client.api

    async def connect(self) -> docker.APIClient:
        """The API client, connecting on first use (off the event loop: the client asks the daemon's version)."""
        return self._client.api if self._client is not None else await self.call(lambda: self.api)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking Docker SDK call on this backend's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def create(self, spec: SandboxSpec, run_id: str, episode_id: str) -> DockerSandbox:
        api = await self.connect()
        if spec.pull:
            await self.ensure_image(spec.image, spec.registry)
        config = self._container_config(spec, run_id, episode_id)
        creating = asyncio.ensure_future(self.call(api.create_container, **config))
        try:
            created = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # the daemon goes on creating it: wait for its id and remove it, or a Ctrl-C here leaks a container
            with contextlib.suppress(Exception):
                made = await creating
                await self.call(api.remove_container, made["Id"], force=True, v=True)
            raise
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailableError(f"Docker image {spec.image!r} not found", hint=BUILD_HINT) from exc
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot create a container from {spec.image!r}: {_explain(exc)}") from exc
        sandbox = DockerSandbox(self, created["Id"], spec)
        try:
            await self.call(api.start, sandbox.id)
            if spec.network == "proxy":
                await sandbox.start_forwarder()
            if spec.network != "host":
                for port, path in spec.forwards.items():
                    await sandbox.start_forwarder(f"{FORWARDS_DIR}/{port}/{Path(path).name}", port)
                for port, path in spec.exposes.items():
                    await sandbox.start_forwarder(f"{EXPOSES_DIR}/{port}/{Path(path).name}", port, tunnel=True)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await sandbox.close()
            if isinstance(exc, docker.errors.DockerException):
                raise SandboxError(f"cannot start a container from {spec.image!r}: {_explain(exc)}") from exc
            raise
        return sandbox

    async def ensure_image(self, image: str, registry: str = "") -> None:
        """Pull `image` (from `registry` when given) unless it is present; one pull per image at a time (episodes
        of one instance share it). Raises SandboxUnavailableError naming the image when it can be neither found
        nor pulled."""
        lock = self._pulls.setdefault(image, asyncio.Lock())
        async with lock:
            api = await self.connect()
            try:
                await self.call(api.inspect_image, image)
                return
            except docker.errors.ImageNotFound:
                pass
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot inspect the Docker image {image!r}: {_explain(exc)}") from exc
            try:
                await self.call(self._pull, image, registry)
            except docker.errors.DockerException as exc:
                where = f" from {registry}" if registry else ""
                raise SandboxUnavailableError(
                    f"Docker image {image!r} is not here and cannot be pulled{where}: {_explain(exc)}", hint=PULL_HINT
                ) from exc

    async def image_digest(self, image: str) -> str | None:
        """The image's ID as Docker reports it (`sha256:…`, the digest of its configuration, which names its layers):
        what a tag such as `:latest` stood for when the episode ran. None when the image is not here."""
        api = await self.connect()
        try:
            info = await self.call(api.inspect_image, image)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot inspect the Docker image {image!r}: {_explain(exc)}") from exc
        return str(info.get("Id") or "") or None

    def _pull(self, image: str, registry: str) -> None:
        """Pull with a client whose calls may last as long as a large image's pull (the backend's own times out in
        a minute); the daemon reports some failures only inside the stream, so the image is looked up after."""
        host = {"DOCKER_HOST": self.base_url} if self.base_url else None
        client = docker.from_env(environment=host, timeout=int(self.pull_timeout_s))
        try:
            source = f"{registry.rstrip('/')}/{image}" if registry else image
            repository, tag = _split_tag(source)
            last = ""
            for event in client.api.pull(repository, tag=tag or None, stream=True, decode=True):
                last = str(event.get("error") or last)
            if registry:
                client.api.tag(source, *_split_tag(image))
            try:
                client.api.inspect_image(image)
            except docker.errors.ImageNotFound as exc:
                raise docker.errors.DockerException(last or "the pull finished without the image") from exc
        finally:
            client.close()

    def _container_config(self, spec: SandboxSpec, run_id: str, episode_id: str) -> dict[str, Any]:
        mounts = [
            DockerMount(m.target, str(Path(m.source).absolute()), type="bind", read_only=m.read_only)
            for m in spec.mounts
        ]
        if spec.network == "proxy":
            if not spec.proxy_socket:
                raise SandboxError("network='proxy' needs spec.proxy_socket (the proxy's unix socket path)")
            socket_dir = Path(spec.proxy_socket).absolute().parent
            if not socket_dir.is_dir():
                raise SandboxError(f"the proxy socket's directory {socket_dir} does not exist")
            mounts.append(DockerMount(PROXY_DIR, str(socket_dir), type="bind", read_only=True))
        for where, pairs in ((FORWARDS_DIR, spec.forwards), (EXPOSES_DIR, spec.exposes)):
            for port, path in pairs.items():
                if not Path(path).absolute().parent.is_dir():
                    raise SandboxError(f"the folder of socket {path} (port {port}) does not exist")
                mounts.append(DockerMount(f"{where}/{port}", str(Path(path).absolute().parent), type="bind",
                                          read_only=True))  # fmt: skip
        host_config = self.api.create_host_config(
            init=True,
            mounts=mounts,
            network_mode="host" if spec.network == "host" else "none",
            nano_cpus=int(spec.cpus * 1e9) if spec.cpus > 0 else None,
            mem_limit=f"{spec.memory_mb}m" if spec.memory_mb > 0 else None,
            pids_limit=self.pids_limit or None,
        )
        labels = {**spec.labels, "hrl": "1", "hrl.run": run_id, "hrl.episode": episode_id}
        return {
            "image": spec.image,
            "entrypoint": ["sleep", "infinity"],
            "name": _container_name(run_id, episode_id),
            "labels": labels,
            "environment": spec.env,
            "working_dir": spec.workdir,
            "host_config": host_config,
        }

    async def remove_image(self, image: str) -> None:
        """Remove an image (one `DockerSandbox.commit` made); a missing one is no error."""
        api = await self.connect()
        with contextlib.suppress(docker.errors.NotFound):
            try:
                await self.call(api.remove_image, image, force=True)
            except docker.errors.APIError as exc:
                raise SandboxError(f"cannot remove image {image[:19]}: {_explain(exc)}") from exc

    async def prune(self, run_id: str | None = None) -> int:
        api = await self.connect()
        labels = ["hrl=1"] + ([f"hrl.run={run_id}"] if run_id is not None else [])
        containers = await self.call(api.containers, all=True, filters={"label": labels})
        removed = 0
        for container in containers:
            with contextlib.suppress(docker.errors.NotFound):
                await self.call(api.remove_container, container["Id"], force=True, v=True)
                removed += 1
        return removed

    async def prune_images(self, label: str, run_id: str | None = None) -> int:
        """Remove the images labelled `label` (`key=value`), of `run_id` only when given; how many."""
        api = await self.connect()
        labels = [label] + ([f"hrl.run={run_id}"] if run_id is not None else [])
        images = await self.call(api.images, filters={"label": labels})
        removed = 0
        for image in images:
            with contextlib.suppress(docker.errors.NotFound):
                await self.call(api.remove_image, image["Id"], force=True)
                removed += 1
        return removed


class DockerSandbox(Sandbox):
    """A running container. Use as `async with await backend.create(...) as sandbox:`."""

    def __init__(self, backend: DockerBackend, container_id: str, spec: SandboxSpec) -> None:
        self.backend = backend
        self.id = container_id
        self.spec = spec
        self.workdir = spec.workdir
        self._closed = False
        self._background: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> DockerSandbox:
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            await self.close()
        except SandboxError as cleanup:
            if exc is None:
                raise
            exc.add_note(f"also: {cleanup}")  # do not hide the error that is already propagating

    def path(self, path: str) -> str:
        """An absolute path inside the container (relative paths are relative to the workdir)."""
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout_s: float = 0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str = "",
    ) -> ExecResult:
        """`Sandbox.exec`; `user` (docker only): run as this user instead of the image's."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        token = uuid.uuid4().hex
        api, started = self._api(), time.monotonic()
        environment, cwd = {**(env or {}), EXEC_MARK: token}, self.path(workdir or self.workdir)
        try:
            made = await self.backend.call(
                api.exec_create, self.id, argv, environment=environment, workdir=cwd, user=user
            )
            exec_id = made["Id"]
            sock = await self.backend.call(api.exec_start, exec_id, socket=True)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot exec in container {self.id[:12]}: {_explain(exc)}") from exc
        reader = _drain_in_thread(sock, self.backend.max_output_bytes)
        timed_out = False
        try:
            if timeout_s > 0:
                done, _ = await asyncio.wait({reader}, timeout=timeout_s)
                if not done:
                    timed_out = True
                    await self._kill(token)
                    done, _ = await asyncio.wait({reader}, timeout=KILL_GRACE_S)
                    if not done:  # something escaped the kill and holds the stream: stop reading
                        _shutdown(sock)
            stdout, stderr, dropped = await reader
        except asyncio.CancelledError:
            _shutdown(sock)
            self._spawn(self._kill(token))
            raise
        exit_code = -1 if timed_out else await self._exit_code(exec_id)
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            extra={"truncated_bytes": dropped} if any(dropped.values()) else {},
        )

    async def _exit_code(self, exec_id: str) -> int:
        for _ in range(250):  # the stream can close a moment before docker records the exit code
            try:
                info = await self.backend.call(self._api().exec_inspect, exec_id)
            except docker.errors.DockerException as exc:
                raise SandboxError(f"lost the exec in container {self.id[:12]}: {_explain(exc)}") from exc
            if not info["Running"] and info["ExitCode"] is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(0.02)
        return -1

    async def _kill(self, token: str) -> None:
        """SIGKILL every process of one exec (found by its EXEC_MARK), including those that left its group."""
        api, argv = self._api(), ["sh", "-c", KILL_TREE, "_", EXEC_MARK, token]
        with contextlib.suppress(docker.errors.DockerException):
            await self.backend.call(api.exec_start, (await self.backend.call(api.exec_create, self.id, argv))["Id"])

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = self.path(path)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(target.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        await self._put_archive(buffer.getvalue(), target)

    async def read_file(self, path: str) -> bytes:
        target = self.path(path)
        for _ in range(8):  # follow symlinks: the archive holds the link itself
            try:
                chunks, _stat = await self.backend.call(self._api().get_archive, self.id, target)
                archive = await self.backend.call(b"".join, chunks)
            except docker.errors.NotFound as exc:
                raise FileNotFoundError(f"{target} (in container {self.id[:12]})") from exc
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot read {target} in container {self.id[:12]}: {_explain(exc)}") from exc
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                member = tar.next()
                if member is not None and member.issym():
                    target = posixpath.normpath(posixpath.join(posixpath.dirname(target), member.linkname))
                    continue
                if member is None or not member.isfile():
                    raise IsADirectoryError(f"{target} is not a regular file (in container {self.id[:12]})")
                extracted = tar.extractfile(member)
                assert extracted is not None
                return extracted.read()
        raise SandboxError(f"too many levels of symbolic links at {self.path(path)}")

    async def copy_in(self, host_dir: str, target: str) -> None:
        destination = self.path(target)
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as buffer:
            await asyncio.to_thread(_tar_directory, host_dir, destination.lstrip("/") or ".", buffer)
            buffer.seek(0)
            await self._put_archive(buffer, destination)

    async def _put_archive(self, data: Any, target: str) -> None:
        # Extract at "/" with full member paths: Docker creates missing parent directories that way.
        try:
            await self.backend.call(self._api().put_archive, self.id, "/", data)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot write {target} in container {self.id[:12]}: {_explain(exc)}") from exc

    async def commit(self, labels: dict[str, str] | None = None) -> str:
        """Snapshot this container's filesystem as a new untagged image; its id. A container made from it starts
        where this one stands (files, not processes). The image keeps its parent image's environment: variables
        this sandbox's spec added (an agent's endpoint and key) stay only as names with empty values."""
        api = self._api()
        try:
            info = await self.backend.call(api.inspect_container, self.id)
            parent = ((await self.backend.call(api.inspect_image, info["Image"])).get("Config") or {}).get("Env") or []
            names = {e.split("=", 1)[0] for e in parent}
            added = {e.split("=", 1)[0] for e in info["Config"].get("Env") or []} - names
            conf = {"Env": [*parent, *(f"{name}=" for name in sorted(added))], "Labels": {"hrl": "1", **(labels or {})}}
            made = await self.backend.call(api.commit, self.id, conf=conf)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot commit container {self.id[:12]}: {_explain(exc)}") from exc
        return str(made["Id"])

    # What the daemon sees of the container, which no process in it can hide or forge (the reuse check's ground).

    async def processes(self) -> list[str]:
        """Every process of the container as `docker top` lists it: "host-pid start-time", sorted (the pid alone where
        the daemon's host has no `ps -o lstart`: busybox)."""
        try:
            info = await self.backend.call(self._api().top, self.id, ps_args="-o pid,lstart")
        except docker.errors.APIError:
            info = await self._inspect(self._api().top, "list the processes of")
            titles = list(info.get("Titles") or [])
            pid = titles.index("PID") if "PID" in titles else 1
            return sorted(str(row[pid]) for row in info.get("Processes") or [])
        return sorted(" ".join(str(c) for c in row) for row in info.get("Processes") or [])

    async def changes(self) -> list[str]:
        """Every path of the container's filesystem added, changed or deleted since its image (`docker diff`), sorted.
        Mounts are not in it: `writable_mounts`."""
        return sorted(str(c["Path"]) for c in await self._inspect(self._api().diff, "diff") or [])

    async def writable_mounts(self) -> list[str]:
        """Where a writable mount lies in the container (a bind, a volume, the image's VOLUMEs): outside `changes`."""
        info = await self._inspect(self._api().inspect_container, "inspect")
        return sorted(str(m["Destination"]) for m in info.get("Mounts") or [] if m.get("RW"))

    async def _inspect(self, call: Callable[..., Any], what: str, **kwargs: Any) -> Any:
        try:
            return await self.backend.call(call, self.id, **kwargs)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot {what} container {self.id[:12]}: {_explain(exc)}") from exc

    async def start_forwarder(self, inside: str = "", port: int = 0, tunnel: bool = False) -> None:
        """Relay 127.0.0.1:`port` in the container to the unix socket `inside` (default: the proxy's); `tunnel`: the
        other way, connections hrl starts on `inside` to 127.0.0.1:`port` (spec.exposes)."""
        if not inside:
            assert self.spec.proxy_socket
            inside, port = f"{PROXY_DIR}/{Path(self.spec.proxy_socket).name}", self.spec.proxy_port
        path, script = (TUNNEL_PATH, TUNNEL) if tunnel else (FORWARDER_PATH, FORWARDER)
        await self.write_file(path, script.encode())
        # as root: the proxy's socket is its owner's only (0600), and root in the container may open it whatever
        # user the image's agent runs as
        result = await self.exec(["python3", path, inside, str(port)], timeout_s=30, user="0")
        if result.exit_code != 0:
            raise SandboxError(
                f"the {'tunnel' if tunnel else 'forwarder'} to {inside} did not start in container {self.id[:12]} "
                f"(exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-500:]}",
                hint="network='proxy', spec.forwards and spec.exposes need python3 in the image and a free port",
            )

    async def close(self) -> None:
        if self._closed:
            return
        for task in self._background:
            task.cancel()
        try:
            await self.backend.call(self.backend.api.remove_container, self.id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise SandboxError(f"cannot remove container {self.id[:12]}: {_explain(exc)}") from exc
        self._closed = True

    def _api(self) -> docker.APIClient:
        if self._closed:
            raise SandboxError(f"sandbox {self.id[:12]} is closed")
        return self.backend.api


Output = tuple[bytes, bytes, dict[str, int]]


def _drain_in_thread(sock: Any, cap: int) -> asyncio.Future[Output]:
    """Read an exec's output on a thread of its own: a long command must not hold a pool thread that the calls
    which time it out or kill it need."""
    future: concurrent.futures.Future[Output] = concurrent.futures.Future()

    def work() -> None:
        try:
            result = _drain(sock, cap)
        except BaseException as exc:  # delivered to the awaiting coroutine
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(exc)
            return
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled: nobody awaits it any more
            future.set_result(result)

    threading.Thread(target=work, name="hrl-docker-exec", daemon=True).start()
    return asyncio.wrap_future(future)


def _drain(sock: Any, cap: int) -> Output:
    """Read an exec's multiplexed output stream until it closes (blocking)."""
    kept = {1: bytearray(), 2: bytearray()}
    dropped = {1: 0, 2: 0}
    try:
        for stream, data in frames_iter(sock, tty=False):
            if stream in kept:
                room = max(cap - len(kept[stream]), 0)
                kept[stream] += data[:room]
                dropped[stream] += max(len(data) - room, 0)
    except OSError:
        pass  # shut down by exec() after a timeout, or the container went away
    finally:
        _close_stream(sock)
    return bytes(kept[1]), bytes(kept[2]), {"stdout": dropped[1], "stderr": dropped[2]}


def _close_stream(sock: Any) -> None:
    """Close an exec stream and the HTTP connection under it (docker-py keeps the response on the socket object;
    closing the socket object alone leaks the descriptor)."""
    with contextlib.suppress(Exception):  # AttributeError: a socket without its response
        sock._response.close()
    with contextlib.suppress(OSError):
        sock.close()


def _shutdown(sock: Any) -> None:
    """Unblock a thread reading `sock` (shutdown on a duplicate descriptor of the same connection)."""
    with contextlib.suppress(OSError, ValueError), socket.socket(fileno=os.dup(sock.fileno())) as dup:
        dup.shutdown(socket.SHUT_RDWR)


def _tar_directory(host_dir: str, arcname: str, out: Any) -> None:
    if not Path(host_dir).is_dir():
        raise SandboxError(f"copy_in: {host_dir} is not a directory")
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.add(host_dir, arcname=arcname)


def _container_name(run_id: str, episode_id: str) -> str:
    def clean(text: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.")[:40] or "x"

    return f"hrl-{clean(run_id)}-{clean(episode_id)}-{uuid.uuid4().hex[:6]}"


def _explain(exc: BaseException) -> str:
    return str(exc.explanation or exc) if isinstance(exc, docker.errors.APIError) else str(exc)


def _split_tag(image: str) -> tuple[str, str]:
    """'host:5000/name:tag' → ('host:5000/name', 'tag'); no tag → 'latest'; a digest stays in the repository."""
    if "@" in image:
        return image, ""
    name, sep, tag = image.rpartition(":")
    if sep and "/" not in tag:
        return name, tag
    return image, "latest"
