"""Local sandboxes, for development: a temporary directory per episode and plain subprocesses. No isolation:
`local` is a sandbox for trusted agents; `docker` is the one that isolates (docs/security.md).

- Files: `spec.workdir` is `<root>/work` on the host, and paths under it, given to `exec(workdir=)`,
  `read_file`, `write_file` and `copy_in`, are translated (relative paths are relative to the workdir). A mount's
  target is translated to its host source the same way, and a mount whose target lies under the workdir also
  appears there as a symlink; `read_only` is not enforced. Other absolute paths are the host's own paths.
  Environment values (spec.env, exec env) that are such paths are translated too. Command lines are not: commands
  run with the workdir as their current directory and should use relative paths.
- Environment: not the host's. Commands get an allowlist of host variables (HOST_ENV: PATH, locale, TERM, TZ,
  TMPDIR, USER, SHELL, the CA-bundle paths; plus the backend's `env_passthrough`, default from
  $HRL_SANDBOX_ENV_PASSTHROUGH, comma-separated names or globs), HOME set to the sandbox's own empty `<root>/home`,
  then spec.env and the exec's env. So cloud keys and tokens in the host's environment never reach an agent.
- Commands run in their own session (process group); a timeout kills the group and every process that still
  carries the sandbox's marks in its environment (Linux /proc).
- Files out of sight: where bubblewrap is installed (`bwrap`; $HRL_LOCAL_ISOLATION=0 turns it off; where it is
  installed but cannot set a namespace up, a local sandbox is refused: `isolation`), every command runs in
  its own mount and pid namespace, without capabilities, with the host's files read-only (the sandbox root and
  non-read-only mounts excepted), a minimal /dev and an empty /run (no docker socket). `spec.hidden_paths` (the task files with hidden tests and gold patches, the
  run directory: `hrl rollout` / `hrl train` fill them in) are emptied, every other sandbox under the same root
  (grading folders) is out of sight, the temp folder is the sandbox's own `<root>/tmp`, hrl's processes (whose
  memory holds the tasks) are invisible, and whatever a command leaves running ends with it.
- What is not enforced: the agent runs as the host user and sees the rest of the host's files as they are
  (~/.aws and other credential files included); without bubblewrap it sees everything, the task files too. Use
  docker for agents you do not trust.
- Network, where bubblewrap runs: `none` and `proxy` run each command in its own network namespace, holding only
  a loopback interface: no host port (the engine's, Ray's, any local service's), no abstract unix socket, no
  outside address. With `proxy` and a `proxy_socket`, the same relay the docker backend uses (forward.py) listens
  on 127.0.0.1:`proxy_port` inside that namespace and carries each connection to the proxy's unix socket: the
  proxy's data plane is the one thing the command reaches. `spec.exposes` runs the tunnel (forward.py) in that
  namespace too: hrl reaches the port a long-running command listens on there (an episode's browser). `host` keeps
  the host's network (installs). Without bubblewrap nothing is isolated and every mode is the host's network.
- Control tokens: hrl's state folder ($HRL_STATE_DIR, default ~/.local/state/hrl, where `hrl serve` writes its
  control token) is emptied in the namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hrl.sandboxes.base import ExecResult, Sandbox, SandboxBackend, SandboxError, SandboxSpec, SandboxUnavailableError
from hrl.sandboxes.forward import FORWARDER, TUNNEL
from hrl.sandboxes.hidden import hidden_paths, state_dir

__all__ = [
    "HOST_ENV",
    "PASSTHROUGH_VAR",
    "LocalBackend",
    "LocalSandbox",
    "bwrap_works",
    "host_env",
    "isolation",
    "kill_marked",
    "list_sandboxes",
    "pid_alive",
]

PREFIX = "hrl-sbx-"
MARKER = ".hrl-sandbox.json"
SANDBOX_MARK = "HRL_SANDBOX"  # on every command of a sandbox: close() kills what is left by it
EXEC_MARK = "HRL_EXEC"  # on one command's tree: its timeout kills by it
KILL_GRACE_S = 5.0
# Host variables a command sees (names or fnmatch globs): what programs need to run, nothing that authenticates.
HOST_ENV = ("PATH", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL",
            "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")  # fmt: skip
PASSTHROUGH_VAR = "HRL_SANDBOX_ENV_PASSTHROUGH"  # more host variables for local sandboxes: "NAME,PREFIX_*"
ISOLATION_VAR = "HRL_LOCAL_ISOLATION"  # "0": run local sandbox commands without bwrap (a trusted agent only)


BWRAP_ABSENT = "bubblewrap is not installed (no `bwrap` on PATH)"
_bwrap_ok = False  # set once a probe passed: a namespace this process could set up once it can always set up


def bwrap_probe() -> str | None:
    """None where bubblewrap sets up a mount and pid namespace here; else why not (`BWRAP_ABSENT`, or bwrap's own
    error). A pass is kept for the process; a failure is not (three tries, half a second apart, each time): one
    probe failing on a loaded machine must neither open nor close every later sandbox of the process."""
    global _bwrap_ok
    if _bwrap_ok:
        return None
    if shutil.which("bwrap") is None:
        return BWRAP_ABSENT
    probe = ["bwrap", "--bind", "/", "/", "--unshare-pid", "--proc", "/proc", "--die-with-parent", "true"]
    why = "bwrap did not answer"
    for attempt in range(3):
        if attempt:
            time.sleep(0.5)
        try:
            out = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            why = f"{type(e).__name__}: {e}"
            continue
        if out.returncode == 0:
            _bwrap_ok = True
            return None
        why = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
    return why


def bwrap_works() -> bool:
    """Can this machine run commands in a bubblewrap mount and pid namespace? (`bwrap_probe`.)"""
    return bwrap_probe() is None


def isolation() -> bool:
    """Whether local sandboxes run their commands under bubblewrap: True where it sets up a namespace; False where
    $HRL_LOCAL_ISOLATION=0 opts out, or where bubblewrap is not installed (the documented warning path). Fails
    closed: where bubblewrap is installed but cannot set a namespace up (user namespaces off, a seccomp or
    AppArmor policy), raises SandboxUnavailableError (exit 4) instead of running the agent unisolated."""
    if os.environ.get(ISOLATION_VAR, "1") == "0":
        return False
    why = bwrap_probe()
    if why is None or why == BWRAP_ABSENT:
        return why is None
    raise SandboxUnavailableError(
        f"bubblewrap is installed but cannot set up a sandbox here ({why}): a local sandbox would not be isolated",
        hint="allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu "
        "kernel.apparmor_restrict_unprivileged_userns=0), or opt out for a trusted agent with "
        f"{ISOLATION_VAR}=0, or use --sandbox docker",
    )


class LocalBackend(SandboxBackend):
    """Creates `LocalSandbox`es under `root` (default: the system temp directory). `env_passthrough`: host
    variables (names or globs) commands see besides HOST_ENV; None = those named by $HRL_SANDBOX_ENV_PASSTHROUGH."""

    name = "local"

    def __init__(
        self,
        *,
        root: str | None = None,
        max_output_bytes: int = 16 << 20,
        env_passthrough: Sequence[str] | None = None,
        isolate: bool | None = None,
    ) -> None:
        self.root = root or tempfile.gettempdir()
        if isolate is None:  # default: isolate wherever bubblewrap is installed (refused where it cannot set up)
            isolate = isolation()
        self.isolate = isolate
        self.max_output_bytes = max_output_bytes
        if env_passthrough is None:
            env_passthrough = re.split(r"[,\s]+", os.environ.get(PASSTHROUGH_VAR, "").strip())
        self.env_allow = (*HOST_ENV, *(p for p in env_passthrough if p))

    async def create(self, spec: SandboxSpec, run_id: str, episode_id: str) -> LocalSandbox:
        if spec.exposes and not (self.isolate and spec.network != "host"):
            raise SandboxError(
                f"a local sandbox exposes ports to hrl (spec.exposes {sorted(spec.exposes)}) only in a network "
                "namespace of its own, where bubblewrap runs",
                hint="install bubblewrap, or use --sandbox docker",
            )
        # The thread makes the folder even if this task is cancelled meanwhile (a run ending with episodes still
        # starting): then it is removed here, since no sandbox object will ever close it.
        making = asyncio.ensure_future(asyncio.to_thread(_make_root, Path(self.root), run_id, episode_id))
        try:
            root = await asyncio.shield(making)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(shutil.rmtree, await making, True)
            raise
        sandbox = LocalSandbox(self, root, spec)
        try:
            await asyncio.to_thread(_lay_out, root, spec)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    def private_roots(self) -> list[Path]:
        """The host folders a command under bubblewrap does not see as they are: the temp folders (/tmp and
        $TMPDIR, each sandbox's own) and the sandboxes' parent folder (emptied). A host path under one reaches a
        command only as a mount; none at all where the backend does not isolate."""
        if not self.isolate:
            return []
        return sorted({Path(d) for d in _temp_dirs()} | {Path(self.root).absolute()}, key=lambda p: len(p.parts))

    async def image_digest(self, image: str) -> str | None:
        """None: a local sandbox runs on this machine, from no image."""
        return None

    async def prune(self, run_id: str | None = None) -> int:
        """Remove sandbox directories of `run_id`, or (None) those whose creating process is gone."""
        removed = 0
        for path, info in await asyncio.to_thread(_find_roots, Path(self.root)):
            if run_id is not None and info.get("run_id") != run_id:
                continue
            if run_id is None and pid_alive(int(info.get("pid", 0))):
                continue
            await asyncio.to_thread(kill_marked, SANDBOX_MARK, path.name)
            await asyncio.to_thread(_remove_root, path)
            removed += 1
        return removed


class LocalSandbox(Sandbox):
    def __init__(self, backend: LocalBackend, root: Path, spec: SandboxSpec) -> None:
        self.backend = backend
        self.root = root
        self.id = root.name
        self.spec = spec
        self.workdir = spec.workdir
        self._groups: set[int] = set()
        self._closed = False
        # hrl's cache and Python where a temp folder holds them: bound back read-only (checked once, not per exec)
        self._own = _hrl_own_folders(Path(backend.root).absolute()) if backend.isolate else []
        # Longest container prefix first: mount targets, then the workdir.
        table = [(posixpath.normpath(m.target), str(Path(m.source).absolute())) for m in spec.mounts]
        table.append((posixpath.normpath(spec.workdir), str(root / "work")))
        if (
            backend.isolate
        ):  # the temp folders are the sandbox's own (<root>/tmp); the root's own paths stay as they are
            table += [(d, str(root / "tmp")) for d in _temp_dirs()] + [(str(root), str(root))]
            table += [(f, f) for f in self._own]  # bound back where they are
        self._table = sorted(table, key=lambda row: len(row[0]), reverse=True)

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            await self.close()
        except SandboxError as cleanup:
            if exc is None:
                raise
            exc.add_note(f"also: {cleanup}")  # do not hide the error that is already propagating

    def host_path(self, path: str) -> str:
        """The host path for a sandbox path (relative paths are relative to the workdir)."""
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        return self._translate(full) or full

    def _translate(self, full: str) -> str | None:
        for inside, outside in self._table:
            if full == inside:
                return outside
            if full.startswith(inside.rstrip("/") + "/"):
                return str(Path(outside) / posixpath.relpath(full, inside))
        return None

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        return {k: self._translate(posixpath.normpath(v)) or v if v.startswith("/") else v for k, v in extra.items()}

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout_s: float = 0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        self._check_open()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        token = uuid.uuid4().hex
        marks = {SANDBOX_MARK: self.id, EXEC_MARK: token}
        home = {"HOME": str(self.root / "home")}
        full_env = {**host_env(self.backend.env_allow), **home, **self._env(self.spec.env), **self._env(env or {})}
        full_env.update(marks)
        cwd = self.host_path(workdir or self.workdir)
        if self.backend.isolate:
            if "/" not in argv[0] and shutil.which(argv[0], path=full_env.get("PATH")) is None:
                return ExecResult(127, "", f"{argv[0]}: command not found\n")  # as without bwrap
            # the mark says bwrap set the namespace up and started the command (a failed set-up is run again)
            mark = self.root / f".hrl-started-{token}"
            started = ["sh", "-c", ': > "$0" && exec "$@"', str(mark)]
            argv = [*self._bwrap(cwd), *started, *self._relay(), *argv]
        for attempt in range(1, BWRAP_TRIES + 1):
            result = await self._run(argv, cwd, full_env, token, timeout_s)
            if not self.backend.isolate:
                return result
            ran = mark.exists()
            mark.unlink(missing_ok=True)
            if ran or not _bwrap_setup_failed(result) or attempt == BWRAP_TRIES:
                return result
            await asyncio.sleep(0.1 * attempt)  # bwrap failed before the command ran: run it again
        raise AssertionError("unreachable")

    async def _run(self, argv: list[str], cwd: str, full_env: dict[str, str], token: str,
                   timeout_s: float) -> ExecResult:  # fmt: skip
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=full_env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:  # like a shell: a missing program or directory is exit 127, not an exception
            return ExecResult(127, "", f"{exc}\n", duration_s=time.monotonic() - started)
        self._groups.add(proc.pid)
        cap = self.backend.max_output_bytes
        out, err, dropped = bytearray(), bytearray(), {"stdout": 0, "stderr": 0}
        assert proc.stdout is not None
        assert proc.stderr is not None
        waiter = asyncio.ensure_future(
            asyncio.gather(
                _pump(proc.stdout, out, cap, dropped, "stdout"),
                _pump(proc.stderr, err, cap, dropped, "stderr"),
                proc.wait(),
            )
        )
        # shutdown cancels the readers before this task: the group is then done with their CancelledError, which
        # nobody would retrieve (asyncio logs one traceback per exec); the result comes from the buffers, not the group
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
        timed_out = False
        try:
            done, _ = await asyncio.wait({waiter}, timeout=timeout_s if timeout_s > 0 else None)
            if not done:
                timed_out = True
                await asyncio.to_thread(self._kill, proc.pid, token)
                done, _ = await asyncio.wait({waiter}, timeout=KILL_GRACE_S)
                if not done:  # something escaped and holds the pipes: keep what was read
                    waiter.cancel()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
        except asyncio.CancelledError:
            self._kill(proc.pid, token)
            waiter.cancel()
            raise
        if not _group_alive(proc.pid):
            self._groups.discard(proc.pid)
        code = proc.returncode if proc.returncode is not None and not timed_out else None
        return ExecResult(  # killed by signal N: 128+N, as a shell or docker says
            exit_code=-1 if code is None else 128 - code if code < 0 else code,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            extra={"truncated_bytes": dropped} if any(dropped.values()) else {},
        )

    def _bwrap(self, cwd: str) -> list[str]:
        """The command prefix that runs a command in its own mount and pid namespace, with no capabilities (root
        cannot remount), a minimal /dev, no /run (no docker or other daemon sockets), and the host's files
        read-only, except the sandboxes' parent folder (other episodes, grading folders with hidden tests: an empty
        tmpfs, with this sandbox and the mounts' sources bound back), the temp folder (the sandbox's own
        `<root>/tmp`, where paths under it are translated to) and `spec.hidden_paths` (emptied). The pid
        namespace hides hrl's own processes (their memory holds the tasks) and ends whatever the command leaves
        running when it exits; --die-with-parent ends it with hrl."""
        args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--proc", "/proc",
                "--ro-bind", "/proc/sys", "/proc/sys", "--tmpfs", "/run", "--cap-drop", "ALL", "--die-with-parent",
                "--tmpfs", str(Path(self.backend.root).absolute())]  # fmt: skip
        for temp in _temp_dirs():  # a private temp folder (/tmp and $TMPDIR), kept across this sandbox's execs
            args += ["--bind", str(self.root / "tmp"), temp]
        args += ["--bind", str(self.root), str(self.root)]
        for folder in self._own:  # a cache or venv under /tmp, read-only
            args += ["--ro-bind", folder, folder]
        for m in self.spec.mounts:
            source = str(Path(m.source).absolute())
            args += ["--ro-bind-try" if m.read_only else "--bind-try", source, source]
        if self.spec.network == "proxy" and self.spec.proxy_socket:  # its folder may lie in a hidden temp folder
            folder = str(Path(self.spec.proxy_socket).absolute().parent)
            args += ["--ro-bind", folder, folder]
        for path in [*self.spec.forwards.values(), *self.spec.exposes.values()]:  # the episode's own sockets' folders
            folder = str(Path(path).absolute().parent)
            args += ["--ro-bind", folder, folder]
        if self.spec.network != "host":  # only a loopback interface (bwrap brings it up)
            args.append("--unshare-net")
        state = state_dir()
        with contextlib.suppress(OSError):  # made now: a token written there while this command runs is hidden too
            state.mkdir(parents=True, exist_ok=True, mode=0o700)
        # every control-token file and run directory hrl wrote, but those hiding would hide the sandbox itself (a
        # folder holding its root, a mount or a socket's folder) and those already out of sight (its own temp folder,
        # the emptied sandboxes' and state folders stand in their place)
        needed = [self.root, *(Path(m.source).absolute() for m in self.spec.mounts)]
        sockets = [self.spec.proxy_socket or "", *self.spec.forwards.values(), *self.spec.exposes.values()]
        needed += [Path(p).absolute().parent for p in sockets if p]
        replaced = [*map(Path, _temp_dirs()), Path(self.backend.root).absolute(), state.absolute()]
        registered = hidden_paths(needed=needed, replaced=replaced)
        for hidden in [*self.spec.hidden_paths, str(state), *registered]:
            path = Path(hidden).absolute()
            if path.is_dir():
                args += ["--tmpfs", str(path)]
            elif path.exists():
                args += ["--ro-bind", "/dev/null", str(path)]
        return [*args, "--chdir", cwd, "--"]

    def _relay(self) -> list[str]:
        """network=proxy: the prefix that starts the relay to the proxy's unix socket on 127.0.0.1:proxy_port in the
        command's network namespace (it binds, forks into the background and returns), then runs the command. The
        relay ends with the namespace, when the command does. So do spec.forwards' relays and spec.exposes' tunnels
        (each command's namespace is its own: a port exposed is the one a long-running command listens on)."""
        spec = self.spec
        pairs = dict(spec.forwards) if spec.network != "host" else {}
        if spec.network == "proxy" and spec.proxy_socket:
            pairs[spec.proxy_port] = spec.proxy_socket
        exposed = dict(spec.exposes) if spec.network != "host" else {}
        if not pairs and not exposed:
            return []
        import sys

        relays = [[sys.executable, "-I", "-c", script, str(Path(path).absolute()), str(port)]
                  for script, mapping in ((FORWARDER, pairs), (TUNNEL, exposed))
                  for port, path in mapping.items()]  # fmt: skip
        started = " && ".join(" ".join(shlex.quote(a) for a in relay) for relay in relays)
        return ["sh", "-c", f'{started} && exec "$@"', "hrl-relay"]

    def _kill(self, group: int, token: str) -> None:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
        kill_marked(EXEC_MARK, token)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._check_open()
        await asyncio.to_thread(_write, Path(self.host_path(path)), data, mode)

    async def read_file(self, path: str) -> bytes:
        self._check_open()
        return await asyncio.to_thread(Path(self.host_path(path)).read_bytes)

    async def copy_in(self, host_dir: str, target: str) -> None:
        self._check_open()
        await asyncio.to_thread(_copy_tree, Path(host_dir), Path(self.host_path(target)))

    async def close(self) -> None:
        """Kill whatever the sandbox's commands left running, then delete its directory. Idempotent."""
        if self._closed:
            return
        await asyncio.to_thread(kill_marked, SANDBOX_MARK, self.id)
        self.kill_groups()
        await asyncio.to_thread(_remove_root, self.root)
        if self.root.exists():
            raise SandboxError(f"cannot delete local sandbox directory {self.root}")
        self._closed = True

    def kill_groups(self) -> None:
        """Kill the process groups its commands started (those a command's end did not take with it)."""
        for group in self._groups:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        self._groups.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")


def _make_root(parent: Path, run_id: str, episode_id: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_clean(run_id)}-", dir=parent))
    info = {"run_id": run_id, "episode_id": episode_id, "pid": os.getpid(), "created": time.time()}
    partial = root / f".{MARKER}.tmp"  # renamed into place: a marker is whole or absent, never half written
    partial.write_text(json.dumps(info))
    partial.rename(root / MARKER)
    return root


def _lay_out(root: Path, spec: SandboxSpec) -> None:
    (root / "work").mkdir()
    (root / "home").mkdir()
    (root / "tmp").mkdir()  # TMPDIR of isolated commands (the host's temp folder is hidden from them)
    for mount in spec.mounts:
        source = Path(mount.source).absolute()
        if not source.exists():
            raise SandboxError(f"mount source {source} does not exist")
        target = posixpath.normpath(mount.target)
        if target.startswith(spec.workdir.rstrip("/") + "/"):
            link = root / "work" / posixpath.relpath(target, spec.workdir)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source)


