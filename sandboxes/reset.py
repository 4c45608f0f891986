"""Bringing a sandbox back to its group's starting state between two episodes (`rollout.reuse: group`, used by
`SandboxPool`), and checking it.

A reset kills what the previous episode left running and restores what the next one starts from (the workdir as
prepared, HOME and the temp folder as they were); then `state` hashes everything an episode could have written or
left running, and the pool reuses the sandbox only when that hash equals the one taken right after the group's
first layout: else it closes the sandbox and makes a fresh one (`reset_mismatch`). So a path the reset does not
restore is still one the check sees: a file left there costs a fresh sandbox, never a biased episode.

- Local (`LocalReset`, on the host). Under bubblewrap a command writes only the sandbox's own folder and its
  writable mounts (the host's files are read-only), and what it starts ends with its pid namespace. The reset
  restores the folder (work, home, tmp; anything else an episode put beside them removed); the check hashes the
  workdir, what HOME, tmp and the folder hold, the writable mounts' trees and the processes left with the
  sandbox's mark. Without bubblewrap (a trusted agent only) an episode can write anywhere the user can, and a
  process that drops the mark from its environment outlives the reset: neither is seen.
- Docker (`ExecReset`): below.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hrl.sandboxes.base import ExecResult, Sandbox, SandboxError

__all__ = ["ExecReset", "LocalReset", "Reset", "reset_for"]

SNAPSHOT = ".hrl-reset"  # local: <root>/.hrl-reset holds the workdir as prepared (outside work, home and tmp)
MAX_OUTSIDE = 4096  # docker: more paths changed outside the workdir and /tmp than this, and the sandbox is not reused


class Reset:
    """How a sandbox is brought back to its first episode's starting state (the backend's own way)."""

    async def snapshot(self, sandbox: Sandbox) -> None:
        """Keep the workdir as it is now (just prepared), to restore from."""
        raise NotImplementedError

    async def kill(self, sandbox: Sandbox) -> None:
        """End every process an episode left running."""
        raise NotImplementedError

    async def restore(self, sandbox: Sandbox) -> None:
        """Empty HOME and tmp; the workdir back to the snapshot."""
        raise NotImplementedError

    async def state(self, sandbox: Sandbox) -> str:
        """A hash of everything an episode could have changed: equal to the baseline's only when nothing is left."""
        raise NotImplementedError


class LocalReset(Reset):
    """Local sandboxes, done on the host: their files are `<root>/work`, `home`, `tmp`; their processes carry the
    sandbox's mark in their environment (and end with their namespace under bubblewrap)."""

    async def snapshot(self, sandbox: Sandbox) -> None:
        root = _root(sandbox)
        await asyncio.to_thread(_replace_tree, root / "work", root / SNAPSHOT)

    async def kill(self, sandbox: Sandbox) -> None:
        from hrl.sandboxes.local import SANDBOX_MARK, LocalSandbox, kill_marked

        assert isinstance(sandbox, LocalSandbox)
        await asyncio.to_thread(kill_marked, SANDBOX_MARK, sandbox.id)
        sandbox.kill_groups()

    async def restore(self, sandbox: Sandbox) -> None:
        from hrl.sandboxes.local import MARKER

        root = _root(sandbox)
        for extra in await asyncio.to_thread(lambda: sorted(root.iterdir())):  # what an episode put beside them
            if extra.name not in ("work", "home", "tmp", SNAPSHOT, MARKER):
                await asyncio.to_thread(_remove, extra)
        for folder in ("home", "tmp"):
            await asyncio.to_thread(_replace_tree, None, root / folder)
        await asyncio.to_thread(_replace_tree, root / SNAPSHOT, root / "work")

    async def state(self, sandbox: Sandbox) -> str:
        mounts = [m.source for m in sandbox.spec.mounts if not m.read_only]
        return await asyncio.to_thread(_local_state, _root(sandbox), sandbox.id, mounts)


@runtime_checkable
class Inspectable(Protocol):
    """A sandbox whose daemon reports what no process inside it can hide (the docker backend's)."""

    async def exec(self, cmd: list[str] | str, *, timeout_s: float = 0, env: dict[str, str] | None = None,
                   workdir: str | None = None, user: str = "") -> ExecResult: ...  # fmt: skip

    async def processes(self) -> list[str]: ...

    async def changes(self) -> list[str]: ...

    async def writable_mounts(self) -> list[str]: ...


