"""Paths no local sandbox may read, wherever they lie: control-token files and run directories.

hrl records each such path when it writes it (`hide`): one small file under `<state folder>/hidden.d/`, named by
the digest of the path and holding it, written to a temporary name and renamed into place, so hrl processes that
write at once never lose each other's entries. `hidden_paths()` lists the recorded paths that exist; an entry whose
path has been gone for PRUNE_AFTER_S is deleted (a younger one is kept: its path may be a trace file a run has not
written yet). A local sandbox hides every listed path from each command as it starts (`LocalSandbox._bwrap`). The
list lives in the state folder, which every local sandbox empties, so no command reads the list either.

One registry per state folder: a process run with another $HRL_STATE_DIR keeps, and reads, its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from hrl.sandboxes.base import SandboxError

__all__ = ["PRUNE_AFTER_S", "REGISTRY", "hidden_paths", "hide", "state_dir"]

REGISTRY = "hidden.d"  # under the state folder: one entry per hidden path
PRUNE_AFTER_S = 24 * 3600.0  # an entry whose path is missing is deleted once it is this old


def state_dir() -> Path:
    """hrl's state folder ($HRL_STATE_DIR, default ~/.local/state/hrl): `hrl serve` keeps its control token there,
    and hrl the list of paths every local sandbox hides. Every local sandbox empties it."""
    return Path(os.environ.get("HRL_STATE_DIR") or Path.home() / ".local" / "state" / "hrl")


def _registry() -> Path:
    return state_dir() / REGISTRY


def hide(path: str | Path) -> None:
    """Record `path` (a file or a folder; made absolute, symlinks resolved) as one no local sandbox may read, from
    the next command a sandbox starts on. Idempotent; the path need not exist yet. Raises SandboxError when the
    record cannot be written (then write no secret there)."""
    target = str(Path(path).resolve())
    folder = _registry()
    entry = folder / hashlib.sha256(target.encode(errors="surrogateescape")).hexdigest()[:32]
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    except OSError as exc:  # fail closed: a path not recorded would be readable from every local sandbox
        raise SandboxError(
            f"cannot record {target} among the paths local sandboxes hide, in {folder}: {exc}",
            hint="make the state folder writable, or point $HRL_STATE_DIR at a writable folder",
        ) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(target.encode(errors="surrogateescape"))
        Path(name).replace(entry)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def hidden_paths(needed: Sequence[Path] = (), replaced: Sequence[Path] = ()) -> list[str]:
    """The recorded paths that exist now, sorted; deletes the entries of paths gone for PRUNE_AFTER_S. For one
    sandbox (absolute paths): `needed` are the folders it runs in, and a path holding one is left out (hiding it
    would hide the sandbox); `replaced` are the host folders it sees another in place of (its own temp folder, an
    empty one), and a path under one is left out unless it lies in a needed folder (it is out of sight already;
    hiding it would only make an empty mount point there)."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        for entry in _registry().iterdir():
            if entry.name.startswith("."):  # an entry being written
                continue
            try:
                path = entry.read_bytes().decode(errors="surrogateescape")
                if os.path.lexists(path):
                    found.append(path)
                elif time.time() - entry.stat().st_mtime > PRUNE_AFTER_S:
                    entry.unlink()
            except OSError:
                continue  # deleted by another process meanwhile
    return sorted(p for p in found if _hideable(Path(p), needed, replaced))


def _hideable(path: Path, needed: Sequence[Path], replaced: Sequence[Path]) -> bool:
    if any(n.is_relative_to(path) for n in needed):
        return False
    return not any(path.is_relative_to(r) for r in replaced) or any(path.is_relative_to(n) for n in needed)