def _hrl_own_folders(sandboxes: Path) -> list[str]:
    """hrl's own folders a command may run from: its cache (agents' installs, venvs, models; $HRL_CACHE) and the
    environment of the Python running hrl (the tests verifier grades with it). The host's folders are seen read-only,
    but one under a temp folder (a cache or a venv under /tmp) would be hidden by the sandbox's private /tmp: those
    are bound back, read-only at their paths, so a command sees them wherever they live, as it would elsewhere. A
    folder that is a temp folder itself, or holds the sandboxes, is never bound (it would show them)."""
    import sys

    temps = [Path(t) for t in _temp_dirs()]
    cache = Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser()
    found = []
    for folder in {cache.absolute(), cache.resolve(), Path(sys.prefix).absolute(), Path(sys.prefix).resolve(),
                   Path(sys.executable).resolve().parent.parent}:  # fmt: skip
        hidden = any(folder.is_relative_to(t) and folder != t for t in temps)
        if hidden and folder.is_dir() and not sandboxes.is_relative_to(folder):
            found.append(str(folder))
    top = sorted(found, key=len)
    return [f for i, f in enumerate(top) if not any(Path(f).is_relative_to(q) for q in top[:i])]


def _temp_dirs() -> list[str]:
    """/tmp and the temp folder in use (often the same), outermost first."""
    return sorted({"/tmp", posixpath.normpath(str(Path(tempfile.gettempdir()).absolute()))}, key=len)