class ExecReset(Reset):
    """Docker sandboxes: reset through `exec` as root, checked with what the daemon reports.

    - Processes: every one is killed by its pid, whatever its environment, but PID 1 and those running when the
      snapshot was taken (the container's `sleep`, hrl's relay to the proxy), known by pid and start time.
    - Files: tars of the workdir and of /tmp (where the agent's HOME lies), kept in the container (STORE), are
      extracted again; nothing else is restored.
    - Check: the processes as the daemon lists them (`docker top`), then every path the daemon finds changed from
      the image outside the workdir and /tmp (`docker diff`, the store's own among them), and, hashed inside, the
      workdir and /tmp trees with their contents, each such path's kind, mode, owner and content, the trees of what
      the diff does not cover (writable mounts, /dev with /dev/shm, the files docker writes: /etc/hosts,
      /etc/hostname, /etc/resolv.conf) and SysV IPC objects. A file written anywhere or a process that escaped the
      kill thus changes the state. Processes are listed first: with none but those of the snapshot left, nothing
      inside can answer for the hash.

    Not covered: a kept process an episode took over (ptrace or /proc/<pid>/mem, as root, where the host's Yama
    policy allows it). Needs GNU find and tar in the image."""

    STORE = "/var/tmp/hrl-reset"
    DOCKER_FILES = ("/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf")

    async def _run(self, sandbox: Sandbox, script: str, *args: str) -> str:
        assert isinstance(sandbox, Inspectable)
        argv = ["sh", "-c", script, "_", sandbox.workdir, self.STORE, *args]
        result = await sandbox.exec(argv, timeout_s=300, user="0")  # root: every process and file is the reset's
        if result.exit_code != 0:
            raise SandboxError(f"sandbox reset failed in {sandbox.id[:12]} (exit {result.exit_code}): "
                               f"{result.stderr[-500:]}")  # fmt: skip
        return result.stdout

    async def snapshot(self, sandbox: Sandbox) -> None:
        script = (
            'rm -rf "$2" && mkdir -p "$2" && tar -C "$1" -cpf "$2/work.tar" . && tar -C /tmp -cpf "$2/tmp.tar" . '
            '&& procs > "$2/keep.new" && mv "$2/keep.new" "$2/keep"'
        )
        await self._run(sandbox, _PROCS + script)

    async def kill(self, sandbox: Sandbox) -> None:
        await self._run(sandbox, _PROCS + _KILL)

    async def restore(self, sandbox: Sandbox) -> None:
        await self._run(
            sandbox,
            "rm -rf /tmp/* /tmp/.[!.]* /tmp/..?* 2>/dev/null; "
            'tar -C /tmp -xpf "$2/tmp.tar" && rm -rf "$1" && mkdir -p "$1" && tar -C "$1" -xpf "$2/work.tar"',
        )

    async def state(self, sandbox: Sandbox) -> str:
        assert isinstance(sandbox, Inspectable)
        procs = await sandbox.processes()  # first: see the class doc
        restored = [sandbox.workdir.rstrip("/") or "/", "/tmp"]
        outside = sorted(p for p in await sandbox.changes() if not any(_under(p, r) for r in restored))
        if len(outside) > MAX_OUTSIDE:  # never the baseline's: too many to hash, so never reused
            return f"{len(outside)} paths changed outside the workdir and /tmp ({uuid.uuid4().hex})"
        whole = sorted({*await sandbox.writable_mounts(), *self.DOCKER_FILES})
        inside = await self._run(sandbox, _STATE, *outside, "--", *whole)
        text = "\n".join(["procs", *procs, "outside", *outside, "inside", inside])
        return hashlib.sha256(text.encode(errors="surrogateescape")).hexdigest()