def host_env(allow: Sequence[str]) -> dict[str, str]:
    """The host's variables whose names match one of `allow` (names or fnmatch globs, case-sensitive)."""
    return {k: v for k, v in os.environ.items() if any(fnmatch.fnmatchcase(k, p) for p in allow)}


def _remove_root(root: Path) -> None:
    """Delete a sandbox directory with its marker last: a process killed half-way leaves a directory that `prune`
    still finds (by its marker) and finishes, never an unmarked one that nothing would claim."""
    with contextlib.suppress(OSError):
        for child in root.iterdir():
            if child.name == MARKER:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    child.unlink()
    with contextlib.suppress(OSError):
        (root / MARKER).unlink()
    shutil.rmtree(root, ignore_errors=True)  # what a racing writer added after the listing


def _find_roots(parent: Path) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in parent.glob(f"{PREFIX}*"):
        try:
            found.append((path, json.loads((path / MARKER).read_text())))
        except (OSError, ValueError):
            continue  # not ours, or being created
    return found


def _write(target: Path, data: bytes, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    target.chmod(mode)


def _copy_tree(source: Path, target: Path) -> None:
    if not source.is_dir():
        raise SandboxError(f"copy_in: {source} is not a directory")
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)


async def _pump(stream: asyncio.StreamReader, buf: bytearray, cap: int, dropped: dict[str, int], name: str) -> None:
    while data := await stream.read(65536):
        room = max(cap - len(buf), 0)
        buf += data[:room]
        dropped[name] += max(len(data) - room, 0)