# `procs`: every process but this shell and its children, one "pid:start time" a line (from /proc/<pid>/stat, with
# builtins only, so the listing makes no process of its own to list)
_PROCS = (
    'procs() { for s in /proc/[0-9]*/stat; do read -r line 2>/dev/null < "$s" || continue; p=${line%% *}; '
    'set -- ${line##*) }; [ "$p" = "$$" ] || [ "$2" = "$$" ] || echo "$p:${20}"; done; }; '
)
# kill -9 every process but PID 1 and those kept at the snapshot ($2/keep), until two passes find none (a process
# forked while the others were killed; a killed one until its parent has reaped it), 100 passes at most: whatever
# survives, the check sees
_KILL = (
    'keep=" "; [ -f "$2/keep" ] && while read -r k; do keep="$keep$k "; done < "$2/keep"; quiet=0; n=0; '
    "while [ $quiet -lt 2 ] && [ $n -lt 100 ]; do found=0; for pk in $(procs); do "
    'case "$keep" in *" $pk "*) continue ;; esac; [ "${pk%%:*}" = 1 ] && continue; '
    'kill -9 "${pk%%:*}" 2>/dev/null; found=1; done; '
    "if [ $found = 0 ]; then quiet=$((quiet + 1)); else quiet=0; fi; n=$((n + 1)); "
    "[ $quiet -lt 2 ] && sleep 0.02; done; true"
)
# the hash inside: $1 the workdir, then (after the store, $2) each path changed outside the workdir and /tmp, "--",
# and the trees to hash whole
_STATE = (
    'tree() { find "$1" -printf "%y %m %U %G %p %l\\n" | LC_ALL=C sort; '
    'find "$1" -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum; }; '
    'work="$1"; shift 2; { (cd "$work" && tree .); echo tmp; tree /tmp; echo outside; '
    'while [ $# -gt 0 ] && [ "$1" != "--" ]; do if [ -e "$1" ] || [ -L "$1" ]; then '
    'find "$1" -maxdepth 0 -printf "%y %m %U %G %p %l\\n"; if [ -f "$1" ] && [ ! -L "$1" ]; then sha256sum "$1"; fi; '
    'else echo "gone $1"; fi; shift; done; [ "$1" = "--" ] && shift; '
    'for m in "$@"; do echo "whole $m"; if [ -e "$m" ]; then tree "$m"; fi; done; '
    "echo ipc; cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem 2>/dev/null; } | sha256sum"
)


def reset_for(sandbox: Sandbox) -> Reset:
    """A local sandbox resets on the host; a docker one through its exec, checked with what its daemon reports.
    Any other cannot be checked: raises SandboxError."""
    from hrl.sandboxes.local import LocalSandbox

    if isinstance(sandbox, LocalSandbox):
        return LocalReset()
    if isinstance(sandbox, Inspectable):
        return ExecReset()
    raise SandboxError(
        f"rollout.reuse: group cannot check a reset of sandbox {sandbox.id} ({type(sandbox).__name__}): only local "
        "and docker sandboxes can be reused",
        hint="set rollout.reuse: none",
    )


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _root(sandbox: Sandbox) -> Path:
    return Path(sandbox.root)  # type: ignore[attr-defined]


def _writable(path: Path) -> None:
    """Make a tree removable whatever modes an episode left on it (a read-only folder cannot lose its files)."""
    for folder, dirs, _ in os.walk(path):
        for name in [".", *dirs]:
            target = Path(folder, name)
            with contextlib.suppress(OSError):
                if not target.is_symlink():
                    target.chmod(target.stat().st_mode | stat.S_IRWXU)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        _writable(path)
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _replace_tree(source: Path | None, target: Path) -> None:
    """`target` becomes a copy of `source` (links kept as links), or an empty folder when `source` is None."""
    if target.exists() or target.is_symlink():
        _remove(target)
    if source is None:
        target.mkdir()
    else:
        shutil.copytree(source, target, symlinks=True)


def _hash_tree(digest: Any, top: Path) -> None:
    """Paths, kinds, modes, contents and link targets of the tree at `top`, in a fixed order."""
    if not top.is_dir():  # a mounted file
        digest.update(hashlib.sha256(top.read_bytes()).digest() if top.is_file() else b"-")
        return
    for folder, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = Path(folder, name)
            info = path.lstat()
            digest.update(f"{path.relative_to(top).as_posix()}\0{info.st_mode:o}\0".encode())
            if stat.S_ISLNK(info.st_mode):
                digest.update(str(path.readlink()).encode())
            elif stat.S_ISREG(info.st_mode):
                digest.update(hashlib.sha256(path.read_bytes()).digest())
            digest.update(b"\n")


def _local_state(root: Path, sandbox_id: str, mounts: list[str]) -> str:
    """The hash the local reset check compares: the workdir tree, what HOME and tmp hold, what lies beside them in
    the sandbox's folder, the writable mounts' trees, and the processes still marked as this sandbox's."""
    from hrl.sandboxes.local import SANDBOX_MARK

    digest = hashlib.sha256()
    _hash_tree(digest, root / "work")
    for folder in ("home", "tmp"):
        digest.update(f"{folder}:{sorted(p.name for p in (root / folder).iterdir())}\n".encode())
    digest.update(f"root:{sorted(p.name for p in root.iterdir())}\n".encode())
    for mount in mounts:
        digest.update(f"mount:{mount}\n".encode())
        _hash_tree(digest, Path(mount).absolute())
    mark = f"{SANDBOX_MARK}={sandbox_id}".encode()
    alive = 0
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            alive += mark in environ.read_bytes().split(b"\0")
    digest.update(f"procs:{alive}".encode())
    return digest.hexdigest()