def kill_marked(name: str, value: str) -> int:
    """SIGKILL every process whose environment has name=value (Linux /proc; elsewhere a no-op). Returns how many."""
    mark, killed, quiet = f"{name}={value}".encode(), 0, 0
    for _ in range(12):  # again, for children forked while we were killing
        found = 0
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if mark in environ.read_bytes().split(b"\0"):
                    os.kill(int(environ.parent.name), signal.SIGKILL)
                    found += 1
            except (OSError, ValueError):
                continue
        killed += found
        # a process in the middle of execve shows an empty environ for an instant: two clean passes, not one
        quiet = 0 if found else quiet + 1
        if quiet == 2:
            break
        time.sleep(0.02)
    return killed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return pid > 0


# bwrap sets up its namespace by binding / recursively read-only; a mount appearing or going at that moment (a Docker
# container starting or stopping on the same host: its overlay's resolv.conf) fails the remount with EINVAL before the
# command runs. Such an exec (bwrap's own error, and no mark that the command started) is run again, up to
# BWRAP_TRIES times; a command that started is never run twice.
BWRAP_TRIES = 3
_BWRAP_SETUP = re.compile(r"bwrap: (Can't|Unable to) [^\n]*\n?")


def _bwrap_setup_failed(result: ExecResult) -> bool:
    """Whether the exec looks like bwrap failing to set up the namespace (one line of its own on stderr, exit 1, no
    output); the caller also checks that the command never started."""
    return result.exit_code == 1 and not result.stdout and _BWRAP_SETUP.fullmatch(result.stderr) is not None


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except OSError:
        return False
    return True


def _clean(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.")[:40] or "x"


def list_sandboxes(root: str | None = None) -> list[dict[str, Any]]:
    """The local sandboxes under `root` (default: the temp folder), oldest first, from their markers: id, path, run,
    episode, the creating process (`pid`) and `status`: `live` while that process runs, else `orphaned` (left by a
    process that is gone: `LocalBackend.prune` removes those)."""
    rows = []
    for path, info in _find_roots(Path(root or tempfile.gettempdir())):
        pid = int(info.get("pid", 0))
        rows.append({"id": path.name, "status": "live" if pid_alive(pid) else "orphaned", "run": info.get("run_id"),
                     "episode": info.get("episode_id"), "pid": pid, "created": info.get("created"),
                     "path": str(path)})  # fmt: skip
    return sorted(rows, key=lambda r: (r["created"] or 0, r["id"]))
